package trainerproto

import (
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"
)

// FuzzParse checks that Parse never panics, that it returns exactly one of
// an event or an *Error, and that a valid event's run id is the input's
// "run_id" and survives a round trip through a minimal line of its kind.
// The seed corpus lives in testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"event":"run_start","run_id":"r1","model":"m","gpus":[0,"GPU-x"],"batch_size":8}`,
		`{"event":"step","run_id":"r1","step":1,"tokens":65536,"loss":2.3}`,
		`{"event":"eval","run_id":"r1","epoch":1,"val_loss":1.9}`,
		`{"event":"run_end","run_id":"r1"}`,
		`{"event":"step","run_id":"r1","tokens":-5}`,
		`not json`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, err := Parse(line)
		if (ev == nil) == (err == nil) {
			t.Fatalf("Parse(%q) = %v, %v: want exactly one", line, ev, err)
		}
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Msg == "" || pe.Kind == "" {
				t.Fatalf("Parse(%q): bad error %#v", line, err)
			}
			if !utf8.ValidString(err.Error()) {
				t.Fatalf("Parse(%q): error message is not UTF-8: %q", line, err)
			}
			// Error lines must always be valid JSON lines.
			var m map[string]any
			if json.Unmarshal(ErrorLine(err.Error(), 1), &m) != nil {
				t.Fatalf("ErrorLine(%q) is not JSON", err)
			}
			return
		}
		id := ev.RunID()
		if id == "" || len(id) > MaxRunIDBytes || !printable(id) {
			t.Fatalf("Parse(%q): invalid run id %q accepted", line, id)
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("Parse accepted %q, encoding/json rejects it: %v", line, err)
		}
		if m["run_id"] != id || m["event"] != ev.Kind() {
			t.Fatalf("Parse(%q): run id %q / kind %q differ from input", line, id, ev.Kind())
		}
		again := map[string]any{"event": ev.Kind(), "run_id": id}
		if st, ok := ev.(*Step); ok {
			again["tokens"] = st.Tokens
		}
		b, err := json.Marshal(again)
		if err != nil {
			t.Fatal(err)
		}
		ev2, err := Parse(b)
		if err != nil {
			t.Fatalf("re-parse of %s: %v", b, err)
		}
		if ev2.RunID() != id || ev2.Kind() != ev.Kind() {
			t.Fatalf("round trip: %q/%q != %q/%q", ev2.Kind(), ev2.RunID(), ev.Kind(), id)
		}
		if st, ok := ev.(*Step); ok && ev2.(*Step).Tokens != st.Tokens {
			t.Fatalf("round trip tokens %d != %d", ev2.(*Step).Tokens, st.Tokens)
		}
	})
}

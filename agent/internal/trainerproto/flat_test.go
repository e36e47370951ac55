package trainerproto

import (
	"bytes"
	"reflect"
	"testing"
)

// The flat fast path must give exactly what the general parser gives, for
// good and bad step lines alike.
func TestFlatPathMatchesGeneralParser(t *testing.T) {
	lines := []string{
		`{"event":"step","run_id":"r1","step":17,"tokens":65536,"samples":32,"data_wait_s":0.012,"compute_s":0.41,"loss":2.31}`,
		` { "event" : "step" , "run_id" : "r1" , "tokens" : 1 } `,
		`{"event":"step","run_id":"r1","tokens":65536.0,"loss":-1e-3,"step":null}`,
		`{"event":"step","run_id":"r1","tokens":1,"extra":true,"other":false,"n":null,"s":"x"}`,
		`{"event":"step","run_id":"r\u00e9","tokens":1}`,
		`{"event":"step","run_id":"é-run","tokens":1}`,
		`{"event":"step","run_id":"","tokens":1}`,
		`{"event":"step","run_id":5,"tokens":1}`,
		`{"event":"step","tokens":1}`,
		`{"event":"step","run_id":"r1"}`,
		`{"event":"step","run_id":"r1","tokens":-5}`,
		`{"event":"step","run_id":"r1","tokens":1e3}`,
		`{"event":"step","run_id":"r1","tokens":18446744073709551616}`,
		`{"event":"step","run_id":"r1","tokens":1,"data_wait_s":-0.5}`,
		`{"event":"step","run_id":"r1","tokens":1,"loss":"x"}`,
		`{"event":"step","run_id":"r1","tokens":1,"tokens":2}`,
		`{"event":"step","run_id":"r1","tokens":01}`,
		`{"event":"step","run_id":"r1","tokens":1.}`,
		`{"event":"step","run_id":"r1","tokens":1,}`,
		`{"event":"step","run_id":"r1","tokens":1}x`,
		`{"event":"step","run_id":"r1","tokens":[1]}`,
		`{"event":"step","run_id":"r1\t","tokens":1}`,
		`{"event":"step","run_id":"r1\x01","tokens":1}`,
		`{"event":"step","run_id":"r1","tokens":1,"loss":2.31e400}`,
		`{"event":"st\u0065p","run_id":"r1","tokens":1}`,
		`{"event":"step","run_id":"` + string(bytes.Repeat([]byte("a"), MaxRunIDBytes+1)) + `","tokens":1}`,
		`{"event":"step","run_id":"r1","tokens":1,"tokens_total":5}`,
		`{"event":"run_end","run_id":"r1"}`,
		`{}`,
		`{"event":"step","run_id":"r1","tokens":1`,
		`{"event":"step","run_id":"r1","tokens":tru}`,
	}
	for _, l := range lines {
		var f flatObject
		gotEv, gotErr := Parse([]byte(l))
		wantEv, wantErr := parseGeneral(bytes.TrimSpace([]byte(l)))
		if !reflect.DeepEqual(gotEv, wantEv) || !reflect.DeepEqual(gotErr, wantErr) {
			t.Errorf("%s (flat=%v):\n got  %#v, %v\n want %#v, %v", l, scanFlat([]byte(l), &f), gotEv, gotErr, wantEv, wantErr)
		}
	}
	// The fast path is taken for the usual line.
	var f flatObject
	if !scanFlat([]byte(lines[0]), &f) || f.n != 8 {
		t.Errorf("scanFlat declined a plain step line (n=%d)", f.n)
	}
}

// FuzzFlatPath checks the fast path against the general parser on any line.
func FuzzFlatPath(f *testing.F) {
	f.Add([]byte(`{"event":"step","run_id":"r1","step":17,"tokens":65536,"loss":2.31}`))
	f.Add([]byte(`{"event":"step","run_id":"r1","tokens":1.5e2}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		gotEv, gotErr := Parse(line)
		trimmed := bytes.TrimSpace(line)
		if len(trimmed) == 0 || trimmed[0] != '{' || gotErr != nil && gotErr.(*Error).Kind == ErrKindUTF8 {
			return
		}
		wantEv, wantErr := parseGeneral(trimmed)
		if !reflect.DeepEqual(gotEv, wantEv) || !reflect.DeepEqual(gotErr, wantErr) {
			t.Fatalf("%q: got %#v, %v; want %#v, %v", line, gotEv, gotErr, wantEv, wantErr)
		}
	})
}

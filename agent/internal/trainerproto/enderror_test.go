package trainerproto

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestRunEndKeepsTheError: run_end's "error" (the exception a trainer
// failed with) is kept as given, cut to MaxEndErrorBytes at a character
// boundary.
func TestRunEndKeepsTheError(t *testing.T) {
	oom := "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n<script>"
	for line, want := range map[string]string{
		`{"event":"run_end","run_id":"r","status":"error","error":"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n<script>"}`: oom,
		`{"event":"run_end","run_id":"r","status":"error","error":null}`:                                                                                    "",
		`{"event":"run_end","run_id":"r","status":"error"}`:                                                                                                 "",
	} {
		ev, err := Parse([]byte(line))
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if got := ev.(*RunEnd).Error; got != want {
			t.Errorf("%s: error %q, want %q", line, got, want)
		}
	}

	// 1 + 2×600 bytes: byte 1024 falls inside a 2-byte character.
	long := "a" + strings.Repeat("é", 600)
	ev, err := Parse([]byte(`{"event":"run_end","run_id":"r","status":"error","error":"` + long + `"}`))
	if err != nil {
		t.Fatal(err)
	}
	got := ev.(*RunEnd).Error
	if len(got) != MaxEndErrorBytes-1 || !utf8.ValidString(got) || !strings.HasPrefix(long, got) {
		t.Errorf("a %d-byte error kept as %d bytes (valid UTF-8 %v, a prefix %v), want the first %d bytes cut at a character",
			len(long), len(got), utf8.ValidString(got), strings.HasPrefix(long, got), MaxEndErrorBytes-1)
	}

	_, err = Parse([]byte(`{"event":"run_end","run_id":"r","status":"error","error":5}`))
	if err == nil || err.Error() != "run_end: error must be a string" {
		t.Errorf("numeric error: %v", err)
	}
}

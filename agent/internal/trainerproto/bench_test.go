package trainerproto

import "testing"

// BenchmarkParseStep parses the line every rank sends every step: the
// trainer socket's hot path.
func BenchmarkParseStep(b *testing.B) {
	line := []byte(`{"event":"step","run_id":"r1","step":17,"tokens":65536,"samples":32,"data_wait_s":0.012,"compute_s":0.41,"loss":2.31}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		if _, err := Parse(line); err != nil {
			b.Fatal(err)
		}
	}
}

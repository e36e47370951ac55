package ledger

import (
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
)

// TestEndErrorGoesWithTheEndStatus: the run's end carries the error of the
// rank whose status it is, the first that was not ok; a free-text status
// is its own cause; a run that ended ok or was stopped carries none.
func TestEndErrorGoesWithTheEndStatus(t *testing.T) {
	oom := "torch.cuda.OutOfMemoryError: CUDA out of memory"
	for _, c := range []struct {
		name       string
		ends       []trainerproto.RunEnd // rank 0, rank 1
		stop       string
		wantStatus string
		wantError  string
	}{
		{"exception", []trainerproto.RunEnd{{Status: "error", Error: oom}}, "", "error", oom},
		{"second rank failed", []trainerproto.RunEnd{{}, {Status: "error", Error: oom}}, "", "error", oom},
		{"first failure wins", []trainerproto.RunEnd{{Status: "exit 1", Error: "first"}, {Status: "error", Error: oom}}, "", "exit 1", "first"},
		{"free text status", []trainerproto.RunEnd{{Status: "it broke"}}, "", "error", "it broke"},
		{"plain error", []trainerproto.RunEnd{{Status: "error"}}, "", "error", ""},
		{"ok with an error key", []trainerproto.RunEnd{{Error: "ignored"}}, "", "ok", ""},
		{"stopped", []trainerproto.RunEnd{{Status: "signal SIGTERM", Error: "KeyboardInterrupt"}}, "budget x", "stopped: budget", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, []float64{100}, []float64{100}, 0)
			r.advance(time.Second)
			peers := []Peer{peer1, peer2}
			for i := range c.ends {
				if err := r.l.StartRun(r.at(0), peers[i], &trainerproto.RunStart{Run: "r"}); err != nil {
					t.Fatal(err)
				}
			}
			if c.stop != "" {
				r.l.StopRequested("r", c.stop)
			}
			r.advance(time.Second)
			for i, e := range c.ends {
				e.Run = "r"
				if err := r.l.EndRun(r.at(0), peers[i], &e); err != nil {
					t.Fatal(err)
				}
			}
			r.advance(2 * time.Second)
			ends := r.ends("r")
			if len(ends) != 1 || ends[0].GetEndStatus() != c.wantStatus || ends[0].GetEndError() != c.wantError {
				t.Fatalf("ends %v, want one with status %q error %q", ends, c.wantStatus, c.wantError)
			}
		})
	}
}

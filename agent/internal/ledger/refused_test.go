package ledger

import (
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
)

// A run the collector refused is dropped: no window, event or end of it
// goes out after the refusal, its GPU's time is idle from then on, and its
// trainer's later events are dropped without an error each. A refusal for
// another start of the id (a later resume) leaves the run alone; a new
// run_start from the trainer is decided afresh.
func TestRefusedRunIsDroppedAndItsEventsCounted(t *testing.T) {
	r := newRig(t, []float64{100}, []float64{100}, 0)
	r.advance(time.Second)
	start := r.at(0)
	if err := r.l.StartRun(start, peer1, &trainerproto.RunStart{Run: "shareA", Resume: true}); err != nil {
		t.Fatal(err)
	}
	r.advance(2 * time.Second)
	if s := r.starts("shareA"); len(s) != 1 || !s[0].ResumeRequested || s[0].Resume {
		t.Fatalf("starts %v: want resume_requested (the trainer asked) without resume (this node saw no end)", s)
	}
	if _, dropped := r.l.Refuse("shareA", start.Add(time.Second)); dropped {
		t.Fatal("a refusal of another start of the id dropped the run")
	}
	conns, dropped := r.l.Refuse("shareA", start)
	if !dropped || len(conns) != 1 || conns[0] != peer1.ConnID {
		t.Fatalf("Refuse: conns %v dropped %v; want the trainer's connection", conns, dropped)
	}
	before := len(r.windows("shareA"))
	r.advance(200 * time.Millisecond) // the window the refusal came in closes
	n := len(r.batches)
	tok := uint64(100)
	for i := 0; i < 5; i++ {
		if err := r.l.Step(r.at(0), peer1, &trainerproto.Step{Run: "shareA", Tokens: tok}); err != nil {
			t.Fatalf("a step of the refused run was answered: %v", err)
		}
		r.advance(500 * time.Millisecond)
	}
	if err := r.l.EndRun(r.at(0), peer1, &trainerproto.RunEnd{Run: "shareA"}); err != nil {
		t.Fatalf("run_end of the refused run: %v", err)
	}
	r.advance(2 * time.Second)
	if got := len(r.windows("shareA")); got > before+1 {
		t.Errorf("%d windows of the refused run after the refusal, want at most the one open then", got-before)
	}
	if e := r.ends("shareA"); len(e) != 0 {
		t.Errorf("the refused run's end went out: %v", e)
	}
	for _, b := range r.batches[n+1:] {
		for _, gw := range b.GpuWindows {
			if gw.IdleGpuSeconds != gw.GpuSeconds {
				t.Errorf("window %v: idle %v of %v GPU-s; the refused run's GPU is idle", b.WindowStart.AsTime(), gw.IdleGpuSeconds, gw.GpuSeconds)
			}
		}
	}
	if got := r.l.RefusedEvents(); got != 6 {
		t.Errorf("RefusedEvents %d, want 6 (5 steps, the run_end)", got)
	}
	// After its run_end the trainer is no longer the refused run's: a new
	// start is decided afresh (here: a run again).
	if err := r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "shareA", Resume: true}); err != nil {
		t.Fatal(err)
	}
	if err := r.l.Step(r.at(0), peer1, &trainerproto.Step{Run: "shareA", Tokens: tok}); err != nil {
		t.Fatal(err)
	}
	r.advance(2 * time.Second)
	if s := r.starts("shareA"); len(s) != 2 {
		t.Fatalf("starts after a new attempt: %d, want 2", len(s))
	}
}

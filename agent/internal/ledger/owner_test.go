package ledger

import (
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
)

func TestRunBelongsToTheUIDThatStartedIt(t *testing.T) {
	r := newRig(t, []float64{100}, []float64{100}, 0)
	r.advance(time.Second)
	alice := Peer{ConnID: 1, PID: 100, UID: 1000}
	alice2 := Peer{ConnID: 2, PID: 101, UID: 1000} // another rank of alice's
	bob := Peer{ConnID: 3, PID: 200, UID: 1001}
	root := Peer{ConnID: 4, PID: 300, UID: 0}
	if err := r.l.StartRun(r.at(0), alice, &trainerproto.RunStart{Run: "a", WarmupS: ptr(0.0)}); err != nil {
		t.Fatal(err)
	}
	if err := r.l.StartRun(r.at(0), alice2, &trainerproto.RunStart{Run: "a"}); err != nil {
		t.Fatalf("a second rank of the same uid joins: %v", err)
	}
	_ = r.l.Step(r.at(0), alice, &trainerproto.Step{Run: "a", Tokens: 10})
	r.advance(time.Second)

	const want = `run "a" belongs to another user`
	for name, err := range map[string]error{
		"run_start join": r.l.StartRun(r.at(0), bob, &trainerproto.RunStart{Run: "a"}),
		"step":           r.l.Step(r.at(0), bob, &trainerproto.Step{Run: "a", Tokens: 1000}),
		"eval":           r.l.Eval(r.at(0), bob, &trainerproto.Eval{Run: "a"}),
		"run_end":        r.l.EndRun(r.at(0), bob, &trainerproto.RunEnd{Run: "a"}),
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s from another uid: err %v, want %q", name, err, want)
		}
	}
	// Bob's disconnect must not end alice's run either: he never joined.
	r.l.Disconnected(r.at(0), bob)
	if got := r.l.ActiveRuns(); len(got) != 1 {
		t.Fatalf("active runs %v after refused events, want a", got)
	}
	// Root may act on any run.
	if err := r.l.Step(r.at(0), root, &trainerproto.Step{Run: "a", Tokens: 5}); err != nil {
		t.Errorf("root step: %v", err)
	}
	_ = r.l.EndRun(r.at(0), alice, &trainerproto.RunEnd{Run: "a"})
	_ = r.l.EndRun(r.at(0), alice2, &trainerproto.RunEnd{Run: "a"})
	r.advance(3 * time.Second)
	var tokens uint64
	evals := 0
	for _, b := range r.batches {
		for _, w := range b.RunWindows {
			if w.RunId == "a" {
				tokens += w.Tokens
			}
		}
		for _, e := range b.RunEvents {
			if e.GetEval() != nil {
				evals++
			}
		}
	}
	if tokens != 15 {
		t.Errorf("run a has %d tokens, want 15 (alice's 10 + root's 5; bob's refused)", tokens)
	}
	if evals != 0 {
		t.Errorf("%d evals shipped, want none (bob's was refused)", evals)
	}
	// Bob can start his own run, and alice cannot touch it.
	if err := r.l.StartRun(r.at(0), bob, &trainerproto.RunStart{Run: "b"}); err != nil {
		t.Fatal(err)
	}
	if err := r.l.Step(r.at(0), alice, &trainerproto.Step{Run: "b", Tokens: 1}); err == nil || !strings.Contains(err.Error(), `run "b" belongs to another user`) {
		t.Errorf("alice's step on bob's run: %v", err)
	}
}

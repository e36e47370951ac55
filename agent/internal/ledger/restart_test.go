package ledger

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	"github.com/trainmeter/trainmeter/pkg/gpu"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// skip lets time pass with the GPUs still drawing power but no agent running.
func (r *rig) skip(d time.Duration) {
	end := r.now.Add(d)
	for i := range r.counterT {
		for !r.counterT[i].Add(100 * time.Millisecond).After(end) {
			r.counterT[i] = r.counterT[i].Add(100 * time.Millisecond)
			r.counterJ[i] += r.counterW[i] * 0.1
		}
	}
	r.now = end
}

// restart replaces the rig's ledger with a new one restored from snap, as a
// restarted agent does, keeping only the batches the old one had shipped.
func (r *rig) restart(snap Snapshot, grace time.Duration) {
	r.t.Helper()
	// The snapshot goes through JSON on disk.
	b, err := json.Marshal(snap)
	if err != nil {
		r.t.Fatal(err)
	}
	var back Snapshot
	if err := json.Unmarshal(b, &back); err != nil {
		r.t.Fatal(err)
	}
	r.l = New(r.l.cfg)
	if err := r.l.Restore(r.now, back, grace); err != nil {
		r.t.Fatal(err)
	}
}

func step(r *rig, p Peer, run string, n, tokens, total uint64) {
	r.t.Helper()
	if err := r.l.Step(r.now, p, &trainerproto.Step{Run: run, Step: ptr(n), Tokens: tokens, TokensTotal: ptr(total)}); err != nil {
		r.t.Fatal(err)
	}
}

func TestKilledAgentLosesNoTokensAndBridgesEnergyWithTheCounter(t *testing.T) {
	r := newRig(t, []float64{300, 300}, []float64{300, 300}, 0)
	r.advance(time.Second)
	start := r.now
	rs := &trainerproto.RunStart{Run: "k", GPUs: []string{"0", "1"}, WarmupS: ptr(1.0), ClientID: "rank0"}
	if err := r.l.StartRun(start, peer1, rs); err != nil {
		t.Fatal(err)
	}
	var total, n uint64
	stepEvery := func(d time.Duration, p Peer) {
		for end := r.now.Add(d); r.now.Before(end); {
			r.advance(100 * time.Millisecond)
			n++
			total += 100
			step(r, p, "k", n, 100, total)
		}
	}
	stepEvery(3*time.Second, peer1)
	// Checkpoint right after the batch that closed a window, as the agent
	// does; then die 0.6 s into the next window with its steps unshipped.
	for n0 := len(r.batches); len(r.batches) == n0; {
		r.advance(50 * time.Millisecond)
	}
	snap := r.l.Snapshot()
	shipped := len(r.batches)
	stepEvery(600*time.Millisecond, peer1)
	r.batches = r.batches[:shipped] // the open window dies with the process
	if len(snap.Runs) != 1 || snap.Runs[0].Totals["client:rank0"] == 0 || !snap.GPUs[0].CounterOK {
		t.Fatalf("snapshot %+v", snap)
	}

	// 4 s down. The trainer keeps training; its client drops those events.
	for end := r.now.Add(4 * time.Second); r.now.Before(end); {
		r.skip(100 * time.Millisecond)
		n++
		total += 100
	}
	r.restart(snap, time.Minute)
	r.advance(1500 * time.Millisecond)
	// The client reconnects: run_start again (same client_id), then steps.
	peer2 := Peer{ConnID: 2, PID: 100, UID: 1000}
	if err := r.l.StartRun(r.now, peer2, rs); err != nil {
		t.Fatal(err)
	}
	stepEvery(2*time.Second, peer2)
	end := r.now
	if err := r.l.EndRun(end, peer2, &trainerproto.RunEnd{Run: "k"}); err != nil {
		t.Fatal(err)
	}
	r.advance(3 * time.Second)

	ws := r.windows("k")
	got := sum(ws)
	if got.tokens != total {
		t.Errorf("tokens %d, want every token the trainer produced: %d", got.tokens, total)
	}
	var recovered uint64
	var bridged bool
	for _, w := range ws {
		recovered += w.TokensRecovered
		bridged = bridged || w.RestartBridge
	}
	if recovered == 0 || !bridged {
		t.Errorf("recovered %d bridged %v, want both", recovered, bridged)
	}
	// The whole run at 600 W, warmup 1 s: the counter bridges the downtime.
	near(t, "measured counter J across the restart", got.measuredCounterJ, 600*(end.Sub(start).Seconds()-1), 1e-3)
	if !got.allCounterOK {
		t.Error("a segment lost the counter")
	}
	var ended bool
	for _, b := range r.batches {
		for _, e := range b.RunEvents {
			ended = ended || e.GetRunEnd() != nil
		}
	}
	if !ended || len(r.l.ActiveRuns()) != 0 {
		t.Errorf("run not closed after the restart: ended event %v, active %v", ended, r.l.ActiveRuns())
	}
}

func TestRestoredRunNobodyRejoinsEndsAtTheCheckpoint(t *testing.T) {
	r := newRig(t, []float64{200}, []float64{200}, 0)
	r.advance(time.Second)
	_ = r.l.StartRun(r.now, peer1, &trainerproto.RunStart{Run: "gone", WarmupS: ptr(0.0)})
	r.advance(2 * time.Second)
	for n0 := len(r.batches); len(r.batches) == n0; {
		r.advance(50 * time.Millisecond)
	}
	snap := r.l.Snapshot()
	r.skip(2 * time.Second)
	r.restart(snap, 5*time.Second)
	before := len(r.batches)
	r.advance(8 * time.Second)
	var end *trainmeterv1.RunEnd
	for _, b := range r.batches[before:] {
		for _, w := range b.RunWindows {
			if w.RunId == "gone" {
				t.Errorf("energy attributed to a run nobody rejoined: %v", w)
			}
		}
		for _, e := range b.RunEvents {
			if e.GetRunEnd() != nil {
				end = e.GetRunEnd()
			}
		}
	}
	if end == nil || !end.Time.AsTime().Equal(snap.Time) {
		t.Fatalf("run end %v, want at the checkpoint %v", end, snap.Time)
	}
}

func TestBridgeWithoutACounterIsFlaggedNotInvented(t *testing.T) {
	r := newRig(t, []float64{250}, []float64{250}, 0)
	r.advance(time.Second)
	rs := &trainerproto.RunStart{Run: "nc", WarmupS: ptr(0.0), ClientID: "x"}
	_ = r.l.StartRun(r.now, peer1, rs)
	r.advance(2 * time.Second)
	for n0 := len(r.batches); len(r.batches) == n0; {
		r.advance(50 * time.Millisecond)
	}
	snap := r.l.Snapshot()
	snap.GPUs[0].UUID = "GPU-some-other-card" // the GPU at index 0 changed
	r.skip(2 * time.Second)
	r.restart(snap, time.Minute)
	r.advance(time.Second)
	_ = r.l.StartRun(r.now, Peer{ConnID: 3}, rs)
	r.advance(500 * time.Millisecond)
	_ = r.l.EndRun(r.now, Peer{ConnID: 3}, &trainerproto.RunEnd{Run: "nc"})
	r.advance(3 * time.Second)
	for _, w := range r.windows("nc") {
		if w.RestartBridge && (w.CounterOk || !w.EnergyEstimated || w.GapS == 0) {
			t.Errorf("bridge over a changed GPU claims a measurement: %v", w)
		}
	}
}

var _ = gpu.Sample{}

func TestRestoredRunKeepsItsOwner(t *testing.T) {
	r := newRig(t, []float64{100}, []float64{100}, 0)
	r.advance(time.Second)
	owner := Peer{ConnID: 1, UID: 1000}
	rs := &trainerproto.RunStart{Run: "mine", WarmupS: ptr(0.0), ClientID: "a"}
	if err := r.l.StartRun(r.now, owner, rs); err != nil {
		t.Fatal(err)
	}
	for n0 := len(r.batches); len(r.batches) == n0; {
		r.advance(50 * time.Millisecond)
	}
	r.restart(r.l.Snapshot(), time.Minute)
	if err := r.l.StartRun(r.now, Peer{ConnID: 7, UID: 2000}, rs); err == nil {
		t.Error("another user rejoined a restored run")
	}
	if err := r.l.StartRun(r.now, Peer{ConnID: 8, UID: 1000}, rs); err != nil {
		t.Errorf("the owner could not rejoin: %v", err)
	}
}

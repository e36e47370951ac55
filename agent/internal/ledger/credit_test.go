package ledger

import (
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
)

// TestTokensTotalCreditsStepsDroppedWhileDisconnected: with the agent up
// all along, a rank that loses its connection and reconnects (same
// client_id) is credited, on its first step after, exactly the tokens of
// the steps its client dropped meanwhile (tokens_total − previous total −
// this step's tokens), worked by hand: rank 1 reports 5 steps of 100, drops
// 3 (total 800 unseen), then reports step 9 with tokens 100 and total 900:
// 300 recovered. A total that goes back (a client counting afresh) credits
// nothing; rank 0, connected throughout, is never credited.
func TestTokensTotalCreditsStepsDroppedWhileDisconnected(t *testing.T) {
	r := newRig(t, []float64{300, 300}, []float64{300, 300}, 0)
	r.advance(time.Second)
	rank0 := Peer{ConnID: 1, PID: 100, UID: 1000}
	rank1 := Peer{ConnID: 2, PID: 101, UID: 1000}
	for _, p := range []struct {
		peer Peer
		id   string
	}{{rank0, "rank0"}, {rank1, "rank1"}} {
		if err := r.l.StartRun(r.now, p.peer, &trainerproto.RunStart{Run: "c", GPUs: []string{"0", "1"}, ClientID: p.id}); err != nil {
			t.Fatal(err)
		}
	}
	var total0 uint64
	for n := uint64(1); n <= 5; n++ {
		r.advance(100 * time.Millisecond)
		total0 += 10
		step(r, rank0, "c", n, 10, total0)
		step(r, rank1, "c", n, 100, 100*n)
	}
	r.l.Disconnected(r.now, rank1)
	for n := uint64(6); n <= 8; n++ { // rank 1's client drops these
		r.advance(100 * time.Millisecond)
		total0 += 10
		step(r, rank0, "c", n, 10, total0)
	}
	back := Peer{ConnID: 3, PID: 101, UID: 1000}
	if err := r.l.StartRun(r.now, back, &trainerproto.RunStart{Run: "c", GPUs: []string{"0", "1"}, ClientID: "rank1"}); err != nil {
		t.Fatal(err)
	}
	r.advance(100 * time.Millisecond)
	step(r, back, "c", 9, 100, 900)  // 300 recovered
	step(r, back, "c", 10, 100, 50)  // counted afresh: no credit
	step(r, back, "c", 11, 100, 150) // 150 − 50 − 100 = 0: no credit
	if err := r.l.EndRun(r.now, back, &trainerproto.RunEnd{Run: "c"}); err != nil {
		t.Fatal(err)
	}
	if err := r.l.EndRun(r.now, rank0, &trainerproto.RunEnd{Run: "c"}); err != nil {
		t.Fatal(err)
	}
	r.advance(3 * time.Second)
	var tokens, recovered uint64
	for _, w := range r.windows("c") {
		tokens += w.Tokens
		recovered += w.TokensRecovered
	}
	// rank 0: 8 × 10; rank 1: 5 × 100 + 300 recovered + 3 × 100.
	if recovered != 300 || tokens != 80+500+300+300 {
		t.Errorf("tokens %d (recovered %d), want %d (300)", tokens, recovered, 80+500+300+300)
	}
}

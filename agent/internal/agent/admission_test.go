package agent

import (
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestAdmissionBoundsEventsPerBatch(t *testing.T) {
	var ad admission
	t0 := time.Unix(1000, 0)
	ev := &trainerproto.Eval{Run: "r"}
	n := 0
	for ad.allow(t0, eventSize(ev)) {
		n++
	}
	if n != maxEventsPerSec {
		t.Fatalf("burst admitted %d, want %d", n, maxEventsPerSec)
	}
	t1 := t0.Add(10 * time.Millisecond) // refills 20 events
	n = 0
	for ad.allow(t1, eventSize(ev)) {
		n++
	}
	if n < 19 || n > 20 {
		t.Fatalf("10 ms refilled %d events, want 20", n)
	}
	// Big run_starts hit the byte budget first.
	big := &trainerproto.RunStart{Run: "x", Start: &trainmeterv1.RunStart{Labels: map[string]string{}}}
	for i := 0; i < trainerproto.MaxLabels; i++ {
		big.Start.Labels[string(rune('A'+i))+"_key"] = string(make([]byte, trainerproto.MaxLabelBytes))
	}
	var ad2 admission
	n = 0
	for ad2.allow(t0, eventSize(big)) {
		n++
	}
	if limit := maxEventBytesPerSec / eventSize(big); n != limit || n >= maxEventsPerSec {
		t.Fatalf("admitted %d big run_starts, want %d", n, limit)
	}
}

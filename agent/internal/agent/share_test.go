package agent

import (
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/ledger"
	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	"github.com/trainmeter/trainmeter/pkg/clock"
	"github.com/trainmeter/trainmeter/pkg/gpu"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// processUse is a backend's per-process use of GPU 0.
type processUse map[uint32]gpu.ProcessUse

func (p processUse) ProcessUsage(int, time.Time) (map[uint32]gpu.ProcessUse, error) { return p, nil }

// Two runs share GPU 0; NVML says run a's worker (a child of its rank)
// used 60 % of the SMs and b's 20 %: the GPU's energy is split 3:1.
func TestSharedGPUSplitByProcessUtilisationOfTheRunsTrees(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	l := ledger.New(ledger.Config{Devices: []gpu.Device{{Index: 0, UUID: "GPU-a"}}})
	a := &Agent{clock: clk, ledger: l, log: slog.New(slog.DiscardHandler),
		procRoot: procFixture(t, map[int]int{10: 1, 11: 10, 20: 1, 21: 20, 30: 1}),
		procUse: processUse{11: {SMPct: 60, SMOK: true, MemMiB: 100, MemOK: true},
			21: {SMPct: 20, SMOK: true, MemMiB: 900, MemOK: true},
			30: {SMPct: 99, SMOK: true}}} // not a run's: ignored

	energy := 0.0
	tick := func(d time.Duration) []*trainmeterv1.Batch {
		var out []*trainmeterv1.Batch
		for end := clk.Now().Add(d); clk.Now().Before(end); {
			clk.Advance(50 * time.Millisecond)
			energy += 300 * 0.05
			out = append(out, l.Tick(clk.Now(), []gpu.Sample{{Index: 0, ReadAt: clk.Now(), PowerW: 300, PowerOK: true,
				EnergyJ: energy, EnergyOK: true}})...)
		}
		return out
	}
	tick(time.Second)
	for i, id := range []string{"a", "b"} {
		p := ledger.Peer{ConnID: uint64(i + 1), PID: int32(10 * (i + 1)), UID: 1000}
		if err := l.StartRun(clk.Now(), p, &trainerproto.RunStart{Run: id, GPUs: []string{"0"}}); err != nil {
			t.Fatal(err)
		}
	}
	a.pollSharing()
	bs := tick(4 * time.Second)
	j := map[string]float64{}
	for _, b := range bs {
		for _, w := range b.RunWindows {
			j[w.RunId] += w.EnergyCounterJ
			if w.ShareMethod != "utilization" {
				t.Fatalf("window of %s split by %q", w.RunId, w.ShareMethod)
			}
		}
	}
	if j["a"] < 100 || math.Abs(j["a"]-3*j["b"]) > 1e-6*j["a"] {
		t.Fatalf("a %.3f J, b %.3f J; want 3:1", j["a"], j["b"])
	}
}

// Runs on different MIG instances of one GPU split it by compute slices
// (1g and 3g: 1:3), whatever their SM use; runs in one instance do not.
func TestMIGInstancesSplitBySlices(t *testing.T) {
	work := map[string]ledger.RunWork{"a": {SMPct: 90, SMOK: true}, "b": {SMPct: 10, SMOK: true}}
	setMIGSlices(work, map[string]map[uint32]int{"a": {7: 1}, "b": {9: 3}})
	if work["a"].MIGSlices != 1 || work["b"].MIGSlices != 3 {
		t.Fatalf("distinct instances: %+v", work)
	}
	work = map[string]ledger.RunWork{"a": {}, "b": {}}
	setMIGSlices(work, map[string]map[uint32]int{"a": {7: 1}, "b": {7: 1}})
	if work["a"].MIGSlices != 0 || work["b"].MIGSlices != 0 {
		t.Fatalf("shared instance: %+v", work)
	}
}

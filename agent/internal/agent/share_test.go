package agent

import (
	"context"
	"log/slog"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/gpu/simgpu"
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

// usageBackend is a simulated GPU that states each run's use, as a replay
// trace with per-run columns does, and tells each time it is asked.
type usageBackend struct {
	*simgpu.Backend
	asked chan int
}

func (b usageBackend) RunUsage(index int, _ time.Time) map[string]gpu.ProcessUse {
	select {
	case b.asked <- index:
	default:
	}
	return map[string]gpu.ProcessUse{"a": {SMPct: 60, SMOK: true}, "b": {SMPct: 20, SMOK: true}}
}

// A run start that makes a GPU shared asks for each run's use at once,
// not at the next 1 s poll: the window it starts in is split by the work
// known when the window closes, and a poll due after that close would leave
// the window to an equal split. The fake clock never moves here, so only
// the start can have asked.
func TestRunStartPollsSharingAtOnce(t *testing.T) {
	_, collectorAddr := startRecorder(t)
	fake := clock.NewFake(time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC))
	cfg := DefaultConfig()
	cfg.Collector = collectorAddr
	cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	cfg.Spool = filepath.Join(t.TempDir(), "spool")
	cfg.Node = "share-node"
	cfg.GPU = "sim:1"
	backend := usageBackend{simgpu.New(1, 1), make(chan int, 8)}
	a, err := New(cfg, backend, fake, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	var trs []*trainer
	for _, id := range []string{"a", "b"} {
		tr := dialTrainer(t, cfg.Socket)
		trs = append(trs, tr)
		tr.send(`{"event":"run_start","run_id":"` + id + `","model":"m","gpus":[0],"warmup_s":0}`)
		tr.sync()
	}
	select {
	case g := <-backend.asked:
		if g != 0 {
			t.Errorf("asked for GPU %d's use, want 0", g)
		}
	case <-time.After(10 * time.Second):
		t.Error("two runs on GPU 0 and no poll of their use without the clock moving")
	}
	for i, tr := range trs {
		tr.send(`{"event":"run_end","run_id":"` + []string{"a", "b"}[i] + `"}`)
		tr.sync()
		tr.conn.Close()
	}
	fake.Advance(2 * time.Second)
	fake.Advance(50 * time.Millisecond) // the loop takes the next tick only after handling the last one
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.up.Flush(ctx); err != nil {
		t.Fatalf("batches not acked: %v", err)
	}
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

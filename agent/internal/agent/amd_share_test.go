package agent

import (
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/ledger"
	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	"github.com/trainmeter/trainmeter/internal/gpu/amdgpu"
	"github.com/trainmeter/trainmeter/internal/gpu/amdgpu/amdfixture"
	"github.com/trainmeter/trainmeter/pkg/clock"
	"github.com/trainmeter/trainmeter/pkg/gpu"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Two runs share an AMD card: the real amdgpu backend reads each worker's
// DRM client from fdinfo, and the one whose drm-engine-gfx grew by 600 ms
// in a second is billed three times the one whose grew by 200 ms.
func TestSharedAMDGPUSplitByEngineTimeFromFdinfo(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	proc := procFixture(t, map[int]int{10: 1, 11: 10, 20: 1, 21: 20})
	const pci = "0000:0c:00.0" // card0 of the fixture
	client := func(pid, id int, engine time.Duration) {
		if err := amdfixture.WriteClient(proc, amdfixture.Client{PID: pid, FD: 5, PCI: pci, ClientID: id, EngineNs: uint64(engine), VRAMKiB: 1 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	client(11, 1, 10*time.Second)
	client(21, 2, 10*time.Second)
	backend, err := amdgpu.New(amdgpu.Options{SysfsRoot: "../../../internal/gpu/amdgpu/testdata/mi300x/sys", ProcfsRoot: proc, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()

	l := ledger.New(ledger.Config{Devices: backend.Devices()[:1]})
	a := &Agent{clock: clk, ledger: l, log: slog.New(slog.DiscardHandler), procRoot: proc, procUse: backend}
	energy := 0.0
	tick := func(d time.Duration) []*trainmeterv1.Batch {
		var out []*trainmeterv1.Batch
		for end := clk.Now().Add(d); clk.Now().Before(end); {
			clk.Advance(50 * time.Millisecond)
			energy += 300 * 0.05
			out = append(out, l.Tick(clk.Now(), []gpu.Sample{{Index: 0, ReadAt: clk.Now(), PowerW: 300, PowerOK: true, EnergyJ: energy, EnergyOK: true}})...)
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
	a.pollSharing() // the engine counters' first sight: memory only
	tick(time.Second)
	client(11, 1, 10*time.Second+600*time.Millisecond)
	client(21, 2, 10*time.Second+200*time.Millisecond)
	a.pollSharing()
	j := map[string]float64{}
	polled := clk.Now()
	for _, b := range tick(4 * time.Second) {
		if b.GetWindowStart().AsTime().Before(polled) {
			continue // the window the second poll fell in
		}
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

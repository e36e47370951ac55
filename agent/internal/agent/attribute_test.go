package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/gpu/simgpu"
	"github.com/trainmeter/trainmeter/pkg/clock"
)

// listingSim is a simulated backend whose GPUs report compute processes.
type listingSim struct {
	*simgpu.Backend
	mu    sync.Mutex
	pids  map[int][]uint32
	calls int
}

func (b *listingSim) ComputePIDs(i int) ([]uint32, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls++
	return b.pids[i], nil
}

func (b *listingSim) set(i int, pids ...uint32) {
	b.mu.Lock()
	b.pids[i] = pids
	b.mu.Unlock()
}

// procFixture writes PID/stat files with the given parents.
func procFixture(t *testing.T, parents map[int]int) string {
	dir := t.TempDir()
	for pid, ppid := range parents {
		d := filepath.Join(dir, strconv.Itoa(pid))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		// A command name with spaces and parentheses, as /proc allows.
		stat := strconv.Itoa(pid) + " (py (x) y) S " + strconv.Itoa(ppid) + " 1 1 0 -1 4194560 0 0\n"
		if err := os.WriteFile(filepath.Join(d, "stat"), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestInTreeWalksProcFixture(t *testing.T) {
	dir := procFixture(t, map[int]int{10: 1, 11: 10, 12: 11, 20: 1, 30: 30})
	cache := map[int]int{}
	for _, c := range []struct {
		pid, root int
		want      bool
	}{{12, 10, true}, {12, 12, true}, {11, 10, true}, {20, 10, false}, {10, 12, false}, {99, 10, false}, {30, 10, false}} {
		if got := inTree(dir, c.pid, c.root, cache); got != c.want {
			t.Errorf("inTree(%d, %d) = %v, want %v", c.pid, c.root, got, c.want)
		}
	}
	if pp, err := readPPID(dir, 12); err != nil || pp != 11 {
		t.Errorf("readPPID = %d, %v", pp, err)
	}
	// The real /proc: this process descends from its parent.
	if !inTree("/proc", os.Getpid(), os.Getppid(), map[int]int{}) {
		t.Error("inTree(/proc, self, parent) = false")
	}
}

func TestAgentAttributesGPUsOfTheProcessTree(t *testing.T) {
	rec, collectorAddr := startRecorder(t)

	self := os.Getpid()
	// self -> 5001 (the command) -> 5002 (a worker on GPU 1); 6000 is
	// another user's job on GPU 0.
	dir := procFixture(t, map[int]int{5001: self, 5002: 5001, 6000: 1})
	backend := &listingSim{Backend: simgpu.New(2, 1), pids: map[int][]uint32{}}
	fake := clock.NewFake(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC))
	cfg := DefaultConfig()
	cfg.Collector = collectorAddr
	cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	cfg.Spool = filepath.Join(t.TempDir(), "spool")
	cfg.Node = "test-node"
	cfg.GPU = "nvml"
	a, err := New(cfg, backend, fake, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.procRoot = dir
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	tr := dialTrainer(t, cfg.Socket)

	backend.set(0, 6000)
	// 777777 is not this process as the agent sees it (think: another PID
	// namespace): the agent attributes the sender's own tree instead.
	tr.send(`{"event":"run_start","run_id":"z","attribute_pid":777777,"warmup_s":0}`)
	tr.sync()
	for range 20 {
		fake.Advance(100 * time.Millisecond)
	}
	a.pollAttribution()
	backend.set(1, 5002)
	a.pollAttribution()
	for range 20 {
		fake.Advance(100 * time.Millisecond)
	}
	tr.send(`{"event":"run_end","run_id":"z","status":"exit 0"}`)
	tr.sync()
	fake.Advance(2 * time.Second)
	fake.Advance(50 * time.Millisecond)

	fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer fcancel()
	if err := a.up.Flush(fctx); err != nil {
		t.Fatalf("batches not acked: %v", err)
	}
	rec.mu.Lock()
	var sawNone, sawGPU1 bool
	for _, b := range rec.batches {
		for _, w := range b.RunWindows {
			switch {
			case len(w.Gpus) == 0:
				sawNone = true
				if w.EnergyCounterJ != 0 || !w.CounterOk {
					t.Errorf("GPU-less segment: %v J counter_ok %v", w.EnergyCounterJ, w.CounterOk)
				}
			case slices.Equal(w.Gpus, []uint32{1}):
				sawGPU1 = true
				if w.EnergyCounterJ <= 0 {
					t.Errorf("GPU 1 segment has no energy")
				}
			default:
				t.Errorf("segment with GPUs %v: only GPU 1 runs the tree", w.Gpus)
			}
		}
	}
	rec.mu.Unlock()
	if !sawNone || !sawGPU1 {
		t.Errorf("segments: GPU-less %v, GPU 1 %v; want both", sawNone, sawGPU1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr.conn.Close()
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSimBackendFallsBackToAllGPUs(t *testing.T) {
	// An empty procfs: a slurmd on the test's host must not add a source.
	a := &Agent{}
	a.cfg.ProcfsRoot = t.TempDir()
	if a.initAttribution(simgpu.New(2, 1)) || a.procs != nil {
		t.Fatal("simulated GPUs must not attribute by process tree")
	}
	if !a.initAttribution(&listingSim{Backend: simgpu.New(1, 1)}) {
		t.Fatal("a backend that lists processes must attribute by process tree")
	}
}

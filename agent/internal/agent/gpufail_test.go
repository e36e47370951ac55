package agent

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/gpu/simgpu"
	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/clock"
	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// oneLost is a backend whose GPU 1 fails its reads while lost is set.
type oneLost struct {
	gpu.Backend
	lost atomic.Bool
}

func (b *oneLost) Read(now time.Time, dst []gpu.Sample) error {
	err := b.Backend.Read(now, dst)
	if b.lost.Load() {
		dst[1] = gpu.Sample{Index: 1, ReadAt: now, Err: errors.New("nvml: gpu 1: field values: ERROR_GPU_IS_LOST")}
	}
	return err
}

// loggingAgent starts an agent on backend (2 simulated GPUs, a collector
// that never answers) on a fake clock, and returns its log and a function
// that runs n ticks and waits until the loop has taken them.
func loggingAgent(t *testing.T, backend gpu.Backend) (a *Agent, logs *testkit.Buffer, tick func(n int)) {
	t.Helper()
	fake := clock.NewFake(time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC))
	logs = &testkit.Buffer{}
	cfg := DefaultConfig()
	cfg.Collector = "127.0.0.1:1"
	cfg.Socket = t.TempDir() + "/agent.sock"
	cfg.Spool = t.TempDir() + "/spool"
	cfg.Node = "test-node"
	cfg.GPU = "sim:2"
	a, err := New(cfg, backend, fake, nil, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = a.Shutdown(ctx) // the collector is unreachable: nothing is acked
	})
	return a, logs, func(n int) {
		base := a.self.ticks.Load()
		for range n {
			fake.Advance(50 * time.Millisecond)
		}
		waitTicks(t, a, base+uint64(n))
	}
}

// A GPU that stops reading is logged once, not at every 50 ms tick, and once
// more when it reads again.
func TestGPUReadFailureLoggedOnce(t *testing.T) {
	backend := &oneLost{Backend: simgpu.New(2, 1)}
	_, logs, tick := loggingAgent(t, backend)
	tick(5)
	backend.lost.Store(true)
	tick(20)
	backend.lost.Store(false)
	tick(5)
	out := logs.String()
	if n := strings.Count(out, "GPU read failing"); n != 1 || !strings.Contains(out, "ERROR_GPU_IS_LOST") {
		t.Errorf("%d failure lines over 20 failing ticks, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, "GPU reads again"); n != 1 {
		t.Errorf("%d recovery lines, want 1:\n%s", n, out)
	}
}

// garbling is a backend whose GPU 0 reads an all-ones power value while on.
type garbling struct {
	gpu.Backend
	on atomic.Bool
}

func (b *garbling) Read(now time.Time, dst []gpu.Sample) error {
	err := b.Backend.Read(now, dst)
	if b.on.Load() {
		dst[0].PowerW = 4294967.295
	}
	return err
}

// Garbled readings are logged at the 1st, 10th, 100th…, not at every tick.
func TestGarbledReadingsLoggedSparingly(t *testing.T) {
	backend := &garbling{Backend: simgpu.New(2, 1)}
	a, logs, tick := loggingAgent(t, backend)
	tick(3)
	backend.on.Store(true)
	tick(30)
	backend.on.Store(false)
	tick(3)
	out := logs.String()
	if n := strings.Count(out, "GPU readings dropped"); n != 2 || !strings.Contains(out, "total=1\n") || !strings.Contains(out, "total=10\n") {
		t.Errorf("%d lines for 30 garbled readings, want 2 (the 1st and the 10th):\n%s", n, out)
	}
	if n := a.Status().Sampling.GarbledReadings; n != 30 {
		t.Errorf("status garbled_readings %d, want 30", n)
	}
}

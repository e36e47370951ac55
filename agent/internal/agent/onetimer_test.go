package agent

import (
	"context"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/trainmeter/trainmeter/agent/internal/gpu/simgpu"
	"github.com/trainmeter/trainmeter/agent/internal/host"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

type countingHost struct{ reads atomic.Int64 }

func (h *countingHost) Read() (host.Reading, error) {
	h.reads.Add(1)
	return host.Reading{MemUsedMiB: 1234, MemTotalMiB: 4096, CPUPct: 12.5, CPUCount: 4}, nil
}

// An idle agent's cost is its wakeups (docs/benchmarks.md): one ticker, the
// sampling interval's, drives the GPUs and the host alike, and the host is
// still read once per host interval and shipped with the batches.
func TestOneTickerDrivesGPUAndHostSampling(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{advise: make(chan *trainmeterv1.Advisory, 1)}
	srv := grpc.NewServer()
	trainmeterv1.RegisterIngestServiceServer(srv, rec)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	fake := clock.NewFake(time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC))
	cfg := DefaultConfig()
	cfg.Collector = lis.Addr().String()
	cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	cfg.Spool = filepath.Join(t.TempDir(), "spool")
	cfg.Node = "test-node"
	cfg.GPU = "sim:2"
	h := &countingHost{}
	a, err := New(cfg, simgpu.New(2, 1), fake, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := fake.Tickers(); n != 1 {
		t.Errorf("%d tickers running, want 1 (the sampling interval's)", n)
	}
	fake.Advance(3 * time.Second)
	fake.Advance(cfg.Interval) // the loop takes the next tick only after handling the last one
	if n := h.reads.Load(); n < 3 || n > 4 {
		t.Errorf("host read %d times in 3 s at a %v host interval, want 3 or 4", n, cfg.HostInterval)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.up.Flush(ctx); err != nil {
		t.Fatalf("batches not acked: %v", err)
	}
	rec.mu.Lock()
	withHost := 0
	for _, b := range rec.batches {
		if b.GetHost().GetMemoryUsedMib() == 1234 && b.GetHost().GetCpuCount() == 4 {
			withHost++
		}
	}
	n := len(rec.batches)
	rec.mu.Unlock()
	if n < 2 || withHost < n-1 {
		t.Errorf("%d of %d batches carry the host window, want all but at most the first", withHost, n)
	}
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

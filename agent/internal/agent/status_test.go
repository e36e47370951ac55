package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/gpu/simgpu"
	"github.com/trainmeter/trainmeter/pkg/clock"
	"github.com/trainmeter/trainmeter/pkg/gpu"
)

func TestTickStatsDoNotAllocate(t *testing.T) {
	s := newSelfStats(time.Unix(1000, 0))
	samples := make([]gpu.Sample, 8)
	now := time.Unix(1000, 0)
	readErr := errors.New("nvml: GPU is lost")
	i := 0
	allocs := testing.AllocsPerRun(2000, func() {
		now = now.Add(50*time.Millisecond + time.Duration(i%7)*time.Millisecond)
		var err error
		if i%100 == 0 {
			err = readErr
		}
		s.tick(now, 50*time.Millisecond, samples, err)
		i++
	})
	if allocs != 0 {
		t.Fatalf("tick stats allocate %v times per tick", allocs)
	}
}

func TestTickStatsCountMissedAndJitter(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := newSelfStats(t0)
	iv := 50 * time.Millisecond
	samples := make([]gpu.Sample, 2)
	now := t0
	for i := 0; i < 100; i++ { // on time, 1 ms late every other tick
		now = now.Add(iv + time.Duration(i%2)*time.Millisecond)
		s.tick(now, iv, samples, nil)
	}
	now = now.Add(4 * iv) // three periods without a tick
	s.tick(now, iv, samples, nil)
	now = now.Add(iv)
	s.tick(now, iv, samples, errors.New("driver gone")) // the whole read failed
	now = now.Add(iv)
	samples[1].Err = errors.New("GPU 1 fell off the bus")
	s.tick(now, iv, samples, nil) // one GPU failed: one good sample
	if got := s.ticks.Load(); got != 103 {
		t.Errorf("ticks %d", got)
	}
	if got := s.samplesTaken.Load(); got != 2*101+1 {
		t.Errorf("samples taken %d, want %d", got, 2*101+1)
	}
	if s.readFailures.Load() != 2 || s.lateTicks.Load() != 1 || s.skippedTicks.Load() != 3 {
		t.Errorf("read failures %d late %d skipped %d, want 2 1 3", s.readFailures.Load(), s.lateTicks.Load(), s.skippedTicks.Load())
	}
	q := s.jitter.Quantiles(0.5, 0.99)
	if q[0] > time.Millisecond || q[1] != time.Millisecond {
		t.Errorf("jitter p50 %v p99 %v, want ≤1ms and 1ms (the 150 ms gap is the max, above p99)", q[0], q[1])
	}
}

// statusAgent starts an agent on sim GPUs with the status endpoint on
// 127.0.0.1:0, and a collector address where nothing listens.
func statusAgent(t *testing.T, clk clock.Clock, backend gpu.Backend) (*Agent, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	cfg := DefaultConfig()
	cfg.Collector = dead
	cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	cfg.Spool = filepath.Join(t.TempDir(), "spool")
	cfg.Node = "status-node"
	cfg.GPU = "sim:2"
	cfg.StatusListen = "127.0.0.1:0"
	cfg.Spool = filepath.Join(t.TempDir(), "spool")
	a, err := New(cfg, backend, clk, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = a.Shutdown(ctx) // the dead collector never acks: an error is expected
	})
	return a, "http://" + a.StatusAddr().String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// failing is a backend whose reads fail once fail is set.
type failing struct {
	gpu.Backend
	fail atomic.Bool
}

func (f *failing) Read(now time.Time, dst []gpu.Sample) error {
	if f.fail.Load() {
		return errors.New("nvml: driver not loaded")
	}
	return f.Backend.Read(now, dst)
}

func TestStatusEndpoints(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC))
	backend := &failing{Backend: simgpu.New(2, 1)}
	a, base := statusAgent(t, fake, backend)

	conn, err := net.Dial("unix", a.cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tr := &trainer{t: t, conn: conn, rd: bufio.NewReader(conn)}
	tr.send(`not json`, `{"event":"step","run_id":"x","tokens":-1}`)
	tr.readLine()
	tr.readLine()
	for i := 0; i < 40; i++ { // 2 s of ticks
		fake.Advance(50 * time.Millisecond)
	}
	waitTicks(t, a, 40)

	code, body := get(t, base+"/healthz")
	if code != http.StatusOK || strings.TrimSpace(body) != "ok" {
		t.Fatalf("healthz %d %q, want 200 ok", code, body)
	}
	code, body = get(t, base+"/status")
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("status is not JSON: %v\n%s", err, body)
	}
	if st.Node != "status-node" || st.Sampling.GPUs != 2 || st.Sampling.Ticks != 40 || st.Sampling.SamplesTaken != 80 ||
		st.Sampling.SamplesMissed != 0 || st.Sampling.IntervalMs != 50 {
		t.Errorf("sampling: %+v", st.Sampling)
	}
	if st.Socket.ParseErrors["invalid_json"] != 1 || st.Socket.ParseErrors["invalid_field"] != 1 || st.Socket.ConnsActive != 1 {
		t.Errorf("socket: %+v", st.Socket)
	}
	if st.Uplink.Connected || st.Uplink.Enqueued == 0 || st.Uplink.Pending == 0 || st.Uplink.SpoolBytes <= 0 {
		t.Errorf("uplink: %+v", st.Uplink)
	}
	for _, key := range []string{`"tick_jitter_p99_ms"`, `"batches_acked"`, `"samples_missed"`, `"parse_errors"`} {
		if !strings.Contains(body, key) {
			t.Errorf("status JSON lacks %s", key)
		}
	}

	// GPU reads fail for 6 s and the collector stays unreachable past 60 s:
	// healthz says 503 and why.
	backend.fail.Store(true)
	for i := 0; i < 120; i++ {
		fake.Advance(50 * time.Millisecond)
	}
	waitTicks(t, a, 160)
	code, body = get(t, base+"/healthz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "no GPU read succeeded for 6s") {
		t.Fatalf("healthz with failing reads: %d %q", code, body)
	}
	fake.Advance(60 * time.Second)
	code, body = get(t, base+"/healthz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "unreachable for 1m") {
		t.Fatalf("healthz with the collector down: %d %q", code, body)
	}
	st = a.Status()
	// Every tick since the failure began failed (the fake clock's jumps also
	// show up as skipped ticks, so missed ≥ failures).
	if st.Sampling.ReadFailures != st.Sampling.Ticks-40 || st.Sampling.ReadFailures < 120 ||
		st.Sampling.SamplesMissed < st.Sampling.ReadFailures || st.Sampling.SamplesTaken != 80 || st.Healthy || len(st.Problems) != 2 {
		t.Errorf("after failures: %+v %v", st.Sampling, st.Problems)
	}
	if code, _ := get(t, base+"/nope"); code != http.StatusNotFound {
		t.Errorf("unknown path: %d", code)
	}
}

func waitTicks(t *testing.T, a *Agent, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for a.self.ticks.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("loop handled %d ticks, want %d", a.self.ticks.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestStatusListenValidated(t *testing.T) {
	c := DefaultConfig()
	c.StatusListen = "no-port"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "status_listen") {
		t.Fatalf("bad status_listen accepted: %v", err)
	}
}

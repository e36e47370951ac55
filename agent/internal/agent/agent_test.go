package agent

import (
	"bufio"
	"context"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
	"github.com/trainmeter/trainmeter/agent/internal/gpu/simgpu"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type recorder struct {
	trainmeterv1.UnimplementedIngestServiceServer
	mu      sync.Mutex
	batches []*trainmeterv1.Batch
	advise  chan *trainmeterv1.Advisory
}

// startRecorder serves a recorder as the collector's IngestService on
// loopback, a real gRPC server with opts, until the test ends.
func startRecorder(t *testing.T, opts ...grpc.ServerOption) (rec *recorder, addr string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec = &recorder{advise: make(chan *trainmeterv1.Advisory, 1)}
	srv := grpc.NewServer(opts...)
	trainmeterv1.RegisterIngestServiceServer(srv, rec)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return rec, lis.Addr().String()
}

func (r *recorder) Stream(s trainmeterv1.IngestService_StreamServer) error {
	if _, err := s.Recv(); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				errc <- err
				return
			}
			r.mu.Lock()
			r.batches = append(r.batches, m.GetBatch())
			r.mu.Unlock()
			_ = s.Send(&trainmeterv1.StreamResponse{Msg: &trainmeterv1.StreamResponse_Ack{Ack: &trainmeterv1.Ack{Seq: m.GetBatch().Seq}}})
		}
	}()
	for {
		select {
		case err := <-errc:
			return err
		case a := <-r.advise:
			_ = s.Send(&trainmeterv1.StreamResponse{Msg: &trainmeterv1.StreamResponse_Advisory{Advisory: a}})
		}
	}
}

func (r *recorder) runWindows(run string) (tokens, measured uint64, energyJ float64, counterOK bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	counterOK = true
	for _, b := range r.batches {
		for _, w := range b.RunWindows {
			if w.RunId == run {
				tokens += w.Tokens
				measured += w.TokensMeasured
				energyJ += w.EnergyCounterJ
				counterOK = counterOK && w.CounterOk
			}
		}
	}
	return
}

// trainer is a raw protocol client; sync() returns once the agent has
// handled every line sent before it (lines on one connection are handled in
// order, and an unknown event always gets an error line back).
type trainer struct {
	t    *testing.T
	conn net.Conn
	rd   *bufio.Reader
}

// dialTrainer connects a raw protocol client to the agent's socket; the
// connection closes when the test ends.
func dialTrainer(t *testing.T, socket string) *trainer {
	t.Helper()
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &trainer{t: t, conn: conn, rd: bufio.NewReader(conn)}
}

func (tr *trainer) send(lines ...string) {
	for _, l := range lines {
		if _, err := tr.conn.Write([]byte(l + "\n")); err != nil {
			tr.t.Fatal(err)
		}
	}
}

func (tr *trainer) sync() {
	tr.send(`{"event":"sync","run_id":"x"}`)
	for {
		line := tr.readLine()
		if strings.Contains(line, `unknown event \"sync\"`) {
			return
		}
		if strings.Contains(line, `"error"`) {
			tr.t.Fatalf("unexpected error line: %s", line)
		}
	}
}

func (tr *trainer) readLine() string {
	_ = tr.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := tr.rd.ReadString('\n')
	if err != nil {
		tr.t.Fatalf("reading from agent: %v", err)
	}
	return line
}

func TestAgentSamplesOnTheInjectedClockAndShipsRuns(t *testing.T) {
	rec, collectorAddr := startRecorder(t)

	fake := clock.NewFake(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC))
	cfg := DefaultConfig()
	cfg.Collector = collectorAddr
	cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	cfg.Spool = filepath.Join(t.TempDir(), "spool")
	cfg.Node = "test-node"
	cfg.GPU = "sim:2"
	backend := simgpu.New(2, 1)
	a, err := New(cfg, backend, fake, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	tr := dialTrainer(t, cfg.Socket)

	fake.Advance(time.Second)
	tr.send(`{"event":"run_start","run_id":"r1","model":"m","gpus":[0,1],"warmup_s":1}`)
	tr.sync()
	for i := 1; i <= 30; i++ {
		fake.Advance(100 * time.Millisecond)
		tr.send(`{"event":"step","run_id":"r1","step":` + itoa(i) + `,"tokens":1000,"compute_s":0.09,"data_wait_s":0.01}`)
		tr.sync()
	}
	// A stop advisory from the collector reaches the trainer's connection.
	rec.advise <- &trainmeterv1.Advisory{RunId: "r1", Advice: &trainmeterv1.Advisory_Stop{Stop: &trainmeterv1.Stop{Reason: "budget exceeded"}}}
	if line := tr.readLine(); !strings.Contains(line, `"event":"stop"`) || !strings.Contains(line, "budget exceeded") {
		t.Errorf("stop line %q", line)
	}
	tr.send(`{"event":"run_end","run_id":"r1"}`)
	tr.sync()
	fake.Advance(2 * time.Second)
	// The loop takes the next tick only after handling the last one.
	fake.Advance(50 * time.Millisecond)

	fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer fcancel()
	if err := a.up.Flush(fctx); err != nil {
		t.Fatalf("batches not acked: %v %+v", err, a.Status().Uplink)
	}
	tokens, measured, energy, counterOK := rec.runWindows("r1")
	if tokens != 30000 {
		t.Errorf("tokens %d, want 30000", tokens)
	}
	// Warmup is 1 s from run start: steps at 0.1 .. 1.0 s are warmup.
	if measured != 20000 {
		t.Errorf("measured tokens %d, want 20000", measured)
	}
	// Two simulated GPUs under load for 3 s draw far more than idle power.
	if !counterOK || energy < 2*3*300 {
		t.Errorf("energy %.1f J counter_ok %v, want a loaded 2-GPU run", energy, counterOK)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr.conn.Close()
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestConfigValidateReportsEveryProblem(t *testing.T) {
	c := agentconfig.Config{Collector: "nohost", Interval: time.Hour, Warmup: -time.Second, LogLevel: "loud"}
	err := c.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, want := range []string{`collector address "nohost" has no port: give HOST:PORT, e.g. nohost:7433`, "socket path is empty", "interval 1h0m0s", "warmup -1s", "host_interval", `log_level "loud"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	d := DefaultConfig()
	if err := d.Validate(); err != nil {
		t.Errorf("default config invalid: %v", err)
	}
}

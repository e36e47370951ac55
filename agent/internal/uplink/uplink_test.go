package uplink

import (
	"context"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trainmeter/trainmeter/agent/internal/spool"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// collector is a minimal ingest server: it records batches, acks them (or
// rejects seqs in reject), and can cut the stream after cutAfter batches;
// hang: it receives batches and never answers. onBatch, when set, sees each
// batch received.
type collector struct {
	trainmeterv1.UnimplementedIngestServiceServer
	mu       sync.Mutex
	hellos   int
	got      []uint64
	losses   []*trainmeterv1.DataLoss
	reject   map[uint64]bool
	cutAfter int // cut the stream once after this many batches (0 = never)
	advise   *trainmeterv1.Advisory
	hang     bool
	acked    []uint64
	onBatch  func(seq uint64)
}

func (c *collector) Stream(s trainmeterv1.IngestService_StreamServer) error {
	first, err := s.Recv()
	if err != nil || first.GetHello() == nil {
		return err
	}
	c.mu.Lock()
	c.hellos++
	adv := c.advise
	c.mu.Unlock()
	if adv != nil {
		_ = s.Send(&trainmeterv1.StreamResponse{Msg: &trainmeterv1.StreamResponse_Advisory{Advisory: adv}})
	}
	for {
		m, err := s.Recv()
		if err != nil {
			return err
		}
		seq := m.GetBatch().Seq
		c.mu.Lock()
		c.got = append(c.got, seq)
		c.losses = append(c.losses, m.GetBatch().GetLosses()...)
		cut := c.cutAfter > 0 && len(c.got) == c.cutAfter
		rej := c.reject[seq]
		hang, onBatch := c.hang, c.onBatch
		if !cut && !rej && !hang {
			c.acked = append(c.acked, seq)
		}
		c.mu.Unlock()
		if onBatch != nil {
			onBatch(seq)
		}
		if cut {
			return nil // the batch was received but never acked
		}
		if hang {
			continue
		}
		resp := &trainmeterv1.StreamResponse{Msg: &trainmeterv1.StreamResponse_Ack{Ack: &trainmeterv1.Ack{Seq: seq}}}
		if rej {
			resp = &trainmeterv1.StreamResponse{Msg: &trainmeterv1.StreamResponse_Reject{Reject: &trainmeterv1.Reject{Seq: seq, Reason: "bad"}}}
		}
		if err := s.Send(resp); err != nil {
			return err
		}
	}
}

func serve(t *testing.T, c *collector) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	trainmeterv1.RegisterIngestServiceServer(srv, c)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func openSpool(t *testing.T, maxBytes int64) *spool.Spool {
	t.Helper()
	sp, err := spool.Open(t.TempDir(), maxBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sp.Close() })
	return sp
}

func start(t *testing.T, cfg Config) (*Uplink, func()) {
	if cfg.Spool == nil {
		cfg.Spool = openSpool(t, 0)
	}
	cfg.Hello = &trainmeterv1.Hello{Node: "n1", BootId: cfg.Spool.BootID()}
	cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	u, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return u, func() {
		if err := u.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	}
}

func flush(t *testing.T, u *Uplink) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := u.Flush(ctx); err != nil {
		t.Fatalf("flush: %v (stats %+v)", err, u.Stats())
	}
}

func TestDeliversAndResendsUnackedAfterStreamCut(t *testing.T) {
	c := &collector{cutAfter: 3}
	u, stop := start(t, Config{Address: serve(t, c)})
	defer stop()
	for seq := uint64(1); seq <= 10; seq++ {
		u.Enqueue(&trainmeterv1.Batch{Seq: seq})
	}
	flush(t, u)
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[uint64]int{}
	for _, s := range c.got {
		seen[s]++
	}
	for seq := uint64(1); seq <= 10; seq++ {
		if seen[seq] == 0 {
			t.Errorf("batch %d never reached the collector", seq)
		}
	}
	if seen[3] < 2 {
		t.Errorf("batch 3 was cut before its ack but was not re-sent: %v", c.got)
	}
	if c.hellos < 2 {
		t.Errorf("hellos %d, want a reconnect", c.hellos)
	}
	if st := u.Stats(); st.Acked != 10 || st.Pending != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestHoldsBatchesWhileCollectorIsDown(t *testing.T) {
	// Reserve an address, then only start serving on it later.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	fake := clock.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	u, stop := start(t, Config{Address: addr, Clock: fake})
	defer stop()
	for seq := uint64(1); seq <= 5; seq++ {
		u.Enqueue(&trainmeterv1.Batch{Seq: seq})
	}
	// Three failed connection attempts, each followed by a backoff on the
	// clock: the uplink waits on it before every retry.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 3 {
		if err := fake.AwaitWaiters(ctx, 1); err != nil {
			t.Fatalf("the uplink never backed off: %v", err)
		}
		if st := u.Stats(); st.Pending != 5 || st.Acked != 0 || st.Connected {
			t.Fatalf("while down: %+v", st)
		}
		fake.Advance(time.Minute) // past the longest backoff
	}
	lis, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s was taken meanwhile: %v", addr, err)
	}
	c := &collector{}
	srv := grpc.NewServer()
	trainmeterv1.RegisterIngestServiceServer(srv, c)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	// gRPC may refuse a retry or two while its own connection backoff runs
	// out; each of ours waits on the fake clock, so advance it whenever the
	// uplink waits, until everything is acked.
	advancing, stopAdvancing := context.WithCancel(ctx)
	advanced := make(chan struct{})
	go func() {
		defer close(advanced)
		for fake.AwaitWaiters(advancing, 1) == nil {
			fake.Advance(time.Minute)
		}
	}()
	flush(t, u)
	stopAdvancing()
	<-advanced
	if st := u.Stats(); st.Acked != 5 {
		t.Errorf("stats %+v", st)
	}
}

func TestRejectedBatchIsDroppedAndCounted(t *testing.T) {
	c := &collector{reject: map[uint64]bool{2: true}}
	u, stop := start(t, Config{Address: serve(t, c)})
	defer stop()
	for seq := uint64(1); seq <= 3; seq++ {
		u.Enqueue(&trainmeterv1.Batch{Seq: seq})
	}
	flush(t, u)
	if st := u.Stats(); st.Acked != 2 || st.Rejected != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestBoundedSpoolDropsOldestAndCounts(t *testing.T) {
	sp := openSpool(t, spool.MinMaxBytes)
	u, err := New(Config{Address: "127.0.0.1:1", Spool: sp, Hello: &trainmeterv1.Hello{}})
	if err != nil {
		t.Fatal(err)
	}
	defer u.conn.Close()
	pad := []*trainmeterv1.GpuWindow{{Uuid: strings.Repeat("u", 200)}}
	for seq := uint64(1); seq <= 50; seq++ {
		u.Enqueue(&trainmeterv1.Batch{Seq: seq, GpuWindows: pad, RunWindows: []*trainmeterv1.RunWindow{{RunId: "r", Tokens: 100 + seq}}})
	}
	st := u.Stats()
	held, err := sp.Cursor(0).ReadAfter(0, math.MaxInt)
	if err != nil {
		t.Fatal(err)
	}
	if st.Dropped == 0 || st.Pending != len(held) || st.Dropped+uint64(st.Pending) != 50 || st.SpoolBytes > spool.MinMaxBytes || st.DroppedBytes == 0 {
		t.Errorf("stats %+v", st)
	}
	if held[len(held)-1].Seq != 50 {
		t.Errorf("newest batch not kept: %d", held[len(held)-1].Seq)
	}
	var lost uint64
	for _, b := range held {
		for _, l := range b.Losses {
			lost += l.Batches
		}
	}
	if lost != st.Dropped {
		t.Errorf("loss records count %d batches, dropped %d", lost, st.Dropped)
	}
}

func TestUnackedBatchesAreResentAfterAgentRestart(t *testing.T) {
	dir := t.TempDir()
	sp, err := spool.Open(dir, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	// First life: the collector is unreachable; three batches are spooled.
	u, err := New(Config{Address: "127.0.0.1:1", Spool: sp, Hello: &trainmeterv1.Hello{}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		u.Enqueue(&trainmeterv1.Batch{})
	}
	_ = u.conn.Close()
	boot := sp.BootID()
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	// Second life: same spool, the collector is up.
	sp, err = spool.Open(dir, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sp.Close() })
	if sp.BootID() != boot {
		t.Fatalf("boot id changed across a restart")
	}
	c := &collector{}
	u2, stop := start(t, Config{Address: serve(t, c), Spool: sp})
	defer stop()
	u2.Enqueue(&trainmeterv1.Batch{})
	flush(t, u2)
	c.mu.Lock()
	defer c.mu.Unlock()
	if fmt.Sprint(c.got) != "[1 2 3 4]" {
		t.Errorf("collector got seqs %v, want [1 2 3 4]", c.got)
	}
}

func TestAdvisoriesReachTheCallback(t *testing.T) {
	got := make(chan *trainmeterv1.Advisory, 1)
	c := &collector{advise: &trainmeterv1.Advisory{RunId: "r1", Advice: &trainmeterv1.Advisory_Stop{Stop: &trainmeterv1.Stop{Reason: "budget"}}}}
	_, stop := start(t, Config{Address: serve(t, c), OnAdvisory: func(a *trainmeterv1.Advisory) { got <- a }})
	defer stop()
	select {
	case a := <-got:
		if a.RunId != "r1" || a.GetStop().GetReason() != "budget" {
			t.Errorf("advisory %v", a)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no advisory")
	}
}

// refuser ends every stream as a collector refusing this node's token does.
type refuser struct {
	trainmeterv1.UnimplementedIngestServiceServer
}

func (refuser) Stream(s trainmeterv1.IngestService_StreamServer) error {
	return status.Error(codes.Unauthenticated, "bad token for node n1")
}

func TestStreamRefusalReportsTheCollectorsStatusNotEOF(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	trainmeterv1.RegisterIngestServiceServer(srv, refuser{})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	sp := openSpool(t, 0)
	u, err := New(Config{Address: lis.Addr().String(), Spool: sp, Hello: &trainmeterv1.Hello{Node: "n1", BootId: sp.BootID()}})
	if err != nil {
		t.Fatal(err)
	}
	defer u.conn.Close()
	u.Enqueue(&trainmeterv1.Batch{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = u.session(ctx)
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("session error %v, want the collector's Unauthenticated", err)
	}
}

func TestOversizedBatchIsDroppedNotResentForever(t *testing.T) {
	c := &collector{}
	u, stop := start(t, Config{Address: serve(t, c)})
	defer stop()
	huge := &trainmeterv1.Batch{RunEvents: []*trainmeterv1.RunEvent{{Event: &trainmeterv1.RunEvent_RunStart{RunStart: &trainmeterv1.RunStart{
		RunId: "r", Labels: map[string]string{"pad": strings.Repeat("x", MaxBatchBytes)}}}}},
		RunWindows: []*trainmeterv1.RunWindow{{RunId: "r", Tokens: 512}}}
	u.Enqueue(huge)
	u.Enqueue(&trainmeterv1.Batch{})
	flush(t, u)
	// The huge batch's loss report rides on the next batch spooled after the
	// sender dropped it: the second batch, the one Flush appends for a
	// pending report, or (dropped after that) the third.
	u.Enqueue(&trainmeterv1.Batch{})
	flush(t, u)
	st := u.Stats()
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.Rejected != 1 || st.Acked != uint64(len(c.got)) {
		t.Errorf("stats %+v, collector got %v: want the huge batch rejected locally and every batch sent acked", st, c.got)
	}
	if slices.Contains(c.got, huge.Seq) || !slices.Contains(c.got, huge.Seq+1) || !slices.Contains(c.got, huge.Seq+2) {
		t.Errorf("collector got seqs %v, want the two after the huge %d and not it", c.got, huge.Seq)
	}
	if len(c.losses) != 1 || c.losses[0].GetRunId() != "r" || c.losses[0].GetBatches() != 1 || c.losses[0].GetTokens() != 512 ||
		!strings.Contains(c.losses[0].GetReason(), "exceeds the") {
		t.Errorf("loss records %v, want the huge batch's run reported lost once (got %v, stats %+v)", c.losses, c.got, st)
	}
}

// TestDeliversWithin5sOfCollectorReturning: after a long outage (the
// reconnect step at its cap) the agent's data reaches a collector within
// 5 s of it listening again, on the injected clock. Neither the uplink's
// own backoff nor gRPC's connection backoff may hold it back longer.
func TestDeliversWithin5sOfCollectorReturning(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	fake := clock.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	sp := openSpool(t, 0)
	// The default backoff bounds, as the agent runs with them.
	u, err := New(Config{Address: addr, Spool: sp, Clock: fake, Hello: &trainmeterv1.Hello{Node: "n1", BootId: sp.BootID()}})
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := u.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	u.Enqueue(&trainmeterv1.Batch{Seq: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Twenty failed attempts: the step is at its cap by then.
	for range 20 {
		if err := fake.AwaitWaiters(ctx, 1); err != nil {
			t.Fatalf("the uplink never backed off: %v", err)
		}
		fake.AdvanceToNextWaiter()
	}
	if err := fake.AwaitWaiters(ctx, 1); err != nil {
		t.Fatalf("the uplink never backed off: %v", err)
	}
	lis, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s was taken meanwhile: %v", addr, err)
	}
	back := fake.Now()
	c := &collector{}
	srv := grpc.NewServer()
	trainmeterv1.RegisterIngestServiceServer(srv, c)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	for u.Stats().Acked < 1 {
		if ctx.Err() != nil {
			t.Fatalf("nothing acked %v after the collector came back (stats %+v)", fake.Now().Sub(back), u.Stats())
		}
		if fake.Waiters() > 0 {
			fake.AdvanceToNextWaiter()
			continue
		}
		time.Sleep(5 * time.Millisecond)
	}
	if took := fake.Now().Sub(back); took > 5*time.Second {
		t.Errorf("first ack %v after the collector listened again, want ≤ 5 s", took)
	}
}

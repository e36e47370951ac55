package ingest

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/testkit"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.GoleakOptions()...)
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// gated wraps the real store: ApplyBatchResult waits for gate (if set) and fails
// with fail (if set) before touching the store.
type gated struct {
	*store.Store
	entered chan struct{}
	gate    chan struct{}
	fail    error
}

func (g *gated) ApplyBatchResult(sender store.Sender, b *trainmeterv1.Batch) (store.Applied, error) {
	if g.entered != nil {
		g.entered <- struct{}{}
	}
	if g.gate != nil {
		<-g.gate
	}
	if g.fail != nil {
		return store.Applied{}, g.fail
	}
	return g.Store.ApplyBatchResult(sender, b)
}

func serve(t *testing.T, st storage.Ingester) (*Server, *grpc.ClientConn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ing := New(st, quiet())
	ing.SetClock(tu.Clock()) // the test batches are dated around tu.T0
	gs := grpc.NewServer()
	trainmeterv1.RegisterIngestServiceServer(gs, ing)
	go gs.Serve(lis)
	t.Cleanup(func() {
		ing.Close()
		gs.GracefulStop()
	})
	return ing, tu.Dial(t, lis.Addr().String())
}

func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(t.TempDir(), store.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestAckOnlyAfterCommit(t *testing.T) {
	st := openStore(t)
	g := &gated{Store: st, entered: make(chan struct{}, 1), gate: make(chan struct{})}
	_, conn := serve(t, g)
	a := tu.Connect(t, conn, "n1", "boot")
	b := tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r1", 0, 100, 10)}, tu.Start("r1", 0, "m"))
	if err := a.Stream.Send(&trainmeterv1.StreamRequest{Msg: &trainmeterv1.StreamRequest_Batch{Batch: b}}); err != nil {
		t.Fatal(err)
	}
	<-g.entered // the server is now inside ApplyBatch, blocked
	got := make(chan *trainmeterv1.StreamResponse, 1)
	go func() {
		m, _ := a.Stream.Recv()
		got <- m
	}()
	select {
	case m := <-got:
		t.Fatalf("response before the store committed: %v", m)
	case <-time.After(150 * time.Millisecond):
	}
	if _, err := st.GetRun("r1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("run visible before commit: %v", err)
	}
	close(g.gate)
	m := <-got
	if m.GetAck().GetSeq() != 1 {
		t.Fatalf("want ack 1, got %v", m)
	}
	// Acked means committed: the run is there now.
	s, err := st.GetRun("r1")
	if err != nil || s.Report(aggregate.Pricing{}).TokensProcessed != 100 {
		t.Fatalf("after ack: %v %v", s, err)
	}
}

func TestStoreErrorIsUnavailableWithoutAck(t *testing.T) {
	g := &gated{Store: openStore(t), fail: errors.New("disk on fire")}
	_, conn := serve(t, g)
	a := tu.Connect(t, conn, "n1", "boot")
	resp, err := a.Send(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r1", 0, 1, 1)}))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("want Unavailable, got resp=%v err=%v", resp, err)
	}
}

func TestFirstMessageMustBeHello(t *testing.T) {
	_, conn := serve(t, openStore(t))
	for name, first := range map[string]*trainmeterv1.StreamRequest{
		"batch":      {Msg: &trainmeterv1.StreamRequest_Batch{Batch: tu.Batch(1, 0, nil)}},
		"empty":      {},
		"empty node": {Msg: &trainmeterv1.StreamRequest_Hello{Hello: &trainmeterv1.Hello{BootId: "b"}}},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := trainmeterv1.NewIngestServiceClient(conn).Stream(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Send(first); err != nil {
				t.Fatal(err)
			}
			_, err = s.Recv()
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("want InvalidArgument, got %v", err)
			}
		})
	}
}

func TestRejectsStoreNothingAndStreamContinues(t *testing.T) {
	st := openStore(t)
	_, conn := serve(t, st)
	a := tu.Connect(t, conn, "n1", "boot")
	seq := uint64(1)
	for name, b := range tu.Invalid(seq) {
		reason := a.MustReject(b)
		t.Logf("%s: %s", name, reason)
	}
	runs, err := st.ListRuns(nil)
	if err != nil || len(runs) != 0 {
		t.Fatalf("rejected batches stored runs: %d %v", len(runs), err)
	}
	// The same seq, now valid, is applied: the rejects left no dedup mark.
	a.MustAck(tu.Batch(seq, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 7, 1)}, tu.Start("r", 0, "m")))
	s, err := st.GetRun("r")
	if err != nil || s.Report(aggregate.Pricing{}).TokensProcessed != 7 {
		t.Fatalf("valid batch after rejects: %v", err)
	}
}

func TestAdviseAndConnected(t *testing.T) {
	ing, conn := serve(t, openStore(t))
	if ing.Advise("n1", &trainmeterv1.Advisory{RunId: "r"}) {
		t.Fatal("advised a node that is not connected")
	}
	a := tu.Connect(t, conn, "n1", "boot")
	a.MustAck(tu.Batch(1, 0, nil)) // the hello has been processed
	if !ing.Connected("n1") {
		t.Fatal("n1 not connected")
	}
	adv := &trainmeterv1.Advisory{RunId: "r", Advice: &trainmeterv1.Advisory_Stop{Stop: &trainmeterv1.Stop{Reason: "budget"}}}
	if !ing.Advise("n1", adv) {
		t.Fatal("Advise returned false")
	}
	m, err := a.Stream.Recv()
	if err != nil || m.GetAdvisory().GetStop().GetReason() != "budget" {
		t.Fatalf("advisory: %v %v", m, err)
	}
	// A full queue never blocks.
	for i := 0; i < advisoryQueue*3; i++ {
		ing.Advise("n1", adv)
	}
	nodes := ing.Nodes()
	if len(nodes) != 1 || !nodes[0].GetConnected() || nodes[0].GetLastSeq() != 1 {
		t.Fatalf("nodes: %v", nodes)
	}
	a.Close()
	deadline := time.Now().Add(5 * time.Second)
	for ing.Connected("n1") {
		if time.Now().After(deadline) {
			t.Fatal("still connected after the stream closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCloseEndsStreams(t *testing.T) {
	ing, conn := serve(t, openStore(t))
	a := tu.Connect(t, conn, "n1", "boot")
	a.MustAck(tu.Batch(1, 0, nil))
	ing.Close()
	if _, err := a.Stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("want Unavailable after Close, got %v", err)
	}
}

func TestObserversSeeEachAppliedBatchOnce(t *testing.T) {
	st := openStore(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ing := New(st, quiet())
	ing.SetClock(tu.Clock())
	var seen []uint64
	var mu sync.Mutex
	ing.OnApplied(func(node string, b *trainmeterv1.Batch) {
		mu.Lock()
		defer mu.Unlock()
		if node != "n1" {
			t.Errorf("observer got node %q", node)
		}
		seen = append(seen, b.GetSeq())
	})
	gs := grpc.NewServer()
	trainmeterv1.RegisterIngestServiceServer(gs, ing)
	go gs.Serve(lis)
	t.Cleanup(func() {
		ing.Close()
		gs.GracefulStop()
	})
	a := tu.Connect(t, tu.Dial(t, lis.Addr().String()), "n1", "boot")
	for _, b := range []*trainmeterv1.Batch{
		tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r1", 0, 100, 10)}, tu.Start("r1", 0, "m")),
		tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r1", 0, 100, 10)}, tu.Start("r1", 0, "m")), // redelivery
		tu.Batch(2, 1, []*trainmeterv1.RunWindow{tu.Window("r1", 1, 100, 10)}),
	} {
		if resp, err := a.Send(b); err != nil || resp.GetAck() == nil {
			t.Fatalf("seq %d: %v %v", b.GetSeq(), resp, err)
		}
	}
	// A rejected batch (window end before start) is not observed either.
	bad := tu.Batch(3, 2, []*trainmeterv1.RunWindow{tu.Window("r1", 2, 1, 1)})
	bad.RunWindows[0].End = bad.RunWindows[0].Start
	bad.RunWindows[0].Start = timestamppb.New(bad.RunWindows[0].End.AsTime().Add(time.Second))
	if resp, err := a.Send(bad); err != nil || resp.GetReject() == nil {
		t.Fatalf("bad batch: %v %v", resp, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(seen) != "[1 2]" {
		t.Fatalf("observed seqs %v, want [1 2]", seen)
	}
}

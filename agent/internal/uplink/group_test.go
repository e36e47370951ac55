package uplink

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/trainmeter/trainmeter/agent/internal/spool"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// One of a pair is down: the other gets and acks every batch meanwhile, the
// spool keeps them for the one that is down, and once it listens it gets
// them all too; only then does the spool let them go.
func TestGroupOneCollectorDownHoldsUpNeitherTheOtherNorEnqueue(t *testing.T) {
	up := &collector{}
	upAddr := serve(t, up)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	downAddr := lis.Addr().String()
	lis.Close()

	sp, err := spool.OpenWith(t.TempDir(), 0, spool.Options{Collectors: []string{upAddr, downAddr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sp.Close() })
	g, err := NewGroup(sp, []string{upAddr, downAddr}, false, Config{
		Hello: &trainmeterv1.Hello{Node: "n1", BootId: sp.BootID()}, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := g.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	for range 20 {
		done := make(chan struct{})
		go func() { g.Enqueue(&trainmeterv1.Batch{}); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Enqueue waited for the collector that is down")
		}
	}
	flush(t, g.Uplinks()[0])
	if n := g.Uplinks()[1].Stats().Pending; n != 20 || sp.Len() != 20 {
		t.Fatalf("held for the collector that is down: %d (spool %d), want 20", n, sp.Len())
	}
	if st := g.Stats(); st.Connected || st.Pending != 20 || st.Acked != 20 {
		t.Errorf("group stats with one of two down: %+v", st)
	}

	down := &collector{}
	lis, err = net.Listen("tcp", downAddr)
	if err != nil {
		t.Skipf("the reserved address was taken meanwhile: %v", err)
	}
	srv := grpc.NewServer()
	trainmeterv1.RegisterIngestServiceServer(srv, down)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Flush(ctx); err != nil {
		t.Fatalf("flush once both are up: %v", err)
	}
	want := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}
	for name, c := range map[string]*collector{"up": up, "came back": down} {
		c.mu.Lock()
		got := slices.Compact(slices.Sorted(slices.Values(c.got)))
		c.mu.Unlock()
		if !slices.Equal(got, want) {
			t.Errorf("collector %s got seqs %v, want 1..20", name, got)
		}
	}
	if sp.Len() != 0 {
		t.Errorf("spool holds %d after both acked", sp.Len())
	}
}

func TestGroupPassesAdvisoriesWithTheCollectorsIndex(t *testing.T) {
	adv := &trainmeterv1.Advisory{RunId: "r", Advice: &trainmeterv1.Advisory_Stop{Stop: &trainmeterv1.Stop{Reason: "budget"}}}
	a, b := &collector{advise: adv}, &collector{advise: adv}
	addrs := []string{serve(t, a), serve(t, b)}
	sp, err := spool.OpenWith(t.TempDir(), 0, spool.Options{Collectors: addrs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sp.Close() })
	from := make(chan int, 2)
	g, err := NewGroup(sp, addrs, false, Config{Hello: &trainmeterv1.Hello{Node: "n1", BootId: sp.BootID()}},
		func(i int, got *trainmeterv1.Advisory) {
			if got.RunId == "r" {
				from <- i
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown(context.Background())
	var seen []int
	for range 2 {
		select {
		case i := <-from:
			seen = append(seen, i)
		case <-time.After(10 * time.Second):
			t.Fatalf("advisories from collectors %v only", seen)
		}
	}
	if slices.Sort(seen); !slices.Equal(seen, []int{0, 1}) {
		t.Errorf("advisories from collectors %v, want 0 and 1", seen)
	}
}

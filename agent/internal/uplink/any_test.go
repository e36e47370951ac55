package uplink

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/spool"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// startAny starts a mode-any group over addrs on a fresh one-cursor spool.
func startAny(t *testing.T, addrs []string, ackTimeout time.Duration) *Group {
	t.Helper()
	sp := openSpool(t, 0)
	g, err := NewGroup(sp, addrs, true, Config{Hello: &trainmeterv1.Hello{Node: "n1", BootId: sp.BootID()},
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, AckTimeout: ackTimeout}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return g
}

func flushGroup(t *testing.T, g *Group) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Flush(ctx); err != nil {
		t.Fatalf("flush: %v (stats %+v)", err, g.Stats())
	}
}

func seqs(c *collector) (got, acked []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got), slices.Clone(c.acked)
}

func upTo(from, to uint64) []uint64 {
	var s []uint64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

// Mode any: the collector in use breaks its stream (after acking some), the
// uplink moves to the next, which gets only what the first did not ack; when
// that one breaks too, the uplink goes round to the first again. Batches go
// to one collector at a time (they never interleave), none is lost, and the
// one spool cursor lets each go once acked by any.
func TestAnyMovesToTheNextWhenTheStreamBreaksThenRoundToTheFirst(t *testing.T) {
	var mu sync.Mutex
	var trace []string // the collector of each batch received, in order
	on := func(name string) func(uint64) {
		return func(uint64) { mu.Lock(); trace = append(trace, name); mu.Unlock() }
	}
	a := &collector{cutAfter: 5}
	b := &collector{cutAfter: 4}
	a.onBatch, b.onBatch = on("a"), on("b")
	addrA, addrB := serve(t, a), serve(t, b)
	g := startAny(t, []string{addrA, addrB}, 0)
	if n := len(g.Uplinks()); n != 1 {
		t.Fatalf("mode any has %d uplinks, want one", n)
	}
	for range 10 {
		g.Enqueue(&trainmeterv1.Batch{})
	}
	flushGroup(t, g)

	// a: 1..5 on its first stream, cut at 5 (not acked); b: 5..8, cut at 8;
	// a again: 8..10.
	gotA, ackedA := seqs(a)
	gotB, ackedB := seqs(b)
	for _, c := range []struct {
		name      string
		got, want []uint64
	}{
		{"a got", gotA, slices.Concat(upTo(1, 5), upTo(8, 10))},
		{"a acked", ackedA, slices.Concat(upTo(1, 4), upTo(8, 10))},
		{"b got", gotB, upTo(5, 8)},
		{"b acked", ackedB, upTo(5, 7)},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s %v, want %v", c.name, c.got, c.want)
		}
	}
	mu.Lock()
	switches := len(slices.Compact(slices.Clone(trace))) - 1
	mu.Unlock()
	if switches != 2 {
		t.Errorf("batches went a, b, a in %d switches (trace %v), want 2: one collector at a time", switches, trace)
	}
	if u := g.Uplinks()[0]; u.Address() != addrA {
		t.Errorf("in use %s, want %s (round to the first)", u.Address(), addrA)
	}
	if st := g.Stats(); st.Acked != 10 || st.Pending != 0 {
		t.Errorf("stats %+v: want 10 acked, none pending", st)
	}
}

// Mode any: a collector that refuses connections is passed over at once;
// every batch goes to the one that is up.
func TestAnySkipsARefusingCollector(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := lis.Addr().String()
	lis.Close()
	up := &collector{}
	upAddr := serve(t, up)
	g := startAny(t, []string{down, upAddr}, 0)
	for range 20 {
		g.Enqueue(&trainmeterv1.Batch{})
	}
	flushGroup(t, g)
	if got, _ := seqs(up); !slices.Equal(got, upTo(1, 20)) {
		t.Errorf("the collector that is up got %v, want 1..20 once each", got)
	}
	if u := g.Uplinks()[0]; u.Address() != upAddr {
		t.Errorf("in use %s, want %s", u.Address(), upAddr)
	}
}

// Mode any: a collector that takes batches and never acks them (hung, or its
// database is) counts as failed after AckTimeout: the next gets them.
func TestAnyMovesOnWhenNoAckComesInTime(t *testing.T) {
	hung, ok := &collector{hang: true}, &collector{}
	g := startAny(t, []string{serve(t, hung), serve(t, ok)}, 200*time.Millisecond)
	for range 5 {
		g.Enqueue(&trainmeterv1.Batch{})
	}
	flushGroup(t, g)
	gotHung, ackedHung := seqs(hung)
	if len(gotHung) == 0 || len(ackedHung) != 0 {
		t.Errorf("the hung collector got %v and acked %v, want some and none", gotHung, ackedHung)
	}
	if got, _ := seqs(ok); !slices.Equal(got, upTo(1, 5)) {
		t.Errorf("the next collector got %v, want 1..5", got)
	}
}

// Mode all stays one uplink per collector, and mode any wants a spool with
// one cursor.
func TestAnyNeedsOneCursor(t *testing.T) {
	sp, err := spool.OpenWith(t.TempDir(), 0, spool.Options{Collectors: []string{"a:1", "b:1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sp.Close() })
	if _, err := NewGroup(sp, []string{"a:1", "b:1"}, true, Config{Hello: &trainmeterv1.Hello{}}, nil); err == nil || !strings.Contains(err.Error(), "one spool cursor") {
		t.Errorf("mode any over a two-cursor spool: %v", err)
	}
}

// Mode any: an advisory comes with the index of the collector in use, so the
// agent can tell a decision the next replica repeats after a move.
func TestAnyPassesAdvisoriesWithTheIndexOfTheCollectorInUse(t *testing.T) {
	adv := &trainmeterv1.Advisory{RunId: "r", Advice: &trainmeterv1.Advisory_Stop{Stop: &trainmeterv1.Stop{Reason: "budget"}}}
	a, b := &collector{advise: adv, cutAfter: 1}, &collector{advise: adv}
	addrs := []string{serve(t, a), serve(t, b)}
	sp := openSpool(t, 0)
	from := make(chan int, 4)
	g, err := NewGroup(sp, addrs, true, Config{Hello: &trainmeterv1.Hello{Node: "n1", BootId: sp.BootID()},
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}, func(i int, got *trainmeterv1.Advisory) { from <- i })
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown(context.Background())
	g.Enqueue(&trainmeterv1.Batch{})
	var seen []int
	for range 2 {
		select {
		case i := <-from:
			seen = append(seen, i)
		case <-time.After(10 * time.Second):
			t.Fatalf("advisories from collectors %v only", seen)
		}
	}
	if !slices.Equal(seen, []int{0, 1}) {
		t.Errorf("advisories from collectors %v, want 0 (a, cut after one batch) then 1 (b)", seen)
	}
}

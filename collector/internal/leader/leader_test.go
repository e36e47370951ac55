package leader_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/trainmeter/trainmeter/collector/internal/leader"
	"github.com/trainmeter/trainmeter/collector/internal/pgstore"
	"github.com/trainmeter/trainmeter/internal/pgtest"
	"github.com/trainmeter/trainmeter/pkg/clock"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// task counts its starts and stops.
type task struct{ starts, stops atomic.Int32 }

func (k *task) Start(context.Context) error    { k.starts.Add(1); return nil }
func (k *task) Shutdown(context.Context) error { k.stops.Add(1); return nil }
func (k *task) running() bool                  { return k.starts.Load() > k.stops.Load() }

type replica struct {
	e *leader.Elector
	t *task
}

// newReplica is one collector's elector over the database at url.
func newReplica(t *testing.T, url string, clk clock.Clock) replica {
	t.Helper()
	st, err := pgstore.Open(context.Background(), url, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	k := &task{}
	e := leader.New(leader.Config{Lock: st.LeaderLock(), Clock: clk, Tasks: []leader.Task{k}})
	if err := e.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return replica{e, k}
}

// terminateLeader ends the database session that holds the leader lock,
// as the death of its collector or its connection does.
func terminateLeader(t *testing.T, url string) {
	t.Helper()
	c, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var n int
	if err := c.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $1`,
		int64(0x74726d6c65616465)).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminated %d leader sessions (%v), want 1", n, err)
	}
}

// waitFor advances clk by one retry period at a time until cond holds, at
// most periods times.
func waitFor(t *testing.T, clk *clock.Fake, periods int, what string, cond func() bool) {
	t.Helper()
	for i := 0; ; i++ {
		// The lock's session ends asynchronously: give each period a
		// moment of real time.
		deadline := time.Now().Add(500 * time.Millisecond)
		for time.Now().Before(deadline) {
			if cond() {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		if i == periods {
			t.Fatalf("%s: not after %d retry periods", what, periods)
		}
		clk.Advance(leader.DefaultRetry)
	}
}

func exactlyOne(rs ...replica) (int, bool) {
	n, who := 0, -1
	for i, r := range rs {
		if r.e.Leading() {
			n, who = n+1, i
		}
		if r.e.Leading() != r.t.running() {
			return -1, false
		}
	}
	return who, n == 1
}

// TestOneLeaderAndTakeover: of two electors on one database exactly one
// leads and runs the tasks; when its session ends it stops them at once,
// and the other takes over within a few retry periods.
func TestOneLeaderAndTakeover(t *testing.T) {
	url := pgtest.DB(t)
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	a := newReplica(t, url, clk)
	b := newReplica(t, url, clk)
	if !a.e.Leading() || b.e.Leading() || !a.t.running() || b.t.running() {
		t.Fatalf("first started leads: a %v (task %v), b %v (task %v)", a.e.Leading(), a.t.running(), b.e.Leading(), b.t.running())
	}
	// Retries while the leader lives change nothing.
	for range 3 {
		clk.Advance(leader.DefaultRetry)
	}
	if who, ok := exactlyOne(a, b); !ok || who != 0 {
		t.Fatalf("after retries: leader %d (one: %v), want a", who, ok)
	}

	terminateLeader(t, url)
	// a notices without waiting for a retry period.
	deadline := time.Now().Add(5 * time.Second)
	for a.e.Leading() || a.t.running() {
		if time.Now().After(deadline) {
			t.Fatal("a still leads after its session ended")
		}
		time.Sleep(5 * time.Millisecond)
	}
	waitFor(t, clk, 3, "b takes over", func() bool { who, ok := exactlyOne(a, b); return ok && who == 1 })
	if a.t.stops.Load() != 1 || b.t.starts.Load() != 1 {
		t.Errorf("a stopped %d times, b started %d times, want 1 and 1", a.t.stops.Load(), b.t.starts.Load())
	}

	// a stays a follower while b leads, and leads again when b shuts down
	// (which gives the lock up).
	for range 3 {
		clk.Advance(leader.DefaultRetry)
	}
	if who, ok := exactlyOne(a, b); !ok || who != 1 {
		t.Fatalf("after retries: leader %d (one: %v), want b", who, ok)
	}
	if err := b.e.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if b.e.Leading() || b.t.running() {
		t.Fatal("b leads after its shutdown")
	}
	waitFor(t, clk, 3, "a takes over again", func() bool { return a.e.Leading() && a.t.running() })
}

// TestWithoutLockAlwaysLeads: one collector on its own store (no lock)
// leads from Start to Shutdown.
func TestWithoutLockAlwaysLeads(t *testing.T) {
	k := &task{}
	e := leader.New(leader.Config{Tasks: []leader.Task{k}})
	if err := e.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !e.Leading() || !k.running() {
		t.Fatal("no lock: not leading")
	}
	if err := e.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if e.Leading() || k.running() {
		t.Fatal("leads after shutdown")
	}
}

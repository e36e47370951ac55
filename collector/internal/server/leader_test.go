package server_test

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/budget"
	"github.com/trainmeter/trainmeter/collector/internal/pgstore"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/pgtest"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// hookReceiver answers each alert's first POST 503, later ones 200, and
// counts both by Idempotency-Key.
type hookReceiver struct {
	mu             sync.Mutex
	posts, accepts map[string]int
}

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	id := r.Header.Get("Idempotency-Key")
	h.posts[id]++
	if h.posts[id] == 1 {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	h.accepts[id]++
}

func (h *hookReceiver) counts() (posts, accepts map[string]int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.posts), maps.Clone(h.accepts)
}

// TestFleetWebhooksOnceAcrossLeaderKill: collectors on one PostgreSQL
// database; only the leader fires budget alerts and delivers webhooks.
// An alert whose first POST failed waits to be retried; a collector that
// starts meanwhile does not deliver it, and when the leader's session
// ends the new leader does, once; the old leader, now a follower, does
// not retry it. Alerts that batches applied by a follower cause are fired
// by the leader. Every alert reaches the receiver accepted exactly once.
func TestFleetWebhooksOnceAcrossLeaderKill(t *testing.T) {
	url := pgtest.ServerDB(t)
	recv := &hookReceiver{posts: map[string]int{}, accepts: map[string]int{}}
	hook := httptest.NewServer(recv)
	defer hook.Close()
	clk := tu.Clock()
	cfg := server.Config{StoreURL: url, Clock: clk, GPUPricePerHour: 3600, Budget: server.BudgetConfig{EvalInterval: time.Second},
		Alerts: server.AlertConfig{Webhook: alert.WebhookConfig{URLs: []string{hook.URL}, BaseBackoff: 2 * time.Minute, MaxBackoff: 2 * time.Minute}}}
	a := start(t, cfg)
	b := start(t, cfg)
	if !a.Status().Leader || b.Status().Leader {
		t.Fatalf("leaders: a %v, b %v; want a only", a.Status().Leader, b.Status().Leader)
	}
	advance := func(d, step time.Duration) {
		for range int(d / step) {
			clk.Advance(step)
			time.Sleep(time.Millisecond)
		}
	}
	// stored is every alert recorded in the database, by id.
	st, err := pgstore.Open(t.Context(), url, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	stored := func() []string {
		as, err := (&alert.Recorder{Store: st}).List("")
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, x := range as {
			ids = append(ids, x.ID)
		}
		return slices.Sorted(slices.Values(ids))
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 20 s", what)
			}
			advance(time.Second, time.Second)
			time.Sleep(10 * time.Millisecond)
		}
	}

	bc := tu.Dial(t, b.Addr().String())
	if _, err := trainmeterv1.NewBudgetServiceClient(bc).SetBudget(t.Context(), &trainmeterv1.SetBudgetRequest{Scope: "model:llama", LimitUsd: 2}); err != nil {
		t.Fatal(err)
	}
	// $1 of $2, applied by the follower: the leader fires (within
	// budget.FleetReload) and its first POST fails.
	ab := tu.Connect(t, bc, "node-1", "boot")
	ab.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 10, 1)}, tu.Start("r", 0, "llama")))
	eventually("the leader fires and POSTs", func() bool { p, _ := recv.counts(); return len(stored()) > 0 && len(p) > 0 })
	first := stored()

	// A collector starting now finds the alert pending; it does not lead,
	// so it does not deliver it.
	c := start(t, cfg)
	advance(10*time.Second, time.Second)
	if _, acc := recv.counts(); len(acc) != 0 || c.Status().Leader {
		t.Fatalf("accepted %v before the retry, c leads %v: want none (the leader waits 2 min to retry; c does not lead)", acc, c.Status().Leader)
	}

	// The leader's session ends: it stops at once, another takes over
	// within a few retry periods and delivers what is pending.
	killLeaderSession(t, url)
	var next *server.Server
	eventually("takeover", func() bool {
		if a.Status().Leader {
			return false
		}
		for _, s := range []*server.Server{b, c} {
			if s.Status().Leader {
				next = s
			}
		}
		return next != nil
	})
	if b.Status().Leader && c.Status().Leader {
		t.Fatal("b and c both lead")
	}
	eventually("the new leader delivers the pending alerts", func() bool {
		_, acc := recv.counts()
		return len(acc) == len(first)
	})

	// $2 of $2, applied by the old leader, now a follower: the new leader
	// fires the thresholds crossed.
	aa := tu.Connect(t, tu.Dial(t, a.Addr().String()), "node-1", "boot")
	aa.MustAck(tu.Batch(2, 1, []*trainmeterv1.RunWindow{tu.Window("r", 1, 10, 1)}))
	eventually("the new leader fires the next thresholds", func() bool { return len(stored()) > len(first) })
	// Past every retry (2 min): each alert accepted exactly once.
	advance(3*time.Minute+budget.FleetReload, time.Second)
	eventually("every alert delivered", func() bool { _, acc := recv.counts(); return len(acc) == len(stored()) })
	advance(3*time.Minute, time.Second)
	time.Sleep(200 * time.Millisecond)
	posts, acc := recv.counts()
	for _, id := range stored() {
		if acc[id] != 1 {
			t.Errorf("alert %s accepted %d times (%d POSTs), want once", id, acc[id], posts[id])
		}
	}
	if len(acc) != len(stored()) {
		t.Errorf("accepted %v, stored %v", acc, stored())
	}
}

// killLeaderSession ends the database session holding the leader lock, as
// the death of its collector does.
func killLeaderSession(t *testing.T, url string) {
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

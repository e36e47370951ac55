package alert

import (
	"context"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/clock"
)

// TestWebhookFleetSendersOnTheLeaderOnly: two collectors' senders over one
// store. The follower's (not started) records an alert pending without
// POSTing it; the leader's picks it up at its next Rescan and delivers it
// once, however often it rescans; stopped and started again (a lost and
// regained lead), it does not send it again.
func TestWebhookFleetSendersOnTheLeaderOnly(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	r := newReceiver(t)
	clk := clock.NewFake(time.Unix(0, 0))
	cfg := fast
	cfg.URLs, cfg.Clock, cfg.Rescan = []string{r.srv.URL}, clk, 2*time.Second
	follower, lead := NewWebhooks(cfg, st, quiet()), NewWebhooks(cfg, st, quiet())
	start(t, lead)
	defer shutdown(t, lead)
	follower.Alert(context.Background(), Alert{ID: "f1"})
	if p, _ := r.counts(); p != 0 || follower.Busy() != 0 {
		t.Fatalf("the follower POSTed %d (busy %d)", p, follower.Busy())
	}
	for range 5 {
		clk.Advance(2 * time.Second)
	}
	testkit.Eventually(t, "the leader delivers the follower's alert", func() bool { _, n := r.counts(); return n == 1 })
	testkit.Eventually(t, "the leader idle", func() bool { return lead.Busy() == 0 })
	shutdown(t, lead)
	start(t, lead)
	for range 5 {
		clk.Advance(2 * time.Second)
	}
	lead.Alert(context.Background(), Alert{ID: "l1"})
	testkit.Eventually(t, "the leader's own alert", func() bool { _, n := r.counts(); return n == 2 })
	if p, n := r.counts(); p != 2 || n != 2 {
		t.Errorf("%d POSTs, %d accepted: want each alert once", p, n)
	}
}

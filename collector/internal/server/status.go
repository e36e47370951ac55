package server

import (
	"fmt"
	"net"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/ingest"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/carbonwatch"
	"github.com/trainmeter/trainmeter/pkg/selfmetrics"
)

// Status is the collector's self-observability document (GET /status).
type Status struct {
	UptimeS  float64  `json:"uptime_s"`
	Healthy  bool     `json:"healthy"`
	Problems []string `json:"problems"`
	// Leader: this collector leads the collectors sharing its store and
	// runs the fleet-wide work (webhooks, budget alerts, price fetches);
	// always true on a store of its own.
	Leader bool         `json:"leader"`
	Ingest ingest.Stats `json:"ingest"`
	Alerts AlertStatus  `json:"alerts"`
	// Carbon: the live carbon source's fetches (absent without one).
	Carbon *carbonwatch.Stats `json:"carbon,omitempty"`
}

// AlertStatus is where budget evaluation and alert delivery stand.
type AlertStatus struct {
	// BudgetEvaluations: budget evaluations ended since the collector
	// started.
	BudgetEvaluations uint64 `json:"budget_evaluations"`
	// WebhooksBusy: alerts queued or being delivered to webhooks (retries
	// included); 0 when every alert so far was delivered or given up.
	WebhooksBusy int `json:"webhooks_busy"`
}

// Status returns the collector's self-metrics and health; the zero Status
// (unhealthy) before Start.
func (s *Server) Status() Status {
	s.mu.Lock()
	ing, started, stopped, t0, budgets, webhooks, carbon, el := s.ingest, s.started, s.stopped, s.startedAt, s.budgets, s.webhooks, s.carbon, s.elector
	s.mu.Unlock()
	st := Status{Problems: []string{}}
	switch {
	case !started:
		st.Problems = append(st.Problems, "not started")
		return st
	case stopped:
		st.Problems = append(st.Problems, "shutting down")
	}
	st.UptimeS = s.cfg.Clock.Now().Sub(t0).Seconds()
	st.Leader = el.Leading()
	st.Ingest = ing.Stats()
	st.Alerts = AlertStatus{BudgetEvaluations: budgets.Evaluations(), WebhooksBusy: webhooks.Busy()}
	if carbon != nil {
		cs := carbon.Stats()
		st.Carbon = &cs
	}
	if st.Ingest.StoreFailing {
		st.Problems = append(st.Problems, fmt.Sprintf("store writes failing since %s (%d errors)",
			st.Ingest.LastStoreError.Format(time.RFC3339), st.Ingest.StoreErrors))
	}
	st.Healthy = len(st.Problems) == 0
	return st
}

// StatusAddr is the status listener's address, nil when it is off.
func (s *Server) StatusAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.statusLn == nil {
		return nil
	}
	return s.statusLn.Addr()
}

// startStatus serves GET /healthz and GET /status on cfg.StatusListen (if
// set). Called with s.mu held.
func (s *Server) startStatus() error {
	s.startedAt = s.cfg.Clock.Now()
	if s.cfg.StatusListen == "" {
		return nil
	}
	srv, ln, err := selfmetrics.Serve(s.cfg.StatusListen, selfmetrics.Handler(s.Status, func(st Status) (bool, []string) {
		return st.Healthy, st.Problems
	}), s.log)
	if err != nil {
		return err
	}
	s.statusSrv, s.statusLn = srv, ln
	return nil
}

// stopStatus closes the status endpoint (called last in Shutdown).
func (s *Server) stopStatus() {
	if s.statusSrv != nil {
		_ = s.statusSrv.Close()
	}
}

// logSummary logs the one-line status summary every interval until stop.
func (s *Server) logSummary(interval time.Duration, stop <-chan struct{}) {
	t := s.cfg.Clock.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C():
		}
		st := s.Status().Ingest
		s.log.Info("collector status", "agents", st.ConnectedAgents, "applied", st.Applied, "duplicate", st.Duplicate,
			"rejected", st.Rejected, "seq_gaps", st.SeqGaps, "store_write_p99_ms", st.StoreWriteP99Ms, "store_errors", st.StoreErrors)
	}
}

package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/ingest"
)

// Status is the collector's self-observability document (GET /status).
type Status struct {
	UptimeS  float64      `json:"uptime_s"`
	Healthy  bool         `json:"healthy"`
	Problems []string     `json:"problems"`
	Ingest   ingest.Stats `json:"ingest"`
}

// Status returns the collector's self-metrics and health; the zero Status
// (unhealthy) before Start.
func (s *Server) Status() Status {
	s.mu.Lock()
	ing, started, stopped, t0 := s.ingest, s.started, s.stopped, s.startedAt
	s.mu.Unlock()
	st := Status{Problems: []string{}}
	switch {
	case !started:
		st.Problems = append(st.Problems, "not started")
		return st
	case stopped:
		st.Problems = append(st.Problems, "shutting down")
	}
	st.UptimeS = time.Since(t0).Seconds()
	st.Ingest = ing.Stats()
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
	s.startedAt = time.Now()
	if s.cfg.StatusListen == "" {
		return nil
	}
	ln, err := net.Listen("tcp", s.cfg.StatusListen)
	if err != nil {
		return fmt.Errorf("status listener on %s: %w", s.cfg.StatusListen, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		st := s.Status()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !st.Healthy {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, strings.Join(st.Problems, "\n"))
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		b, err := json.MarshalIndent(s.Status(), "", "  ")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(b, '\n'))
	})
	s.statusLn = ln
	s.statusSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := s.statusSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("status server", "err", err)
		}
	}()
	s.log.Info("status endpoint listening", "addr", ln.Addr().String())
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
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		st := s.Status().Ingest
		s.log.Info("collector status", "agents", st.ConnectedAgents, "applied", st.Applied, "duplicate", st.Duplicate,
			"rejected", st.Rejected, "seq_gaps", st.SeqGaps, "store_write_p99_ms", st.StoreWriteP99Ms, "store_errors", st.StoreErrors)
	}
}

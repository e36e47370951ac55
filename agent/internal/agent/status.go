package agent

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainersock"
	"github.com/trainmeter/trainmeter/agent/internal/uplink"
	"github.com/trainmeter/trainmeter/internal/plural"
	"github.com/trainmeter/trainmeter/pkg/gpu"
	"github.com/trainmeter/trainmeter/pkg/selfmetrics"
)

// Health thresholds of GET /healthz.
const (
	// HealthMaxReadAge: unhealthy when no GPU read has succeeded for this long.
	HealthMaxReadAge = 5 * time.Second
	// HealthMaxUnreachable: unhealthy when the collector has been unreachable
	// for this long (batches wait in the uplink meanwhile).
	HealthMaxUnreachable = 60 * time.Second
	// jitterTicks is how many recent ticks the jitter quantiles cover
	// (about 51 s at 50 ms).
	jitterTicks = 1024
	// summaryEvery is the period of the one-line info summary in the log.
	summaryEvery = 60 * time.Second
)

// selfStats are the agent's own counters. The sampling loop updates them
// with atomics only (no locks, no allocation); status requests read them.
type selfStats struct {
	started      time.Time
	ticks        atomic.Uint64 // sampling ticks handled
	samplesTaken atomic.Uint64 // per-GPU samples read without error
	readFailures atomic.Uint64 // ticks where the backend or any GPU read failed
	lateTicks    atomic.Uint64 // ticks that came more than one period late
	skippedTicks atomic.Uint64 // periods with no tick at all (the ticker dropped them)

	lastTick      atomic.Int64   // unix ns of the previous tick
	lastGoodRead  atomic.Int64   // unix ns of the last tick with at least one GPU read
	lastConnected []atomic.Int64 // unix ns when the i-th collector was last seen connected
	lastSummary   atomic.Int64   // unix ns of the last summary log line

	jitter *selfmetrics.Ring // |tick gap − interval| of the last jitterTicks ticks
}

func newSelfStats(now time.Time) *selfStats {
	s := &selfStats{started: now, jitter: selfmetrics.NewRing(jitterTicks)}
	// A fresh agent is healthy until the thresholds pass without a success.
	s.lastGoodRead.Store(now.UnixNano())
	s.lastSummary.Store(now.UnixNano())
	return s
}

// watchCollectors starts the reachability clocks of n collectors at now.
func (s *selfStats) watchCollectors(n int, now time.Time) {
	s.lastConnected = make([]atomic.Int64, n)
	for i := range s.lastConnected {
		s.lastConnected[i].Store(now.UnixNano())
	}
}

// tick records one sampling tick. It must not allocate: it runs every 50 ms.
func (s *selfStats) tick(now time.Time, interval time.Duration, samples []gpu.Sample, readErr error) {
	s.ticks.Add(1)
	ns := now.UnixNano()
	if prev := s.lastTick.Swap(ns); prev != 0 {
		gap := time.Duration(ns - prev)
		s.jitter.Observe(max(gap-interval, interval-gap))
		if gap > 2*interval {
			s.lateTicks.Add(1)
			s.skippedTicks.Add(uint64(gap/interval) - 1)
		}
	}
	ok, failed := 0, readErr != nil
	if readErr == nil {
		for i := range samples {
			if samples[i].Err != nil {
				failed = true
			} else {
				ok++
			}
		}
	}
	if failed {
		s.readFailures.Add(1)
	}
	if ok > 0 || (readErr == nil && len(samples) == 0) {
		s.samplesTaken.Add(uint64(ok))
		s.lastGoodRead.Store(ns)
	}
}

// Status is the agent's self-observability document, served as JSON by
// GET /status. Counters are totals since the agent started.
type Status struct {
	Node     string         `json:"node"`
	Version  string         `json:"version"`
	UptimeS  float64        `json:"uptime_s"`
	Healthy  bool           `json:"healthy"`
	Problems []string       `json:"problems"`
	Sampling SamplingStatus `json:"sampling"`
	Uplink   UplinkStatus   `json:"uplink"`
	// Collectors has one entry per collector of --collector (two for a pair).
	Collectors []CollectorStatus `json:"collectors"`
	Socket     SocketStatus      `json:"socket"`
	// ActiveRuns are the runs the ledger has open (ended ones until their
	// last window is out).
	ActiveRuns int              `json:"active_runs"`
	HostEnergy HostEnergyStatus `json:"host_energy"`
}

// HostEnergyStatus says whether the node's RAPL counters are read.
type HostEnergyStatus struct {
	// Status is "ok: N socket(s), package and dram", "permission denied:
	// ...", "no RAPL counters: ...", "error: ...".
	Status string `json:"status"`
	Reads  uint64 `json:"reads"` // reads of every package and dram counter
}

// SamplingStatus describes the 50 ms GPU sampling loop.
type SamplingStatus struct {
	IntervalMs   float64 `json:"interval_ms"`
	GPUs         int     `json:"gpus"`
	Ticks        uint64  `json:"ticks"`
	SamplesTaken uint64  `json:"samples_taken"`
	// SamplesMissed = ReadFailures + SkippedTicks: ticks whose GPU read failed
	// plus sampling periods that had no tick because the loop ran late.
	SamplesMissed uint64 `json:"samples_missed"`
	ReadFailures  uint64 `json:"read_failures"`
	// GarbledReadings: GPU readings dropped as ones no GPU gives (NaN,
	// negative, an all-ones value, a counter leap); each counts as missing.
	GarbledReadings uint64  `json:"garbled_readings"`
	LateTicks       uint64  `json:"late_ticks"`
	SkippedTicks    uint64  `json:"skipped_ticks"`
	JitterP50Ms     float64 `json:"tick_jitter_p50_ms"`
	JitterP99Ms     float64 `json:"tick_jitter_p99_ms"`
	JitterMaxMs     float64 `json:"tick_jitter_max_ms"`
	JitterTicks     int     `json:"tick_jitter_window"`
	LastGoodReadS   float64 `json:"last_good_read_age_s"`
}

// CollectorStatus is one collector's uplink.
type CollectorStatus struct {
	Collector    string  `json:"collector"`
	Connected    bool    `json:"connected"`
	Connects     uint64  `json:"connects"`
	UnreachableS float64 `json:"unreachable_s"` // 0 when connected
	Sent         uint64  `json:"batches_sent"`
	Acked        uint64  `json:"batches_acked"`
	Rejected     uint64  `json:"batches_rejected"`
	Pending      int     `json:"batches_pending"` // spooled batches this collector has not acked
}

func collectorStatus(addr string, s uplink.Stats) CollectorStatus {
	return CollectorStatus{Collector: addr, Connected: s.Connected, Connects: s.Connects,
		Sent: s.Sent, Acked: s.Acked, Rejected: s.Rejected, Pending: s.Pending}
}

// UplinkStatus mirrors uplink.Stats over all collectors: counts are summed,
// Connected is whether every collector is, UnreachableS the longest any has
// been unreachable, Pending the batches not yet acked by every collector.
// Mode is collector_mode; in mode any, InUse is the collector of the list
// the batches go to now (Collectors has one entry, that one).
type UplinkStatus struct {
	CollectorStatus
	Mode       string `json:"collector_mode"`
	InUse      string `json:"collector_in_use,omitempty"`
	Enqueued   uint64 `json:"batches_enqueued"`
	Dropped    uint64 `json:"batches_dropped"`
	SpoolBytes int64  `json:"spool_bytes"` // the on-disk spool's size
}

// SocketStatus is the trainer socket's counters.
type SocketStatus struct {
	trainersock.Stats
	// RefusedEvents counts the events of trainers whose run the collector
	// refused (an id that had ended on every node), dropped without an
	// answer each (ledger.Refuse).
	RefusedEvents uint64 `json:"refused_run_events"`
}

// Status returns the agent's self-metrics and health now.
func (a *Agent) Status() Status {
	now := a.clock.Now()
	s := a.self
	q := s.jitter.Quantiles(0.5, 0.99, 1)
	up := a.up.Stats()
	st := Status{
		Node:    a.cfg.Node,
		Version: Version,
		UptimeS: now.Sub(s.started).Seconds(),
		Sampling: SamplingStatus{
			IntervalMs:      selfmetrics.Millis(a.cfg.Interval),
			GPUs:            len(a.backend.Devices()),
			Ticks:           s.ticks.Load(),
			SamplesTaken:    s.samplesTaken.Load(),
			ReadFailures:    s.readFailures.Load(),
			GarbledReadings: a.ledger.GarbledReadings(),
			LateTicks:       s.lateTicks.Load(),
			SkippedTicks:    s.skippedTicks.Load(),
			JitterP50Ms:     selfmetrics.Millis(q[0]),
			JitterP99Ms:     selfmetrics.Millis(q[1]),
			JitterMaxMs:     selfmetrics.Millis(q[2]),
			JitterTicks:     int(min(s.jitter.Count(), jitterTicks)),
			LastGoodReadS:   now.Sub(time.Unix(0, s.lastGoodRead.Load())).Seconds(),
		},
		Uplink: UplinkStatus{CollectorStatus: collectorStatus(a.cfg.Collector, up), Mode: a.cfg.CollectorMode,
			Enqueued: up.Enqueued, Dropped: up.Dropped, SpoolBytes: up.SpoolBytes},
		Socket:     SocketStatus{Stats: a.sock.Stats(), RefusedEvents: a.ledger.RefusedEvents()},
		ActiveRuns: len(a.ledger.ActiveRuns()),
	}
	st.HostEnergy.Status, st.HostEnergy.Reads = a.hostEnergyStatus()
	st.Sampling.SamplesMissed = st.Sampling.ReadFailures + st.Sampling.SkippedTicks
	st.Problems = []string{}
	if age := now.Sub(time.Unix(0, s.lastGoodRead.Load())); age > HealthMaxReadAge {
		st.Problems = append(st.Problems, fmt.Sprintf("no GPU read succeeded for %s (limit %s)", age.Round(time.Millisecond), HealthMaxReadAge))
	}
	if a.cfg.AnyCollector() {
		st.Uplink.InUse = a.up.Uplinks()[0].Address()
	}
	st.Collectors = []CollectorStatus{}
	for i, u := range a.up.Uplinks() {
		cs := collectorStatus(u.Address(), u.Stats())
		if cs.Connected {
			s.lastConnected[i].Store(now.UnixNano())
		} else {
			cs.UnreachableS = now.Sub(time.Unix(0, s.lastConnected[i].Load())).Seconds()
		}
		st.Uplink.UnreachableS = max(st.Uplink.UnreachableS, cs.UnreachableS)
		if d := time.Duration(cs.UnreachableS * float64(time.Second)); d > HealthMaxUnreachable {
			st.Problems = append(st.Problems, fmt.Sprintf("collector %s unreachable for %s (limit %s); %s pending",
				cs.Collector, d.Round(time.Second), HealthMaxUnreachable, plural.N(cs.Pending, "batch")))
		}
		st.Collectors = append(st.Collectors, cs)
	}
	st.Healthy = len(st.Problems) == 0
	return st
}

// afterBatches runs on the sampling loop once per closed window (about once a
// second, not every tick): it notes whether the collector is reachable and
// logs the periodic summary.
func (a *Agent) afterBatches(now time.Time) {
	s := a.self
	for i, u := range a.up.Uplinks() {
		if u.Connected() {
			s.lastConnected[i].Store(now.UnixNano())
		}
	}
	if now.Sub(time.Unix(0, s.lastSummary.Load())) < summaryEvery {
		return
	}
	s.lastSummary.Store(now.UnixNano())
	up := a.up.Stats()
	q := s.jitter.Quantiles(0.99)
	a.log.Info("agent status",
		"samples", s.samplesTaken.Load(),
		"missed", s.readFailures.Load()+s.skippedTicks.Load(),
		"jitter_p99_ms", selfmetrics.Millis(q[0]),
		"batches_pending", up.Pending, "batches_acked", up.Acked, "batches_dropped", up.Dropped,
		"batches_rejected", up.Rejected, "spool_bytes", up.SpoolBytes, "connected", up.Connected)
}

// startStatus serves GET /healthz and GET /status on cfg.StatusListen, if set.
func (a *Agent) startStatus() error {
	if a.cfg.StatusListen == "" {
		return nil
	}
	srv, ln, err := selfmetrics.Serve(a.cfg.StatusListen, selfmetrics.Handler(a.Status, func(st Status) (bool, []string) {
		return st.Healthy, st.Problems
	}), a.log)
	if err != nil {
		return err
	}
	a.statusSrv, a.statusLn = srv, ln
	return nil
}

// StatusAddr is the status listener's address, nil when it is off.
func (a *Agent) StatusAddr() net.Addr {
	if a.statusLn == nil {
		return nil
	}
	return a.statusLn.Addr()
}

func (a *Agent) stopStatus(ctx context.Context) {
	if a.statusSrv != nil {
		if err := a.statusSrv.Shutdown(ctx); err != nil {
			a.statusSrv.Close()
		}
	}
}

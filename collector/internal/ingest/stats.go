package ingest

import (
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/pkg/selfmetrics"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

// Time bounds on a batch's window, relative to the collector's clock.
// MaxBatchAge is long: an agent replays its spool after an outage, and
// days-old batches are legitimate. MaxBatchFuture is short: only clock skew
// puts a window in the future.
const (
	MaxBatchFuture = 10 * time.Minute
	MaxBatchAge    = 30 * 24 * time.Hour
)

// latencyWindow is how many recent store writes the latency quantiles cover.
const latencyWindow = 1024

// SetClock sets the clock used for the batch time bounds and last-seen
// times (the wall clock by default). Call it before serving.
func (s *Server) SetClock(clk clock.Clock) {
	if clk != nil {
		s.clock = clk
	}
}

// CheckBatchTime rejects a batch whose window lies more than MaxBatchFuture
// ahead of now or ended more than MaxBatchAge before now.
func CheckBatchTime(b *trainmeterv1.Batch, now time.Time) error {
	start, end := b.GetWindowStart().AsTime(), b.GetWindowEnd().AsTime()
	if d := start.Sub(now); d > MaxBatchFuture {
		return fmt.Errorf("window_start %s is %s ahead of the collector's clock (limit %s): check the agent's clock (NTP)",
			start.Format(time.RFC3339), d.Round(time.Second), MaxBatchFuture)
	}
	if d := now.Sub(end); d > MaxBatchAge {
		return fmt.Errorf("window_end %s is %s old, more than %s: too old to store",
			end.Format(time.RFC3339), d.Round(time.Second), MaxBatchAge)
	}
	return nil
}

// counters are the ingest server's self-metrics (newCounters).
type counters struct {
	streams, applied, duplicate, rejected, rejectedTime, storeErrors, seqGaps, seqMissing atomic.Uint64
	refusedStarts                                                                         atomic.Uint64
	lastStoreErr                                                                          atomic.Int64 // unix ns of the last failed store write
	lastStoreOK                                                                           atomic.Int64 // unix ns of the last successful one

	lat *selfmetrics.Ring

	gapMu sync.Mutex
	gaps  map[string]*gapState // by node

	refusedRecords atomic.Uint64
	dropMu         sync.Mutex
	drops          map[string]*dropState // by node
}

// dropState is a node's records refused by the store (not started there,
// ended there, implausible energy, over a limit) and its log throttle.
type dropState struct {
	records uint64
	// unlogged: records refused since the last log line; loggedAt: when.
	unlogged uint64
	loggedAt time.Time
}

// dropLogEvery: a node's refused records are logged at most this often,
// with the count since the line before.
const dropLogEvery = 10 * time.Second

// noteDropped counts the records of a batch the store refused, per node,
// and logs them at most every dropLogEvery per node.
func (s *Server) noteDropped(log *slog.Logger, node string, a storage.Applied) {
	var n uint64
	var first *storage.Refusal
	for _, list := range [][]storage.Refusal{a.Dropped, a.Refused} {
		for i := range list {
			n += uint64(list[i].Records)
			if first == nil && list[i].Records > 0 {
				first = &list[i]
			}
		}
	}
	if n == 0 {
		return
	}
	c := &s.counters
	c.refusedRecords.Add(n)
	now := s.clock.Now()
	c.dropMu.Lock()
	d := c.drops[node]
	if d == nil {
		d = &dropState{}
		c.drops[node] = d
	}
	d.records += n
	d.unlogged += n
	logIt := d.loggedAt.IsZero() || now.Sub(d.loggedAt) >= dropLogEvery
	count := d.unlogged
	if logIt {
		d.unlogged, d.loggedAt = 0, now
	}
	c.dropMu.Unlock()
	if logIt {
		log.Warn("records refused: the node may not send them (docs/security.md); dropped, the rest of the batch applied",
			"refused_records", count, "run_id", first.RunID, "reason", first.Reason, "refused_records_total", d.records)
	}
}

type gapState struct {
	boot    string
	maxSeq  uint64 // highest seq answered (acked or rejected) for boot
	gaps    uint64 // gap events: a seq more than one past maxSeq
	missing uint64 // seqs skipped over by those gaps
}

func newCounters() counters {
	return counters{lat: selfmetrics.NewRing(latencyWindow), gaps: map[string]*gapState{}, drops: map[string]*dropState{}}
}

// answered notes that seq of node/boot got an ack or a reject and reports
// how many seqs it skipped over (0: no gap). A batch below the highest seq
// (a resend after a reconnect) is not a gap; neither is the first batch the
// collector sees from a boot, since it cannot know what came before.
func (c *counters) answered(node, boot string, seq uint64) uint64 {
	c.gapMu.Lock()
	defer c.gapMu.Unlock()
	g := c.gaps[node]
	if g == nil {
		g = &gapState{}
		c.gaps[node] = g
	}
	if g.boot != boot {
		g.boot, g.maxSeq = boot, seq
		return 0
	}
	var skipped uint64
	if seq > g.maxSeq+1 {
		skipped = seq - g.maxSeq - 1
		g.gaps++
		g.missing += skipped
		c.seqGaps.Add(1)
		c.seqMissing.Add(skipped)
	}
	g.maxSeq = max(g.maxSeq, seq)
	return skipped
}

// Stats are the ingest server's counters since start.
type Stats struct {
	Streams         uint64 `json:"streams_opened"`
	ConnectedAgents int    `json:"connected_agents"`
	KnownNodes      int    `json:"known_nodes"`
	Applied         uint64 `json:"batches_applied"`
	Duplicate       uint64 `json:"batches_duplicate"`
	Rejected        uint64 `json:"batches_rejected"`
	// RejectedTime counts the rejects for the time bounds (part of Rejected).
	RejectedTime uint64 `json:"batches_rejected_time"`
	StoreErrors  uint64 `json:"store_errors"`
	// RefusedStarts counts the refusals sent to agents (StartRefused).
	RefusedStarts uint64 `json:"refused_starts"`
	// RefusedRecords counts the records naming a run that the store
	// dropped from batches it applied (docs/security.md), also by node.
	RefusedRecords        uint64            `json:"refused_records"`
	RefusedRecordsPerNode map[string]uint64 `json:"refused_records_per_node"`
	// SeqGaps counts batches more than one past the highest seq seen from
	// their node's boot; SeqMissing the seqs skipped over.
	SeqGaps        uint64            `json:"seq_gaps"`
	SeqMissing     uint64            `json:"seq_missing"`
	SeqGapsPerNode map[string]uint64 `json:"seq_gaps_per_node"`
	// Store write (ApplyBatch) latency over the last writes, in ms.
	StoreWriteP50Ms float64 `json:"store_write_p50_ms"`
	StoreWriteP99Ms float64 `json:"store_write_p99_ms"`
	StoreWriteMaxMs float64 `json:"store_write_max_ms"`
	StoreWrites     uint64  `json:"store_writes"`
	// LastStoreError is when a store write last failed (zero: never), and
	// StoreFailing whether no write has succeeded since.
	LastStoreError time.Time `json:"last_store_error,omitzero"`
	StoreFailing   bool      `json:"store_failing"`
}

// Stats returns a snapshot of the self-metrics.
func (s *Server) Stats() Stats {
	c := &s.counters
	q := c.lat.Quantiles(0.5, 0.99, 1)
	st := Stats{
		Streams: c.streams.Load(), Applied: c.applied.Load(), Duplicate: c.duplicate.Load(),
		Rejected: c.rejected.Load(), RejectedTime: c.rejectedTime.Load(), StoreErrors: c.storeErrors.Load(),
		RefusedStarts: c.refusedStarts.Load(), RefusedRecords: c.refusedRecords.Load(), RefusedRecordsPerNode: map[string]uint64{},
		SeqGaps: c.seqGaps.Load(), SeqMissing: c.seqMissing.Load(), SeqGapsPerNode: map[string]uint64{},
		StoreWriteP50Ms: selfmetrics.Millis(q[0]), StoreWriteP99Ms: selfmetrics.Millis(q[1]),
		StoreWriteMaxMs: selfmetrics.Millis(q[2]), StoreWrites: c.lat.Count(),
	}
	if e := c.lastStoreErr.Load(); e != 0 {
		st.LastStoreError = time.Unix(0, e).UTC()
		st.StoreFailing = e > c.lastStoreOK.Load()
	}
	c.gapMu.Lock()
	for n, g := range c.gaps {
		if g.gaps > 0 {
			st.SeqGapsPerNode[n] = g.gaps
		}
	}
	c.gapMu.Unlock()
	c.dropMu.Lock()
	for n, d := range c.drops {
		st.RefusedRecordsPerNode[n] = d.records
	}
	c.dropMu.Unlock()
	s.mu.Lock()
	st.KnownNodes = len(s.nodes)
	for _, n := range s.nodes {
		if len(n.sessions) > 0 {
			st.ConnectedAgents++
		}
	}
	s.mu.Unlock()
	return st
}

// ConnectedNodes lists the nodes with an open stream, sorted.
func (s *Server) ConnectedNodes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name, n := range s.nodes {
		if len(n.sessions) > 0 {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

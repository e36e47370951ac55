package fold

import (
	"fmt"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
)

// Bounds per node (docs/security.md, "What a node's token can change") on
// the runs a node can create and keep open; records of runs it did not
// start are refused anyway (authorize.go). A store keeps, per node, the
// runs live on it and its new-run bucket, and gives them to a Live for
// each transaction; Admit decides on the Live and the store writes back
// what it changed when the transaction commits.

// Limits bounds what one node may start. Zero: no bound.
type Limits struct {
	// MaxLiveRunsPerNode bounds the runs live on one node at once: a start
	// that would make one more live there is refused.
	MaxLiveRunsPerNode int
	// MaxNewRunsPerMinute bounds the runs one node creates (starts of run
	// ids no node had started) a minute: a token bucket of this size,
	// refilled at this rate.
	MaxNewRunsPerMinute int
}

// Validate checks the limits.
func (l Limits) Validate() error {
	if l.MaxLiveRunsPerNode < 0 || l.MaxNewRunsPerMinute < 0 {
		return fmt.Errorf("store: limits must be >= 0 (live runs %d, new runs a minute %d)", l.MaxLiveRunsPerNode, l.MaxNewRunsPerMinute)
	}
	return nil
}

// Bucket is a node's new-run bucket: Tokens at At. The zero Bucket is full.
type Bucket struct {
	Tokens float64
	At     time.Time
}

// Available is what the bucket holds at now (limit when it is full).
func (b Bucket) Available(now time.Time, limit int) float64 {
	if b.At.IsZero() {
		return float64(limit)
	}
	refill := now.Sub(b.At).Minutes() * float64(limit)
	return min(float64(limit), b.Tokens+max(refill, 0))
}

// Take is the bucket after n were taken from it at now (the zero Bucket
// when it is full again).
func (b Bucket) Take(now time.Time, limit, n int) Bucket {
	left := b.Available(now, limit) - float64(n)
	if left >= float64(limit) {
		return Bucket{}
	}
	return Bucket{Tokens: left, At: now}
}

// LiveBase is what a store has committed: the runs live on a node and its
// bucket.
type LiveBase interface {
	IsLive(node, run string) bool
	LiveRuns(node string) int
	Bucket(node string) Bucket
}

// LiveKey is a (node, run) pair.
type LiveKey struct{ Node, Run string }

// Live is one transaction's view of the nodes' live runs and buckets: the
// store's committed base and the transaction's changes, which the store
// writes back (Changed, Buckets) when it commits.
type Live struct {
	base   LiveBase
	limits Limits
	now    time.Time
	// Changed: runs that went live or stopped being live on a node.
	Changed map[LiveKey]bool
	delta   map[string]int // net change of live runs per node
	newRuns map[string]int // new runs each node started
}

// NewLive is a transaction's Live over base at now.
func NewLive(base LiveBase, limits Limits, now time.Time) *Live {
	return &Live{base: base, limits: limits, now: now, Changed: map[LiveKey]bool{}, delta: map[string]int{}, newRuns: map[string]int{}}
}

// LiveOn reports whether run is live on node as the transaction has it.
func (l *Live) LiveOn(node, run string) bool {
	if v, ok := l.Changed[LiveKey{node, run}]; ok {
		return v
	}
	return l.base.IsLive(node, run)
}

// SetLive notes run live (or not) on node.
func (l *Live) SetLive(node, run string, live bool) {
	if l.LiveOn(node, run) == live {
		return
	}
	if live {
		l.delta[node]++
	} else {
		l.delta[node]--
	}
	l.Changed[LiveKey{node, run}] = live
}

// NoteLive sets the liveness of node's runs from their aggregates after a
// batch of node folded (state: nil for a run the transaction does not
// write).
func (l *Live) NoteLive(node string, runs []string, state func(run string) *aggregate.State) {
	for _, r := range runs {
		if st := state(r); st != nil {
			l.SetLive(node, r, st.LiveOn(node))
		}
	}
}

// NewRun counts a new run node started.
func (l *Live) NewRun(node string) { l.newRuns[node]++ }

// CapRefusal is why a start of run by node that would make it live there
// (a new run when isNew) is refused by the limits, "" when it is not.
func (l *Live) CapRefusal(node, run string, isNew bool) string {
	if n := l.limits.MaxLiveRunsPerNode; n > 0 && l.base.LiveRuns(node)+l.delta[node] >= n {
		return fmt.Sprintf("run_start: run %q refused: node %s already has %d live runs, the collector's limit "+
			"(trainmeter serve --max-live-runs-per-node); end a run first", run, node, n)
	}
	if n := l.limits.MaxNewRunsPerMinute; n > 0 && isNew && l.base.Bucket(node).Available(l.now, n)-float64(l.newRuns[node]) < 1 {
		return fmt.Sprintf("run_start: run %q refused: node %s is over the collector's limit of %d new runs a minute "+
			"(trainmeter serve --max-new-runs-per-minute); start it again later", run, node, n)
	}
	return ""
}

// Buckets are the buckets of the nodes that started new runs, after the
// transaction took them.
func (l *Live) Buckets() map[string]Bucket {
	n := l.limits.MaxNewRunsPerMinute
	if n == 0 {
		return nil
	}
	out := make(map[string]Bucket, len(l.newRuns))
	for node, used := range l.newRuns {
		out[node] = l.base.Bucket(node).Take(l.now, n, used)
	}
	return out
}

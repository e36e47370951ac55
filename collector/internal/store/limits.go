package store

import (
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
)

// Bounds per node (docs/security.md, "What a node's token can change") on
// the runs a node can create and keep open; records of runs it did not
// start are refused anyway (authorize.go).

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

// liveIndex is, per node, the runs live on it and its new-run bucket, as
// the committed aggregates have them. Only the committer (and DeleteRun,
// both under aggMu) use it.
type liveIndex struct {
	runs    map[string]map[string]struct{} // node → runs live on it
	buckets map[string]*bucket             // node → new-run bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

func newLiveIndex() *liveIndex {
	return &liveIndex{runs: map[string]map[string]struct{}{}, buckets: map[string]*bucket{}}
}

func (x *liveIndex) has(node, run string) bool {
	_, ok := x.runs[node][run]
	return ok
}

func (x *liveIndex) set(node, run string, live bool) {
	m := x.runs[node]
	if !live {
		delete(m, run)
		if len(m) == 0 {
			delete(x.runs, node)
		}
		return
	}
	if m == nil {
		m = map[string]struct{}{}
		x.runs[node] = m
	}
	m[run] = struct{}{}
}

// dropRun forgets a deleted run.
func (x *liveIndex) dropRun(run string) {
	for node := range x.runs {
		x.set(node, run, false)
	}
}

// available is what node's bucket holds at now (max when it is full).
func (x *liveIndex) available(node string, now time.Time, limit int) float64 {
	b := x.buckets[node]
	if b == nil {
		return float64(limit)
	}
	refill := now.Sub(b.at).Minutes() * float64(limit)
	return min(float64(limit), b.tokens+max(refill, 0))
}

// take takes n from node's bucket at now (a full bucket is forgotten).
func (x *liveIndex) take(node string, now time.Time, limit, n int) {
	left := x.available(node, now, limit) - float64(n)
	if left >= float64(limit) {
		delete(x.buckets, node)
		return
	}
	x.buckets[node] = &bucket{tokens: left, at: now}
}

// loadLiveIndex reads which runs are live on which node from every
// aggregate (once, at Open; the committer keeps it after that).
func loadLiveIndex(db *badger.DB) (*liveIndex, error) {
	x := newLiveIndex()
	err := db.View(func(txn *badger.Txn) error {
		return scan(txn, badger.IteratorOptions{Prefix: []byte("a/"), PrefetchSize: 64}, nil, func(k, v []byte) error {
			run := string(k[len("a/"):])
			st, err := aggregate.Unmarshal(v)
			if err != nil {
				return fmt.Errorf("run %q: %w", run, err)
			}
			if st.GetNodesApart() {
				if err := readNodes(txn, run, st); err != nil {
					return err
				}
			}
			for _, node := range st.LiveNodes() {
				x.set(node, run, true)
			}
			return nil
		})
	})
	return x, err
}

// liveKey is a (node, run) pair.
type liveKey struct{ node, run string }

// liveOn reports whether run is live on node as the group has it so far.
func (g *groupAggs) liveOn(node, run string) bool {
	if v, ok := g.live[liveKey{node, run}]; ok {
		return v
	}
	return g.s.live.has(node, run)
}

// setLive notes run live (or not) on node in the group.
func (g *groupAggs) setLive(node, run string, live bool) {
	if g.liveOn(node, run) == live {
		return
	}
	if live {
		g.liveDelta[node]++
	} else {
		g.liveDelta[node]--
	}
	g.live[liveKey{node, run}] = live
}

// noteLive sets the group's view of node's runs from their aggregates
// after a batch of node folded.
func (g *groupAggs) noteLive(node string, runs []string) {
	for _, r := range runs {
		if st := g.state[r]; st != nil {
			g.setLive(node, r, st.LiveOn(node))
		}
	}
}

// capRefusal is why a start of run by node that would make it live there
// (a new run when isNew) is refused by the limits, "" when it is not.
func (g *groupAggs) capRefusal(node, run string, isNew bool) string {
	lim := g.s.limits
	if n := lim.MaxLiveRunsPerNode; n > 0 && len(g.s.live.runs[node])+g.liveDelta[node] >= n {
		return fmt.Sprintf("run_start: run %q refused: node %s already has %d live runs, the collector's limit "+
			"(trainmeter serve --max-live-runs-per-node); end a run first", run, node, n)
	}
	if n := lim.MaxNewRunsPerMinute; n > 0 && isNew && g.s.live.available(node, g.now, n)-float64(g.newRuns[node]) < 1 {
		return fmt.Sprintf("run_start: run %q refused: node %s is over the collector's limit of %d new runs a minute "+
			"(trainmeter serve --max-new-runs-per-minute); start it again later", run, node, n)
	}
	return ""
}

// commitLive applies the group's changes to the index (its commit succeeded).
func (g *groupAggs) commitLive() {
	for k, v := range g.live {
		g.s.live.set(k.node, k.run, v)
	}
	if n := g.s.limits.MaxNewRunsPerMinute; n > 0 {
		for node, used := range g.newRuns {
			g.s.live.take(node, g.now, n, used)
		}
	}
}

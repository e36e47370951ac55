package pgstore

import (
	"sync"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// A node's rollup rows as this process's last group committed them, so
// that the node's next group adds to them without reading them back: at
// one batch a second a node's batches add to the same minute's rows 60
// times, and reading them was a fifth of the statements' time.
//
// The rows are exact only while no other transaction has written them
// since. Every writer of a node's node_rollups rows writes the node's
// row in the same transaction (ingest, either path, and PutHello), and
// every writer of its run_rollups rows writes the node's row or the
// run's row (Reprice, DeleteRun), so the cached rows stand for the
// stored ones exactly when the node's row, and for run rows the run's
// row, still carry the xmin this group's commit gave them: the group
// reads both xmins while locking those rows, at no extra round trip, and
// reads the rows of any key it cannot trust (a miss, another replica's
// or another tool's write, a late batch's minute) in a second pipeline.
// A group takes its nodes' entries out while it runs (a failed or
// concurrent group cannot see rows half added to) and puts back what it
// wrote only once committed.

// rollCache is one node's cached rows.
type rollCache struct {
	nodeX string // the node row's xmin after the commit
	// The node's status after the commit, which the node's next group
	// folds into without decoding the row's again, and what of it the row
	// holds (it may be ahead: statusEvery).
	status *trainmeterv1.NodeStatus
	saved  savedStatus
	runX   map[string]string // each run row's xmin after the commit
	// Every row of these runs' minutes and of these node minutes.
	runDone  map[runMinute]bool
	nodeDone map[int64]bool
	runs     map[runRollKey]*trainmeterv1.RunWindow
	nodes    map[nodeRollKey]*trainmeterv1.Batch
}

type runMinute struct {
	run string
	m   int64
}

// maxCachedNodes bounds the cache; past it, it starts again empty.
const maxCachedNodes = 100_000

type rollCaches struct {
	mu sync.Mutex
	m  map[string]*rollCache
}

// take removes and returns the nodes' entries.
func (c *rollCaches) take(nodes []string) map[string]*rollCache {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]*rollCache{}
	for _, n := range nodes {
		if e := c.m[n]; e != nil {
			out[n] = e
			delete(c.m, n)
		}
	}
	return out
}

// put installs entries of a committed group.
func (c *rollCaches) put(es map[string]*rollCache) {
	if len(es) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m)+len(es) > maxCachedNodes {
		c.m = map[string]*rollCache{}
	}
	for n, e := range es {
		c.m[n] = e
	}
}

// A run's aggregate as this process's last group wrote it, for the run's
// next group to fold into without reading and decoding it again: the
// group's lock on the run's row returns the row's xmin, and the stored
// aggregate only where that is not the one cached (another writer since).
// Taken out while a group runs and put back only after its commit, as the
// rollup rows are.
type cachedState struct {
	x          string // the run row's xmin after the commit
	st         *aggregate.State
	reportedAt time.Time // when this process last wrote the run's report columns
}

// reportEvery is how long a live run's report columns may trail its
// aggregate (group.go).
const reportEvery = 10 * time.Second

// maxCachedRuns bounds the aggregates held; past it, it starts again empty.
const maxCachedRuns = 20_000

type stateCaches struct {
	mu sync.Mutex
	m  map[string]cachedState
}

// take removes and returns the runs' entries.
func (c *stateCaches) take(runs []string) map[string]cachedState {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]cachedState{}
	for _, r := range runs {
		if e, ok := c.m[r]; ok {
			out[r] = e
			delete(c.m, r)
		}
	}
	return out
}

// put installs entries of a committed group.
func (c *stateCaches) put(es map[string]cachedState) {
	if len(es) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m)+len(es) > maxCachedRuns {
		c.m = map[string]cachedState{}
	}
	for r, e := range es {
		c.m[r] = e
	}
}

// groupCache is what a committed group leaves to cache.
type groupCache struct {
	rolls  map[string]*rollCache
	states map[string]cachedState
}

// statusEvery: a node's status row (last seen, last seq) is rewritten at
// most this often while its boot stays the same and its group writes
// nothing else of the node's, as the BadgerDB store does; the collector
// holds the newer status (the node's next group folds into it) and Close
// writes it. ListNodes shows the live streams' newer figures.
const statusEvery = 10 * time.Second

// savedStatus is what of a node's status its row holds.
type savedStatus struct {
	seen time.Time
	boot string
}

// savedOf is what a row holding ns holds.
func savedOf(ns *trainmeterv1.NodeStatus) savedStatus {
	return savedStatus{seen: ns.GetLastSeen().AsTime(), boot: ns.GetBootId()}
}

// due says whether ns is to be written: a new boot, or last seen
// statusEvery past the row's.
func (s savedStatus) due(ns *trainmeterv1.NodeStatus) bool {
	return s.boot != ns.GetBootId() || ns.GetLastSeen().AsTime().Sub(s.seen) >= statusEvery
}

// behind says whether the row holds less than ns.
func (s savedStatus) behind(ns *trainmeterv1.NodeStatus) bool {
	return s.boot != ns.GetBootId() || !ns.GetLastSeen().AsTime().Equal(s.seen)
}

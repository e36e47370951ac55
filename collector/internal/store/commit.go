package store

import (
	"errors"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/fold"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Group commit (docs/benchmarks.md): ApplyBatchResult, holding its node's
// stripe lock, hands its batch to the one committer goroutine, which takes
// every batch waiting (up to maxGroup) into one transaction: each run's
// aggregate is read and written once per group, and the commit is one
// write and one sync. Callers are answered once the commit holding their
// batch is durable.
//
// The committer is the only writer of run aggregates (DeleteRun and
// Reprice exclude it with aggMu), so the decoded aggregates it keeps in
// aggCache are exactly what the database holds. A group that fails as a
// whole is applied again batch by batch, so each caller sees its own
// batch's outcome.

// maxGroup bounds the batches in one transaction (a transaction has a size
// limit; groups far below it keep a failure cheap).
const maxGroup = 256

type applyReq struct {
	sender Sender
	b      *trainmeterv1.Batch
	runs   []string
	raw    []kv                 // encoded by the caller
	rk     []byte               // the batch's r/ key, nil when it has no r/ record
	gone   []fold.DeletedWindow // windows of deleted runs, kept as dw/ records (deleted.go)

	dup     bool
	refused []Refusal           // starts refused, records dropped (refused.go)
	dropped []Refusal           // records the node may not send, dropped (authorize.go)
	applied *trainmeterv1.Batch // the batch less what was dropped; nil: nothing was
	err     error
	done    chan struct{}
}

func (s *Store) committer() {
	defer close(s.committerDone)
	for {
		var first *applyReq
		select {
		case first = <-s.applyCh:
		case <-s.quit:
			return
		}
		group := s.gather(first)
		s.aggMu.Lock()
		s.commits.Add(1)
		s.committedBatches.Add(uint64(len(group)))
		if err := s.commitGroup(group); err != nil {
			for _, r := range group {
				r.dup, r.err = s.applySolo(r)
			}
		}
		s.aggMu.Unlock()
		for _, r := range group {
			close(r.done)
		}
	}
}

// gather forms a group from first and the batches that arrive within the
// commit window after it (window 0: only those already waiting). Batches
// arrive spread over each second, so a few milliseconds of waiting make
// groups of many (docs/benchmarks.md).
func (s *Store) gather(first *applyReq) []*applyReq {
	group := []*applyReq{first}
	var deadline <-chan time.Time
	if s.commitWindow > 0 {
		t := time.NewTimer(s.commitWindow)
		defer t.Stop()
		deadline = t.C
	}
	for len(group) < maxGroup {
		if deadline == nil {
			select {
			case r := <-s.applyCh:
				group = append(group, r)
				continue
			default:
				return group
			}
		}
		select {
		case r := <-s.applyCh:
			group = append(group, r)
		case <-deadline:
			return group
		case <-s.quit:
			return group
		}
	}
	return group
}

// CommitStats counts the groups committed since Open and the batches in
// them (batches per commit is what the commit window buys).
type CommitStats struct{ Commits, Batches uint64 }

// CommitStats returns the counts so far.
func (s *Store) CommitStats() CommitStats {
	return CommitStats{Commits: s.commits.Load(), Batches: s.committedBatches.Load()}
}

// commitGroup applies the group's batches in one transaction.
func (s *Store) commitGroup(group []*applyReq) (err error) {
	txn := s.db.NewTransaction(true)
	defer txn.Discard()
	g := newGroupAggs(s)
	defer func() { g.finish(err) }()
	for _, r := range group {
		if r.dup, err = s.applyTo(txn, g, r); err != nil {
			return err
		}
	}
	if err := g.write(txn); err != nil {
		return err
	}
	return txn.Commit()
}

// applySolo applies one batch in a transaction of its own, retrying on
// conflicts.
func (s *Store) applySolo(req *applyReq) (duplicate bool, err error) {
	for attempt := 0; ; attempt++ {
		err = s.commitGroup([]*applyReq{req})
		if !errors.Is(err, badger.ErrConflict) || attempt >= maxConflictRetries {
			return req.dup && err == nil, err
		}
	}
}

// groupAggs holds the run aggregates and node statuses one transaction
// folds into: read once (from the caches or the database), written once
// when the group is done.
type groupAggs struct {
	s         *Store
	state     map[string]*aggregate.State
	order     []string
	nodes     map[string]*nodeEntry
	nodeOrder []string
	sizes     map[string]int // encoded aggregate sizes, for the cache

	// peeked: aggregates read but not (yet) changed by the group, which
	// are not written back (a refused record never makes an aggregate).
	peeked map[string]*aggregate.State
	// wasLive: runs whose stored aggregate was live when the group took
	// it, so has its live marker (runindex.go).
	wasLive map[string]bool
	// live is the group's view of the live index (limits.go) and its
	// changes to it.
	live *fold.Live
	now  time.Time
}

func newGroupAggs(s *Store) *groupAggs {
	now := s.now()
	return &groupAggs{s: s, state: map[string]*aggregate.State{}, nodes: map[string]*nodeEntry{}, sizes: map[string]int{},
		peeked: map[string]*aggregate.State{}, wasLive: map[string]bool{}, live: fold.NewLive(s.live, s.limits, now), now: now}
}

func (g *groupAggs) get(txn *badger.Txn, run string) (*aggregate.State, error) {
	if st := g.state[run]; st != nil {
		return st, nil
	}
	st, err := g.peek(txn, run)
	if err != nil {
		return nil, err
	}
	if st == nil {
		st = aggregate.New(run)
	} else if !st.Ended() {
		g.wasLive[run] = true
	}
	delete(g.peeked, run)
	g.state[run] = st
	g.order = append(g.order, run)
	return st, nil
}

// peek returns the run's aggregate as the group has it, nil when there is
// none, without making it one the group writes.
func (g *groupAggs) peek(txn *badger.Txn, run string) (*aggregate.State, error) {
	if st := g.state[run]; st != nil {
		return st, nil
	}
	if st, ok := g.peeked[run]; ok {
		return st, nil
	}
	st := g.s.aggs.get(run)
	if st == nil {
		var err error
		st, err = getAgg(txn, run)
		if errors.Is(err, ErrNotFound) {
			st, err = nil, nil
		}
		if err != nil {
			return nil, err
		}
	}
	g.peeked[run] = st
	return st, nil
}

// groupView is the group in a transaction as fold.Admit reads it.
type groupView struct {
	g   *groupAggs
	txn *badger.Txn
	*fold.Live
}

func (v groupView) Peek(run string) (*aggregate.State, error) { return v.g.peek(v.txn, run) }
func (v groupView) Get(run string) (*aggregate.State, error)  { return v.g.get(v.txn, run) }
func (v groupView) Now() time.Time                            { return v.g.now }

func (g *groupAggs) nodeEntry(txn *badger.Txn, node string) (*nodeEntry, error) {
	if e := g.nodes[node]; e != nil {
		return e, nil
	}
	e := g.s.nodes.get(node)
	if e == nil {
		ns, err := getNode(txn, node)
		switch {
		case errors.Is(err, ErrNotFound):
			e = &nodeEntry{ns: &trainmeterv1.NodeStatus{Node: node}}
		case err != nil:
			return nil, err
		default:
			e = &nodeEntry{ns: ns, savedSeen: ns.GetLastSeen().AsTime(), savedBoot: ns.GetBootId(), stored: true}
		}
	}
	g.nodes[node] = e
	g.nodeOrder = append(g.nodeOrder, node)
	return e, nil
}

// write stores every aggregate and node status the group changed.
func (g *groupAggs) write(txn *badger.Txn) error {
	for _, r := range g.order {
		st := g.state[r]
		n, err := g.s.putAgg(txn, r, st, g.wasLive[r] && !st.Ended())
		if err != nil {
			return err
		}
		if !st.GetNodesApart() {
			st.ForgetChangedNodes()
			g.sizes[r] = n
			continue
		}
		for _, name := range st.TakeChangedNodes() {
			nv, err := st.MarshalNode(name)
			if err != nil {
				return err
			}
			if err := txn.Set(aggNodeKey(r, name), nv); err != nil {
				return err
			}
		}
		g.sizes[r] = n + len(st.Nodes)*encodedNodeEstimate
	}
	for _, n := range g.nodeOrder {
		if e := g.nodes[n]; e.due() {
			if err := e.save(txn); err != nil {
				return err
			}
		}
	}
	return nil
}

// putAgg writes a run's aggregate, whole (one node, most runs: one value,
// as cheap as it gets) or without its node states (MarshalApart: the
// caller writes those that changed), and its summary, and returns the
// aggregate's encoded size.
// indexed: the run was live and is, so its live marker stands.
func (s *Store) putAgg(txn *badger.Txn, run string, st *aggregate.State, indexed bool) (int, error) {
	marshal := st.MarshalApart
	if len(st.Nodes) <= 1 && !st.GetNodesApart() {
		marshal = st.Marshal
	}
	v, err := marshal()
	if err != nil {
		return 0, err
	}
	if !indexed {
		if err := s.putSummary(txn, run, st); err != nil {
			return 0, err
		}
	}
	return len(v), txn.Set(aggKey(run), v)
}

// finish keeps the folded aggregates and node statuses in the caches when
// the transaction committed (err nil); otherwise the in-memory copies are
// ahead of the database and are dropped.
func (g *groupAggs) finish(err error) {
	if err == nil {
		g.s.live.commit(g.live)
	}
	for _, r := range g.order {
		if err == nil {
			g.s.aggs.put(r, g.state[r], g.sizes[r])
		} else {
			g.s.aggs.drop(r)
		}
	}
	for _, n := range g.nodeOrder {
		e := g.nodes[n]
		if err == nil {
			e.commit()
			g.s.nodes.put(n, e)
		} else {
			g.s.nodes.forget(n)
		}
	}
}

// aggCacheBytes bounds the decoded aggregates kept in memory, estimated from
// their encoded size: decoding an aggregate is otherwise the largest cost of
// a batch (docs/benchmarks.md).
const aggCacheBytes = 256 << 20

// encodedNodeEstimate is about what a node's state encodes to with a full
// peak horizon (60 buckets), for the cache's budget: a commit encodes only
// the nodes it changed.
const encodedNodeEstimate = 900

// decodedPerEncodedByte estimates the heap a decoded aggregate takes per
// encoded byte.
const decodedPerEncodedByte = 4

// aggCache keeps decoded aggregates of recently written runs. Only the
// committer uses an entry; it is exactly what the database holds (put after
// a commit, dropped on a failure or a delete). When full, arbitrary entries
// are evicted.
type aggCache struct {
	mu    sync.Mutex
	max   int
	bytes int
	m     map[string]aggEntry
}

type aggEntry struct {
	st   *aggregate.State
	size int
}

func newAggCache(maxBytes int) *aggCache { return &aggCache{max: maxBytes, m: map[string]aggEntry{}} }

func (c *aggCache) get(run string) *aggregate.State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[run].st
}

func (c *aggCache) put(run string, st *aggregate.State, encoded int) {
	size := encoded * decodedPerEncodedByte
	if size > c.max {
		c.drop(run)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bytes -= c.m[run].size
	delete(c.m, run)
	for k, e := range c.m {
		if c.bytes+size <= c.max {
			break
		}
		c.bytes -= e.size
		delete(c.m, k)
	}
	c.m[run] = aggEntry{st, size}
	c.bytes += size
}

func (c *aggCache) drop(run string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bytes -= c.m[run].size
	delete(c.m, run)
}

// nodeStatusEvery: a node's stored status (last seen, last seq) is
// rewritten at most this often while its boot stays the same, not with
// every batch. Close writes the newest; after a crash it can be this much
// behind.
const nodeStatusEvery = 10 * time.Second

// nodeEntry is the committer's copy of a node's status and what of it the
// database holds.
type nodeEntry struct {
	ns        *trainmeterv1.NodeStatus
	stored    bool // the database holds a status of the node
	savedSeen time.Time
	savedBoot string

	pending bool // saved in the transaction now being committed
}

func (e *nodeEntry) due() bool {
	return !e.stored || e.savedBoot != e.ns.GetBootId() ||
		e.ns.GetLastSeen().AsTime().Sub(e.savedSeen) >= nodeStatusEvery
}

func (e *nodeEntry) save(txn *badger.Txn) error {
	v, err := proto.Marshal(e.ns)
	if err != nil {
		return err
	}
	if err := txn.Set(nodeKey(e.ns.GetNode()), v); err != nil {
		return err
	}
	e.pending = true
	return nil
}

// commit records that the transaction holding a save committed.
func (e *nodeEntry) commit() {
	if e.pending {
		e.stored, e.savedSeen, e.savedBoot, e.pending = true, e.ns.GetLastSeen().AsTime(), e.ns.GetBootId(), false
	}
}

// nodeCacheSize bounds the node statuses kept in memory.
const nodeCacheSize = 1 << 16

// nodeCache keeps the committer's node statuses, like aggCache. An entry
// may be newer than the database (nodeStatusEvery), so one that leaves the
// cache is written first, unless it is ahead by a commit that failed.
type nodeCache struct {
	mu  sync.Mutex
	max int
	m   map[string]*nodeEntry
	db  *badger.DB
}

func newNodeCache(n int, db *badger.DB) *nodeCache {
	return &nodeCache{max: n, m: map[string]*nodeEntry{}, db: db}
}

func (c *nodeCache) get(node string) *nodeEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[node]
}

func (c *nodeCache) put(node string, e *nodeEntry) {
	c.mu.Lock()
	var evicted *nodeEntry
	if _, ok := c.m[node]; !ok && len(c.m) >= c.max {
		for k, old := range c.m {
			evicted = old
			delete(c.m, k)
			break
		}
	}
	if c.max > 0 {
		c.m[node] = e
	} else {
		evicted = e
	}
	c.mu.Unlock()
	_ = c.write(evicted) // best effort: the status is informational
}

// drop writes a node's entry if the database is behind it and forgets it.
// PutHello calls it holding the node's lock, so the committer is not using
// the entry.
func (c *nodeCache) drop(node string) error {
	c.mu.Lock()
	e := c.m[node]
	delete(c.m, node)
	c.mu.Unlock()
	return c.write(e)
}

// forget drops a node's entry without writing it (after a failed commit,
// which the entry has folded in).
func (c *nodeCache) forget(node string) {
	c.mu.Lock()
	delete(c.m, node)
	c.mu.Unlock()
}

// flushAll writes every entry the database is behind on (Close, once the
// committer has stopped).
func (c *nodeCache) flushAll() error {
	c.mu.Lock()
	entries := make([]*nodeEntry, 0, len(c.m))
	for _, e := range c.m {
		entries = append(entries, e)
	}
	c.mu.Unlock()
	return c.write(entries...)
}

// write saves the entries the database is behind on.
func (c *nodeCache) write(entries ...*nodeEntry) error {
	var behind []*nodeEntry
	for _, e := range entries {
		if e != nil && (!e.stored || e.savedBoot != e.ns.GetBootId() || !e.ns.GetLastSeen().AsTime().Equal(e.savedSeen)) {
			behind = append(behind, e)
		}
	}
	if len(behind) == 0 {
		return nil
	}
	err := c.db.Update(func(txn *badger.Txn) error {
		for _, e := range behind {
			if err := e.save(txn); err != nil {
				return err
			}
		}
		return nil
	})
	for _, e := range behind {
		if err == nil {
			e.commit()
		}
		e.pending = false
	}
	return err
}

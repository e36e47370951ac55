package store

import (
	"errors"
	"sync"

	"github.com/dgraph-io/badger/v4"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Group commit.
//
// One badger transaction and one WAL sync per batch costs far more than the
// batch itself when thousands of agents send every second, and rewriting a
// run's aggregate for every batch of every node of the run is most of the
// bytes written (docs/benchmarks.md). So ApplyBatch, holding its node's
// stripe lock, hands its batch to a single committer goroutine, which takes
// every batch waiting (up to maxGroup) into one transaction: each run's
// aggregate is read and written once per group rather than once per batch,
// and the commit is one write and one sync. Callers are answered only once
// the commit holding their batch is durable; while it syncs, the next
// batches queue up and form the next group.
//
// The committer is the only writer of run aggregates (DeleteRun excludes it
// with aggMu), so batches of one run from many nodes no longer wait for
// each other's commits, and the decoded aggregates it keeps in aggCache are
// exactly what the database holds.
//
// If a group fails as a whole (one batch too large for a transaction, a
// conflict, an I/O error) the committer applies each of its batches alone,
// so each caller sees its own batch's outcome, as before.

// maxGroup bounds the batches in one transaction (a transaction has a size
// limit; groups far below it keep a failure cheap).
const maxGroup = 256

type applyReq struct {
	node, boot string
	b          *trainmeterv1.Batch
	runs       []string
	raw        []kv // encoded by the caller

	dup  bool
	err  error
	done chan struct{}
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
		group := []*applyReq{first}
	drain:
		for len(group) < maxGroup {
			select {
			case r := <-s.applyCh:
				group = append(group, r)
			default:
				break drain
			}
		}
		s.aggMu.Lock()
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
	nodes     map[string]*trainmeterv1.NodeStatus
	nodeOrder []string
	sizes     map[string]int // encoded aggregate sizes, for the cache
}

func newGroupAggs(s *Store) *groupAggs {
	return &groupAggs{s: s, state: map[string]*aggregate.State{}, nodes: map[string]*trainmeterv1.NodeStatus{}, sizes: map[string]int{}}
}

func (g *groupAggs) get(txn *badger.Txn, run string) (*aggregate.State, error) {
	if st := g.state[run]; st != nil {
		return st, nil
	}
	st := g.s.aggs.get(run)
	if st == nil {
		var err error
		st, err = getAgg(txn, run)
		if errors.Is(err, ErrNotFound) {
			st, err = aggregate.New(run), nil
		}
		if err != nil {
			return nil, err
		}
	}
	g.state[run] = st
	g.order = append(g.order, run)
	return st, nil
}

func (g *groupAggs) node(txn *badger.Txn, node string) (*trainmeterv1.NodeStatus, error) {
	if ns := g.nodes[node]; ns != nil {
		return ns, nil
	}
	ns := g.s.nodes.get(node)
	if ns == nil {
		var err error
		ns, err = getNode(txn, node)
		if errors.Is(err, ErrNotFound) {
			ns, err = &trainmeterv1.NodeStatus{Node: node}, nil
		}
		if err != nil {
			return nil, err
		}
	}
	g.nodes[node] = ns
	g.nodeOrder = append(g.nodeOrder, node)
	return ns, nil
}

// write stores every aggregate and node status the group changed.
func (g *groupAggs) write(txn *badger.Txn) error {
	for _, r := range g.order {
		v, err := g.state[r].Marshal()
		if err != nil {
			return err
		}
		g.sizes[r] = len(v)
		if err := txn.Set(aggKey(r), v); err != nil {
			return err
		}
	}
	for _, n := range g.nodeOrder {
		v, err := proto.Marshal(g.nodes[n])
		if err != nil {
			return err
		}
		if err := txn.Set(nodeKey(n), v); err != nil {
			return err
		}
	}
	return nil
}

// finish keeps the folded aggregates and node statuses in the caches when
// the transaction committed (err nil); otherwise the in-memory copies are
// ahead of the database and are dropped.
func (g *groupAggs) finish(err error) {
	for _, r := range g.order {
		if err == nil {
			g.s.aggs.put(r, g.state[r], g.sizes[r])
		} else {
			g.s.aggs.drop(r)
		}
	}
	for _, n := range g.nodeOrder {
		if err == nil {
			g.s.nodes.put(n, g.nodes[n])
		} else {
			g.s.nodes.drop(n)
		}
	}
}

// aggCacheBytes bounds the decoded aggregates kept in memory, estimated from
// their encoded size: decoding an aggregate's JSON is otherwise the largest
// cost of a batch (docs/benchmarks.md).
const aggCacheBytes = 256 << 20

// decodedPerEncodedByte estimates the heap a decoded aggregate takes per
// byte of its JSON (maps of maps: measured about 3 to 4).
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

// nodeCacheSize bounds the node statuses kept in memory.
const nodeCacheSize = 1 << 16

// nodeCache keeps the committer's node statuses, like aggCache; PutHello
// drops a node's entry (it holds the node's lock, so the committer is not
// using it).
type nodeCache struct {
	mu  sync.Mutex
	max int
	m   map[string]*trainmeterv1.NodeStatus
}

func newNodeCache(n int) *nodeCache {
	return &nodeCache{max: n, m: map[string]*trainmeterv1.NodeStatus{}}
}

func (c *nodeCache) get(node string) *trainmeterv1.NodeStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[node]
}

func (c *nodeCache) put(node string, ns *trainmeterv1.NodeStatus) {
	if c.max <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[node]; !ok && len(c.m) >= c.max {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[node] = ns
}

func (c *nodeCache) drop(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, node)
}

package store

import (
	"fmt"

	"github.com/dgraph-io/badger/v4"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/fold"
)

// Limits bounds what one node may start (fold.Limits). Zero: no bound.
type Limits = fold.Limits

// liveIndex is, per node, the runs live on it and its new-run bucket, as
// the committed aggregates have them: the fold.LiveBase of the committer's
// groups. Only the committer (and DeleteRun, both under aggMu) use it.
type liveIndex struct {
	runs    map[string]map[string]struct{} // node → runs live on it
	buckets map[string]fold.Bucket         // node → new-run bucket (absent: full)
}

func newLiveIndex() *liveIndex {
	return &liveIndex{runs: map[string]map[string]struct{}{}, buckets: map[string]fold.Bucket{}}
}

func (x *liveIndex) IsLive(node, run string) bool {
	_, ok := x.runs[node][run]
	return ok
}

func (x *liveIndex) LiveRuns(node string) int       { return len(x.runs[node]) }
func (x *liveIndex) Bucket(node string) fold.Bucket { return x.buckets[node] }

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

// commit applies a group's changes (its commit succeeded).
func (x *liveIndex) commit(l *fold.Live) {
	for k, v := range l.Changed {
		x.set(k.Node, k.Run, v)
	}
	for node, b := range l.Buckets() {
		if b == (fold.Bucket{}) {
			delete(x.buckets, node)
		} else {
			x.buckets[node] = b
		}
	}
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

package store

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/dgraph-io/badger/v4"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
)

// RunsAfter returns the aggregates of at most limit runs whose ids come
// after `after` in byte order ("": from the first run), in that order: one
// page of a listing of every run. Its cost is the page's runs, not the
// store's, so that paging through many runs stays linear; the page is
// decoded on all cores, as ListRuns decodes.
func (s *Store) RunsAfter(after string, limit int) ([]*aggregate.State, error) {
	if limit <= 0 {
		return nil, nil
	}
	var out []*aggregate.State
	err := s.db.View(func(txn *badger.Txn) error {
		prefix := []byte("a/")
		seek := prefix
		if after != "" {
			seek = append(aggKey(after), 0) // the smallest key after after's
		}
		var ids []string
		var vals [][]byte
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: 64})
		for it.Seek(seek); it.Valid() && len(ids) < limit; it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				it.Close()
				return err
			}
			ids, vals = append(ids, string(it.Item().Key()[len(prefix):])), append(vals, v)
		}
		it.Close()
		out = make([]*aggregate.State, len(vals))
		errs := make([]error, len(vals))
		var next atomic.Int64
		var wg sync.WaitGroup
		for w := min(runtime.GOMAXPROCS(0), (len(vals)+63)/64); w > 0; w-- {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := int(next.Add(1)) - 1; i < len(vals); i = int(next.Add(1)) - 1 {
					out[i], errs[i] = aggregate.Unmarshal(vals[i])
				}
			}()
		}
		wg.Wait()
		for i, st := range out {
			if errs[i] != nil {
				return fmt.Errorf("run %q: %w", ids[i], errs[i])
			}
			if !st.GetNodesApart() {
				continue
			}
			// Badger iterators are not for concurrent use in one
			// transaction: the node states are read here, one run at a time.
			p := aggNodesPrefix(ids[i])
			nit := txn.NewIterator(badger.IteratorOptions{Prefix: p, PrefetchValues: true, PrefetchSize: 256})
			for nit.Rewind(); nit.Valid(); nit.Next() {
				name := string(nit.Item().Key()[len(p):])
				if err := nit.Item().Value(func(v []byte) error { return st.UnmarshalNode(name, v) }); err != nil {
					nit.Close()
					return fmt.Errorf("run %q: %w", ids[i], err)
				}
			}
			nit.Close()
		}
		return nil
	})
	return out, err
}

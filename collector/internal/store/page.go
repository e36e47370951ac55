package store

import (
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
	return view(s, func(txn *badger.Txn) ([]*aggregate.State, error) {
		seek := []byte("a/")
		if after != "" {
			seek = append(aggKey(after), 0) // the smallest key after after's
		}
		ids, vals, err := aggsFrom(txn, seek, limit)
		if err != nil {
			return nil, err
		}
		// Badger iterators are not for concurrent use in one transaction:
		// the node states are read after decoding, one run at a time.
		return decodeAggs(ids, vals, func(i int, st *aggregate.State) error { return readNodes(txn, ids[i], st) })
	})
}

package store

import (
	"github.com/dgraph-io/badger/v4"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
)

// RunsAfter returns the aggregates of at most limit runs whose ids come
// after `after` in byte order ("" : from the first run), in that order: one
// page of a listing of every run. Its cost is the page's runs, not the
// store's, so that paging through many runs stays linear.
func (s *Store) RunsAfter(after string, limit int) ([]*aggregate.State, error) {
	if limit <= 0 {
		return nil, nil
	}
	var out []*aggregate.State
	err := s.db.View(func(txn *badger.Txn) error {
		prefix := []byte("a/")
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		var ids []string
		seek := prefix
		if after != "" {
			// The smallest key after aggKey(after).
			seek = append(aggKey(after), 0)
		}
		for it.Seek(seek); it.Valid() && len(ids) < limit; it.Next() {
			ids = append(ids, string(it.Item().Key()[len(prefix):]))
		}
		it.Close()
		out = make([]*aggregate.State, 0, len(ids))
		for _, id := range ids {
			st, err := getAgg(txn, id)
			if err != nil {
				return err
			}
			out = append(out, st)
		}
		return nil
	})
	return out, err
}

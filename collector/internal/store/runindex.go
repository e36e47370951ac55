package store

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
)

// A run's summary (aggregate.Summary), written with its aggregate: what
// SelectRuns filters and orders by without decoding aggregates.
func summaryKey(run string) []byte { return key("ai/", run) }

// A live run's marker (an empty value), there while its summary says it
// has not ended: SelectRuns of the live runs reads these, a few keys, not
// every summary.
func liveKey(run string) []byte { return key("al/", run) }

// summaryLen is an encoded summary's size: flags, end (ns), total cost.
const summaryLen = 1 + 8 + 8

const (
	sumEnded = 1 << iota
	sumHasEnd
	sumHasCost
)

func encodeSummary(sum aggregate.Summary) []byte {
	v := make([]byte, summaryLen)
	if sum.Ended {
		v[0] |= sumEnded
	}
	if sum.HasEnd {
		v[0] |= sumHasEnd
		binary.BigEndian.PutUint64(v[1:], uint64(sum.EndNanos))
	}
	if sum.TotalCostUSD != nil {
		v[0] |= sumHasCost
		binary.BigEndian.PutUint64(v[9:], math.Float64bits(*sum.TotalCostUSD))
	}
	return v
}

func decodeSummary(v []byte) (aggregate.Summary, error) {
	if len(v) != summaryLen {
		return aggregate.Summary{}, fmt.Errorf("store: run summary of %d bytes, want %d", len(v), summaryLen)
	}
	sum := aggregate.Summary{Ended: v[0]&sumEnded != 0, HasEnd: v[0]&sumHasEnd != 0}
	if sum.HasEnd {
		sum.EndNanos = int64(binary.BigEndian.Uint64(v[1:]))
	}
	if v[0]&sumHasCost != 0 {
		c := math.Float64frombits(binary.BigEndian.Uint64(v[9:]))
		sum.TotalCostUSD = &c
	}
	return sum, nil
}

// putSummary writes run's summary, computed with the pricing SetPricer
// set (as pgstore's report columns are).
func (s *Store) putSummary(txn *badger.Txn, run string, st *aggregate.State) error {
	p, _ := s.Pricer().(aggregate.Pricing)
	sum := st.Summary(p)
	if !sum.Ended {
		// Set once: rewriting it at every write of a live run cost
		// ingest a key write a run a group.
		_, err := txn.Get(liveKey(run))
		if errors.Is(err, badger.ErrKeyNotFound) {
			err = txn.Set(liveKey(run), nil)
		}
		if err != nil {
			return err
		}
	} else if err := dropLive(txn, run); err != nil {
		return err
	}
	return txn.Set(summaryKey(run), encodeSummary(sum))
}

// dropLive deletes run's live marker if it has one (deleting none would
// write a tombstone at every write of an ended run).
func dropLive(txn *badger.Txn, run string) error {
	_, err := txn.Get(liveKey(run))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return txn.Delete(liveKey(run))
}

// SelectRuns implements storage.Runs from the summaries alone.
func (s *Store) SelectRuns(f storage.RunFilter) ([]string, error) {
	type sel struct {
		id   string
		cost *float64
	}
	var out []sel
	add := func(id string, v []byte) error {
		sum, err := decodeSummary(v)
		if err != nil {
			return fmt.Errorf("run %q: %w", id, err)
		}
		if f.Selects(sum) {
			out = append(out, sel{id, sum.TotalCostUSD})
		}
		return nil
	}
	err := s.db.View(func(txn *badger.Txn) error {
		if !f.LiveOnly {
			return scan(txn, badger.IteratorOptions{Prefix: []byte("ai/"), PrefetchSize: 256}, nil, func(k, v []byte) error {
				return add(string(k[len("ai/"):]), v)
			})
		}
		var live []string
		err := scan(txn, badger.IteratorOptions{Prefix: []byte("al/")}, nil, func(k, _ []byte) error {
			live = append(live, string(k[len("al/"):]))
			return nil
		})
		for _, id := range live {
			if err != nil {
				break
			}
			var item *badger.Item
			if item, err = txn.Get(summaryKey(id)); err == nil {
				err = item.Value(func(v []byte) error { return add(id, v) })
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if f.ByCost {
		// The scan is in id order, so a stable sort keeps ties by id.
		slices.SortStableFunc(out, func(a, b sel) int {
			switch {
			case a.cost != nil && b.cost != nil:
				return cmp.Compare(*b.cost, *a.cost)
			case a.cost != nil:
				return -1
			case b.cost != nil:
				return 1
			}
			return 0
		})
	}
	ids := make([]string, len(out))
	for i, r := range out {
		ids[i] = r.id
	}
	return ids, nil
}

package store

import (
	"cmp"
	"encoding/binary"
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
	return txn.Set(summaryKey(run), encodeSummary(st.Summary(p)))
}

// SelectRuns implements storage.Runs from the summaries alone.
func (s *Store) SelectRuns(f storage.RunFilter) ([]string, error) {
	type sel struct {
		id   string
		cost *float64
	}
	var out []sel
	err := s.db.View(func(txn *badger.Txn) error {
		return scan(txn, badger.IteratorOptions{Prefix: []byte("ai/"), PrefetchSize: 256}, nil, func(k, v []byte) error {
			sum, err := decodeSummary(v)
			if err != nil {
				return fmt.Errorf("run %q: %w", k[len("ai/"):], err)
			}
			if f.Selects(sum) {
				out = append(out, sel{string(k[len("ai/"):]), sum.TotalCostUSD})
			}
			return nil
		})
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

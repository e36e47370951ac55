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

// An ended run's summary (aggregate.Summary), written with its aggregate:
// what SelectRuns filters and orders ended runs by without decoding their
// aggregates.
func summaryKey(run string) []byte { return key("ai/", run) }

// A live run's marker (an empty value), there while its aggregate says it
// has not ended: SelectRuns reads the live runs' aggregates, a few, and
// ingest writes nothing more for a live run than its aggregate.
func liveKey(run string) []byte { return key("al/", run) }

// summaryLen is an encoded summary's fixed part: flags, end (ns), total
// cost, start (ns); the model's bytes follow it.
const summaryLen = 1 + 8 + 8 + 8

const (
	sumEnded = 1 << iota
	sumHasEnd
	sumHasCost
)

func encodeSummary(sum aggregate.Summary) []byte {
	v := make([]byte, summaryLen, summaryLen+len(sum.Model))
	if sum.Ended {
		v[0] |= sumEnded
	}
	if sum.HasEnd {
		v[0] |= sumHasEnd
		binary.BigEndian.PutUint64(v[1:], uint64(sum.EndNanos))
		binary.BigEndian.PutUint64(v[17:], uint64(sum.StartNanos))
	}
	if sum.TotalCostUSD != nil {
		v[0] |= sumHasCost
		binary.BigEndian.PutUint64(v[9:], math.Float64bits(*sum.TotalCostUSD))
	}
	return append(v, sum.Model...)
}

func decodeSummary(v []byte) (aggregate.Summary, error) {
	if len(v) < summaryLen {
		return aggregate.Summary{}, fmt.Errorf("store: run summary of %d bytes, want at least %d", len(v), summaryLen)
	}
	sum := aggregate.Summary{Ended: v[0]&sumEnded != 0, HasEnd: v[0]&sumHasEnd != 0, Model: string(v[summaryLen:])}
	if sum.HasEnd {
		sum.EndNanos = int64(binary.BigEndian.Uint64(v[1:]))
		sum.StartNanos = int64(binary.BigEndian.Uint64(v[17:]))
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
	if !st.Ended() {
		// A live run has its marker, set once, and no summary:
		// SelectRuns reads a live run's figures from its aggregate, so
		// that ingest writes no key more a run a group than it did.
		_, err := txn.Get(liveKey(run))
		if errors.Is(err, badger.ErrKeyNotFound) {
			err = txn.Set(liveKey(run), nil)
		}
		if err != nil {
			return err
		}
		return dropKey(txn, summaryKey(run)) // a run that ended and then got a start again
	}
	if err := dropKey(txn, liveKey(run)); err != nil {
		return err
	}
	p, _ := s.Pricer().(aggregate.Pricing)
	return txn.Set(summaryKey(run), encodeSummary(st.Summary(p)))
}

// dropKey deletes k if it is there: deleting a key that is not would
// write a tombstone (a live run's summary, an ended run's marker) at every
// write of the run.
func dropKey(txn *badger.Txn, k []byte) error {
	_, err := txn.Get(k)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return txn.Delete(k)
}

// SelectRuns implements storage.Runs from the ended runs' summaries and
// the live runs' aggregates.
func (s *Store) SelectRuns(f storage.RunFilter) ([]string, error) {
	type sel struct {
		id   string
		cost *float64
		// start is the run's start (Unix ns); hasStart false when none.
		start    int64
		hasStart bool
	}
	var out []sel
	p, _ := s.Pricer().(aggregate.Pricing)
	err := s.db.View(func(txn *badger.Txn) error {
		var live []string
		var err error
		if !f.EndedOnly {
			err = scan(txn, badger.IteratorOptions{Prefix: []byte("al/")}, nil, func(k, _ []byte) error {
				live = append(live, string(k[len("al/"):]))
				return nil
			})
		}
		for _, id := range live {
			if err != nil {
				return err
			}
			var st *aggregate.State
			if st, err = getAgg(txn, id); err == nil {
				if sum := st.Summary(p); f.Selects(sum) {
					out = append(out, sel{id, sum.TotalCostUSD, sum.StartNanos, sum.HasEnd})
				}
			} else if errors.Is(err, ErrNotFound) {
				err = nil
			}
		}
		if err != nil || f.LiveOnly {
			return err
		}
		return scan(txn, badger.IteratorOptions{Prefix: []byte("ai/"), PrefetchSize: 256}, nil, func(k, v []byte) error {
			sum, err := decodeSummary(v)
			if err != nil {
				return fmt.Errorf("run %q: %w", k[len("ai/"):], err)
			}
			if f.Selects(sum) {
				out = append(out, sel{string(k[len("ai/"):]), sum.TotalCostUSD, sum.StartNanos, sum.HasEnd})
			}
			return nil
		})
	})
	// Live runs first, then ended ones, each in id order: in id order
	// again, so that ties keep it.
	slices.SortFunc(out, func(a, b sel) int { return cmp.Compare(a.id, b.id) })
	if err != nil {
		return nil, err
	}
	// out is in id order, so a stable sort keeps ties by id.
	switch {
	case f.ByCost:
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
	case f.ByStart:
		slices.SortStableFunc(out, func(a, b sel) int {
			switch {
			case a.hasStart && b.hasStart:
				return cmp.Compare(b.start, a.start)
			case a.hasStart:
				return -1
			case b.hasStart:
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

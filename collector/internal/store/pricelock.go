package store

import (
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/fold"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Locked prices (docs/costs.md; fold.AppendStamp): the run window's w/
// record and the batch's r/ record (idle GPU time) carry the prices they
// were booked at.

type pricerBox struct{ p aggregate.Pricer }

// SetPricer sets the prices windows are booked at from now on (the
// collector's cost configuration, whose catalog follows the price list).
// Call it before serving ingest; without it windows are stored unpriced
// and priced when read.
func (s *Store) SetPricer(p aggregate.Pricer) { s.pricer.Store(&pricerBox{p}) }

// Pricer returns what SetPricer set, or nil.
func (s *Store) Pricer() aggregate.Pricer {
	if b := s.pricer.Load(); b != nil {
		return b.p
	}
	return nil
}

// Reprice implements storage.Store: it rewrites the prices in the run's
// stored windows, then the aggregate; writes wait meanwhile.
func (s *Store) Reprice(id string, since time.Time, usdPerHour float64, reason string, report func(*aggregate.State) *trainmeterv1.RunReport) (before, after *trainmeterv1.RunReport, ch aggregate.Repricing, err error) {
	unlock := s.lockRuns("", []string{id})
	defer unlock()
	s.aggMu.Lock()
	defer s.aggMu.Unlock()
	s.aggs.drop(id)
	var st *aggregate.State
	if err := s.db.View(func(txn *badger.Txn) error {
		st, err = getAgg(txn, id)
		return err
	}); err != nil {
		return nil, nil, ch, err
	}
	ch = aggregate.Repricing{At: s.now().UnixNano(), USDPerGPUHour: usdPerHour, Reason: reason, Whole: since.IsZero()}
	// The windows: read, then rewritten in chunks (a long run has more
	// than one transaction holds).
	recs, err := view(s, func(txn *badger.Txn) ([]rec, error) {
		return readRecs(txn, append(key("w/", id), 0), 0, func(v []byte) ([]byte, error) {
			var w trainmeterv1.RunWindow
			if err := proto.Unmarshal(v, &w); err != nil {
				return nil, fmt.Errorf("run %q window: %w", id, err)
			}
			if !fold.RepriceWindow(&w, since, usdPerHour, &ch) {
				return nil, nil
			}
			return proto.Marshal(&w)
		})
	})
	if err != nil {
		return nil, nil, ch, err
	}
	if !ch.Whole && ch.GPUSeconds == 0 {
		return nil, nil, ch, nil // nothing of the run since then
	}
	for len(recs) > 0 {
		n := min(len(recs), deleteChunk)
		err := s.db.Update(func(txn *badger.Txn) error {
			for _, r := range recs[:n] {
				if err := setExpiring(txn, r); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, nil, ch, err
		}
		recs = recs[n:]
	}
	before = report(st)
	st.Reprice(before, ch)
	after = report(st)
	err = s.db.Update(func(txn *badger.Txn) error {
		_, err := s.putAgg(txn, id, st, false) // the node states did not change
		return err
	})
	if err != nil {
		return nil, nil, ch, err
	}
	return before, after, ch, nil
}

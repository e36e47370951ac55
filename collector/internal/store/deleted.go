package store

import (
	"strconv"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Deleting a live run (delete-run --force): its agents go on sending its
// windows until its trainers end it, and each would bring the run back
// without its run_start (no metadata, "running" for ever). The store keeps
// a tombstone per such run and drops the run's records from later batches,
// until a run_start later than the deletion starts the id afresh.

const deletedNS = "deleted-runs"

type tombstones struct {
	mu sync.Mutex
	at map[string]int64 // run id -> deletion time, Unix ns
}

func (s *Store) loadTombstones() error {
	s.deleted.at = map[string]int64{}
	return s.ScanRecords(deletedNS, "", func(k string, v []byte) (bool, error) {
		if ns, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			s.deleted.at[k] = ns
		}
		return true, nil
	})
}

// DeleteLiveRun ends a run that has not ended at the collector and deletes
// it: data of the run in batches that arrive later is dropped, until a
// run_start after now reuses the id.
func (s *Store) DeleteLiveRun(id string) (records int, err error) {
	at := s.now().UnixNano()
	if err := s.PutRecord(deletedNS, id, []byte(strconv.FormatInt(at, 10))); err != nil {
		return 0, err
	}
	s.deleted.mu.Lock()
	s.deleted.at[id] = at
	s.deleted.mu.Unlock()
	return s.DeleteRun(id)
}

// dropDeleted returns b without the records of runs deleted while live (a
// copy; b itself is left as it is), or b when it has none.
func (s *Store) dropDeleted(b *trainmeterv1.Batch) *trainmeterv1.Batch {
	s.deleted.mu.Lock()
	defer s.deleted.mu.Unlock()
	if len(s.deleted.at) == 0 {
		return b
	}
	// A run_start after the deletion starts the id afresh: records from
	// that run_start on are kept.
	keepFrom := map[string]int64{}
	hit := false
	for _, e := range b.GetRunEvents() {
		id := eventRun(e)
		at, ok := s.deleted.at[id]
		if !ok {
			continue
		}
		hit = true
		if rs := e.GetRunStart(); rs != nil && rs.GetTime().AsTime().UnixNano() > at {
			keepFrom[id] = rs.GetTime().AsTime().UnixNano()
		}
	}
	for _, w := range b.GetRunWindows() {
		if _, ok := s.deleted.at[w.GetRunId()]; ok {
			hit = true
		}
	}
	for _, l := range b.GetLosses() {
		if _, ok := s.deleted.at[l.GetRunId()]; ok {
			hit = true
		}
	}
	for _, h := range b.GetHostEnergy() {
		for _, sh := range h.GetRuns() {
			if _, ok := s.deleted.at[sh.GetRunId()]; ok {
				hit = true
			}
		}
	}
	if !hit {
		return b
	}
	for id := range keepFrom {
		delete(s.deleted.at, id)
		if err := s.DeleteRecord(deletedNS, id); err != nil {
			s.log.Warn("store: clearing the deletion mark of a reused run id", "run_id", id, "err", err)
		}
	}
	keep := func(id string, t int64) bool {
		if _, gone := s.deleted.at[id]; !gone {
			from, restarted := keepFrom[id]
			return !restarted || t >= from
		}
		return false
	}
	nb := proto.Clone(b).(*trainmeterv1.Batch)
	nb.RunWindows = nb.RunWindows[:0]
	for _, w := range b.GetRunWindows() {
		if keep(w.GetRunId(), w.GetStart().AsTime().UnixNano()) {
			nb.RunWindows = append(nb.RunWindows, w)
		}
	}
	nb.RunEvents = nb.RunEvents[:0]
	for _, e := range b.GetRunEvents() {
		if keep(eventRun(e), aggregate.EventTime(e).AsTime().UnixNano()) {
			nb.RunEvents = append(nb.RunEvents, e)
		}
	}
	// A deleted run's host energy parts go (the node's totals keep them).
	for _, h := range nb.HostEnergy {
		kept := h.Runs[:0]
		for _, sh := range h.Runs {
			if keep(sh.GetRunId(), h.GetEnd().AsTime().UnixNano()) {
				kept = append(kept, sh)
			}
		}
		h.Runs = kept
	}
	nb.Losses = nb.Losses[:0]
	for _, l := range b.GetLosses() {
		if _, gone := s.deleted.at[l.GetRunId()]; !gone {
			nb.Losses = append(nb.Losses, l)
		}
	}
	return nb
}

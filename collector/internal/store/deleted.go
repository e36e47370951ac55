package store

import (
	"errors"
	"sync"

	"github.com/dgraph-io/badger/v4"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/fold"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Deleting a live run (delete-run --force): its agents go on sending its
// windows until its trainers end it, and each would bring the run back
// without its run_start (no metadata, "running" for ever). The store keeps
// a tombstone per such run and drops the run's records from later batches,
// until a run_start later than the deletion starts the id afresh.

type tombstones struct {
	mu sync.Mutex
	m  map[string]fold.Deletion // run id -> its deletion, for its later windows
}

// newDeletion is the deletion of run id (fold.NewDeletion).
func (s *Store) newDeletion(id string) (fold.Deletion, error) {
	st, err := s.GetRun(id)
	if errors.Is(err, ErrNotFound) {
		st, err = nil, nil
	}
	if err != nil {
		return fold.Deletion{}, err
	}
	return fold.NewDeletion(st)
}

func (s *Store) loadTombstones() error {
	s.deleted.m = map[string]fold.Deletion{}
	return s.ScanRecords(fold.DeletedNS, "", func(k string, v []byte) (bool, error) {
		if d, ok := fold.ParseTombstone(string(v)); ok {
			s.deleted.m[k] = d
		}
		return true, nil
	})
}

// DeleteLiveRun implements storage.Store (tombstones above).
func (s *Store) DeleteLiveRun(id string) (records int, err error) {
	d, err := s.newDeletion(id)
	if err != nil {
		return 0, err
	}
	d.At = s.now().UnixNano()
	if err := s.PutRecord(fold.DeletedNS, id, d.Tombstone()); err != nil {
		return 0, err
	}
	s.deleted.mu.Lock()
	s.deleted.m[id] = d
	s.deleted.mu.Unlock()
	return s.deleteRun(id, d)
}

// Deleted runs' windows: dw/<node>\0<start:8><seq:8><i:4><deletion:8>
// (DeletedRunWindow), the start, seq and index of the run window they were.
func deletedWindowKey(node string, startSeqI []byte, deletion uint64) []byte {
	return be64(append(append(key("dw/", node), 0), startSeqI...), deletion)
}

// appendDeletedRecords adds the dw/ records of a batch's windows dropped
// as a deleted run's to its raw records (written, like them, once).
func appendDeletedRecords(out []kv, node string, seq uint64, gone []fold.DeletedWindow) ([]kv, error) {
	for _, g := range gone {
		v, err := fold.DeletedRecord(g.W, g.D)
		if err != nil {
			return nil, err
		}
		k := deletedWindowKey(node, be32(be64(tkey(nil, g.W.GetStart()), seq), uint32(g.I)), g.D.ID)
		out = append(out, kv{k, v})
	}
	return out, nil
}

// moveChunk bounds the windows one transaction of moveRunWindows moves.
const moveChunk = 2000

// moveRunWindows turns run id's windows (w/) into the deleted run's (dw/),
// each keeping its expiry, and returns how many it moved.
func (s *Store) moveRunWindows(id string, d fold.Deletion) (moved int, err error) {
	prefix := append(key("w/", id), 0)
	for {
		recs, err := view(s, func(txn *badger.Txn) ([]rec, error) { return readRecs(txn, prefix, moveChunk, nil) })
		if err != nil || len(recs) == 0 {
			return moved, err
		}
		err = s.db.Update(func(txn *badger.Txn) error {
			for _, r := range recs {
				// <prefix><node>\0<start:8><seq:8><i:4>
				rest := r.k[len(prefix):]
				if len(rest) < 21 {
					if err := txn.Delete(r.k); err != nil {
						return err
					}
					continue
				}
				w := &trainmeterv1.RunWindow{}
				if err := proto.Unmarshal(r.v, w); err != nil {
					return err
				}
				v, err := fold.DeletedRecord(w, d)
				if err != nil {
					return err
				}
				if err := setExpiring(txn, rec{deletedWindowKey(string(rest[:len(rest)-21]), rest[len(rest)-20:], d.ID), v, r.expiresAt}); err != nil {
					return err
				}
				if err := txn.Delete(r.k); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return moved, err
		}
		moved += len(recs)
	}
}

// dropDeleted drops the records of runs deleted while live from b
// (fold.DropDeleted) and clears the tombstones of ids started afresh.
func (s *Store) dropDeleted(b *trainmeterv1.Batch) (*trainmeterv1.Batch, []fold.DeletedWindow) {
	s.deleted.mu.Lock()
	defer s.deleted.mu.Unlock()
	if len(s.deleted.m) == 0 {
		return b, nil
	}
	nb, dropped, restarted := fold.DropDeleted(b, fold.BatchRuns(b), func(id string) (fold.Deletion, bool) {
		d, ok := s.deleted.m[id]
		return d, ok
	})
	for _, id := range restarted {
		delete(s.deleted.m, id)
		if err := s.DeleteRecord(fold.DeletedNS, id); err != nil {
			s.log.Warn("store: clearing the deletion mark of a reused run id", "run_id", id, "err", err)
		}
	}
	return nb, dropped
}

package store

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/dgraph-io/badger/v4"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
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
	m  map[string]deletion // run id -> its deletion, for its later windows
}

// A deletion is what a deleted run's windows keep (DeletedRunWindow): the
// GPU time and energy stay in usage as "(deleted)", priced as the run was.
type deletion struct {
	id      uint64
	price   float64 // the run's own GPU price per hour; 0: none
	gpuName string
	at      int64 // of a live run's deletion: when, Unix ns
}

// newDeletion is the deletion of run id: a random id, and the run's price
// and GPU name from its aggregate (none when it is gone: a delete
// interrupted and done again).
func (s *Store) newDeletion(id string) (deletion, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return deletion{}, err
	}
	d := deletion{id: binary.BigEndian.Uint64(b[:])}
	st, err := s.GetRun(id)
	switch {
	case err == nil:
		d.price, d.gpuName = st.GetRunStart().GetGpuPricePerHour(), st.GetRunStart().GetGpuName()
	case !errors.Is(err, ErrNotFound):
		return d, err
	}
	return d, nil
}

// A tombstone's value is "<deleted at, Unix ns> <deletion id> <price> <GPU
// name>".
func (d deletion) tombstone() []byte {
	return []byte(strconv.FormatInt(d.at, 10) + " " + strconv.FormatUint(d.id, 10) + " " +
		strconv.FormatFloat(d.price, 'g', -1, 64) + " " + d.gpuName)
}

func parseTombstone(v string) (d deletion, ok bool) {
	f := strings.SplitN(v, " ", 4)
	if len(f) != 4 {
		return d, false
	}
	var err error
	if d.at, err = strconv.ParseInt(f[0], 10, 64); err != nil {
		return d, false
	}
	d.id, _ = strconv.ParseUint(f[1], 10, 64)
	d.price, _ = strconv.ParseFloat(f[2], 64)
	d.gpuName = f[3]
	return d, true
}

func (s *Store) loadTombstones() error {
	s.deleted.m = map[string]deletion{}
	return s.ScanRecords(deletedNS, "", func(k string, v []byte) (bool, error) {
		if d, ok := parseTombstone(string(v)); ok {
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
	d.at = s.now().UnixNano()
	if err := s.PutRecord(deletedNS, id, d.tombstone()); err != nil {
		return 0, err
	}
	s.deleted.mu.Lock()
	s.deleted.m[id] = d
	s.deleted.mu.Unlock()
	return s.deleteRun(id, d)
}

// deletedWindow is a run window of a deleted run dropped from a batch:
// its index in the batch and its run's deletion.
type deletedWindow struct {
	i int
	w *trainmeterv1.RunWindow
	d deletion
}

// Deleted runs' windows: dw/<node>\0<start:8><seq:8><i:4><deletion:8>
// (DeletedRunWindow), the start, seq and index of the run window they were.
func deletedWindowKey(node string, startSeqI []byte, deletion uint64) []byte {
	return be64(append(append(key("dw/", node), 0), startSeqI...), deletion)
}

func deletedRecord(w *trainmeterv1.RunWindow, d deletion) ([]byte, error) {
	w = proto.Clone(w).(*trainmeterv1.RunWindow)
	w.RunId = ""
	return proto.Marshal(&storev1.DeletedRunWindow{Window: w, Deletion: d.id, GpuPricePerHour: d.price, GpuName: d.gpuName})
}

// appendDeletedRecords adds the dw/ records of a batch's windows dropped
// as a deleted run's to its raw records (written, like them, once).
func appendDeletedRecords(out []kv, node string, seq uint64, gone []deletedWindow) ([]kv, error) {
	for _, g := range gone {
		v, err := deletedRecord(g.w, g.d)
		if err != nil {
			return nil, err
		}
		k := deletedWindowKey(node, be32(be64(tkey(nil, g.w.GetStart()), seq), uint32(g.i)), g.d.id)
		out = append(out, kv{k, v})
	}
	return out, nil
}

// moveChunk bounds the windows one transaction of moveRunWindows moves.
const moveChunk = 2000

// moveRunWindows turns run id's windows (w/) into the deleted run's (dw/),
// each keeping its expiry, and returns how many it moved.
func (s *Store) moveRunWindows(id string, d deletion) (moved int, err error) {
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
				v, err := deletedRecord(w, d)
				if err != nil {
					return err
				}
				if err := setExpiring(txn, rec{deletedWindowKey(string(rest[:len(rest)-21]), rest[len(rest)-20:], d.id), v, r.expiresAt}); err != nil {
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

// scanDeletedWindows calls f for every deleted run's window whose start is
// in the period.
func scanDeletedWindows(txn *badger.Txn, in func(*timestamppb.Timestamp) bool, f func(node string, d *storev1.DeletedRunWindow) error) error {
	const prefix = "dw/"
	return scan(txn, under([]byte(prefix)), nil, func(k, v []byte) error {
		if len(k) < len(prefix)+1+28 {
			return nil
		}
		d := &storev1.DeletedRunWindow{}
		if err := proto.Unmarshal(v, d); err != nil || !in(d.GetWindow().GetStart()) {
			return err
		}
		return f(string(k[len(prefix):len(k)-29]), d)
	})
}

// dropDeleted returns b without the records of runs deleted while live (a
// copy; b itself is left as it is), or b when it has none, and the run
// windows it dropped (kept as the deleted runs' usage).
func (s *Store) dropDeleted(b *trainmeterv1.Batch) (*trainmeterv1.Batch, []deletedWindow) {
	s.deleted.mu.Lock()
	defer s.deleted.mu.Unlock()
	if len(s.deleted.m) == 0 {
		return b, nil
	}
	gone := func(id string) bool {
		_, ok := s.deleted.m[id]
		return ok
	}
	if !slices.ContainsFunc(batchRuns(b), gone) {
		return b, nil
	}
	// A run_start after the deletion starts the id afresh: records from
	// that run_start on are kept.
	keepFrom := map[string]int64{}
	for _, e := range b.GetRunEvents() {
		rs := e.GetRunStart()
		if d, ok := s.deleted.m[rs.GetRunId()]; ok && rs != nil && nanosOf(rs.GetTime()) > d.at {
			keepFrom[rs.GetRunId()] = nanosOf(rs.GetTime())
		}
	}
	// The deletions of the runs whose ids start afresh here, for their
	// windows before that start.
	del := map[string]deletion{}
	for id := range keepFrom {
		del[id] = s.deleted.m[id]
		delete(s.deleted.m, id)
		if err := s.DeleteRecord(deletedNS, id); err != nil {
			s.log.Warn("store: clearing the deletion mark of a reused run id", "run_id", id, "err", err)
		}
	}
	keep := func(id string, t int64) bool {
		from, restarted := keepFrom[id]
		return !gone(id) && (!restarted || t >= from)
	}
	nb := proto.Clone(b).(*trainmeterv1.Batch)
	nb.RunWindows = nb.RunWindows[:0]
	var dropped []deletedWindow
	for i, w := range b.GetRunWindows() {
		if keep(w.GetRunId(), w.GetStart().AsTime().UnixNano()) {
			nb.RunWindows = append(nb.RunWindows, w)
		} else {
			d, ok := s.deleted.m[w.GetRunId()]
			if !ok {
				d = del[w.GetRunId()]
			}
			dropped = append(dropped, deletedWindow{i: i, w: w, d: d})
		}
	}
	nb.RunEvents = nb.RunEvents[:0]
	for _, e := range b.GetRunEvents() {
		if keep(aggregate.EventRunID(e), aggregate.EventTime(e).AsTime().UnixNano()) {
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
		if !gone(l.GetRunId()) {
			nb.Losses = append(nb.Losses, l)
		}
	}
	return nb, dropped
}

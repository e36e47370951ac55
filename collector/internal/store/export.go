package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"iter"
	"slices"
	"strings"

	"github.com/dgraph-io/badger/v4"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Export calls fn with the store's whole content (storage.Dump) from one
// snapshot, after checking that every key is of a kind the dump yields:
// a store holding anything else is refused, not moved in part. Records
// past their retention are not read (badger hides expired keys).
func (s *Store) Export(fn func(storage.Dump) error) error {
	return s.db.View(func(txn *badger.Txn) error {
		if err := checkPrefixes(txn); err != nil {
			return err
		}
		return fn(dump{txn})
	})
}

// exported are the key prefixes a dump yields (store.go's layout), and
// m/format, which is the data directory's own.
var exported = []string{"a/", "an/", "n/", "b/", "r/", "w/", "v/", "s/", "nl/", "dw/", "x/", "m/"}

// derived are the key prefixes a dump leaves out because they are made
// from what it yields: the runs' summaries and live markers
// (runindex.go), which an importer keeps its own way.
var derived = []string{"ai/", "al/"}

func checkPrefixes(txn *badger.Txn) error {
	it := txn.NewIterator(badger.IteratorOptions{})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		k := it.Item().Key()
		slash := bytes.IndexByte(k, '/')
		if slash < 0 || !slices.Contains(exported, string(k[:slash+1])) && !slices.Contains(derived, string(k[:slash+1])) {
			return fmt.Errorf("store: key %q is of no kind this trainmeter exports", k)
		}
	}
	return nil
}

type dump struct{ txn *badger.Txn }

// each yields what row makes of every key under prefix, in key order.
func each[T any](txn *badger.Txn, prefix string, row func(k, v []byte) (T, error)) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		err := scan(txn, badger.IteratorOptions{Prefix: []byte(prefix), PrefetchSize: 256}, nil, func(k, v []byte) error {
			r, err := row(k[len(prefix):], v)
			if err != nil {
				return fmt.Errorf("store: %s%q: %w", prefix, k[len(prefix):], err)
			}
			if !yield(r, nil) {
				return errStop
			}
			return nil
		})
		if err != nil {
			var zero T
			yield(zero, err)
		}
	}
}

func (d dump) Runs() iter.Seq2[*aggregate.State, error] {
	return each(d.txn, "a/", func(k, v []byte) (*aggregate.State, error) {
		st, err := aggregate.Unmarshal(v)
		if err == nil && st.GetNodesApart() {
			err = readNodes(d.txn, string(k), st)
		}
		return st, err
	})
}

func (d dump) Nodes() iter.Seq2[*trainmeterv1.NodeStatus, error] {
	return each(d.txn, "n/", func(_, v []byte) (*trainmeterv1.NodeStatus, error) {
		ns := &trainmeterv1.NodeStatus{}
		return ns, proto.Unmarshal(v, ns)
	})
}

// AppliedBatches yields the batches r/ records stand for (their window
// start known), then those of b/ marks (not known; a batch with both is
// yielded twice).
func (d dump) AppliedBatches() iter.Seq2[storage.AppliedBatch, error] {
	return func(yield func(storage.AppliedBatch, error) bool) {
		for a, err := range each(d.txn, "r/", func(k, v []byte) (storage.AppliedBatch, error) {
			node, start, seq, _, err := parseTail(k, 0)
			if err != nil {
				return storage.AppliedBatch{}, err
			}
			boot, err := storedBoot(v)
			return storage.AppliedBatch{Node: node, Boot: boot, Seq: seq, Start: start, StartKnown: true}, err
		}) {
			if !yield(a, err) || err != nil {
				return
			}
		}
		for a, err := range each(d.txn, "b/", func(k, _ []byte) (storage.AppliedBatch, error) {
			// <node>\0<boot>\0<seq:8>
			if len(k) < 10 || k[len(k)-9] != 0 {
				return storage.AppliedBatch{}, fmt.Errorf("malformed key")
			}
			node, boot, ok := strings.Cut(string(k[:len(k)-9]), "\x00")
			if !ok {
				return storage.AppliedBatch{}, fmt.Errorf("malformed key")
			}
			return storage.AppliedBatch{Node: node, Boot: boot, Seq: binary.BigEndian.Uint64(k[len(k)-8:])}, nil
		}) {
			if !yield(a, err) || err != nil {
				return
			}
		}
	}
}

// Raw keys end <start:8><seq:8>, then <i:4> (run windows and events,
// deleted windows), then <deletion:8> (deleted windows), after
// <node>\0 or <run>\0<node>\0.
func (d dump) Raw(kind storage.RawKind) iter.Seq2[storage.RawRecord, error] {
	perBatch := func(prefix string) iter.Seq2[storage.RawRecord, error] {
		return each(d.txn, prefix, func(k, v []byte) (storage.RawRecord, error) {
			node, start, seq, _, err := parseTail(k, 0)
			return storage.RawRecord{Node: node, Start: start, Seq: seq, Value: v}, err
		})
	}
	perRun := func(prefix string) iter.Seq2[storage.RawRecord, error] {
		return each(d.txn, prefix, func(k, v []byte) (storage.RawRecord, error) {
			head, start, seq, tail, err := parseTail(k, 4)
			run, node, ok := strings.Cut(head, "\x00")
			if err == nil && !ok {
				err = fmt.Errorf("malformed key")
			}
			return storage.RawRecord{Run: run, Node: node, Start: start, Seq: seq, I: binary.BigEndian.Uint32(tail), Value: v}, err
		})
	}
	switch kind {
	case storage.RawRunWindows:
		return perRun("w/")
	case storage.RawRunEvents:
		return perRun("v/")
	case storage.RawNodeWindows:
		return perBatch("r/")
	case storage.RawSamples:
		return perBatch("s/")
	case storage.RawNodeLosses:
		return perBatch("nl/")
	case storage.RawDeletedWindows:
		return each(d.txn, "dw/", func(k, v []byte) (storage.RawRecord, error) {
			node, start, seq, tail, err := parseTail(k, 12)
			return storage.RawRecord{Node: node, Start: start, Seq: seq, I: binary.BigEndian.Uint32(tail),
				Deletion: binary.BigEndian.Uint64(tail[4:]), Value: v}, err
		})
	}
	return func(yield func(storage.RawRecord, error) bool) {
		yield(storage.RawRecord{}, fmt.Errorf("store: no raw records of kind %d", kind))
	}
}

// parseTail splits a raw key (its prefix cut) <head>\0<start:8><seq:8><extra>
// into head, the start as Unix ns (tkey), the seq and the extra bytes.
func parseTail(k []byte, extra int) (head string, start int64, seq uint64, tail []byte, err error) {
	n := len(k) - extra - 16
	if n < 1 || k[n-1] != 0 {
		return "", 0, 0, make([]byte, extra), fmt.Errorf("malformed key")
	}
	start = int64(binary.BigEndian.Uint64(k[n:]) ^ (1 << 63))
	return string(k[:n-1]), start, binary.BigEndian.Uint64(k[n+8:]), k[n+16:], nil
}

func (d dump) Records() iter.Seq2[storage.Record, error] {
	return each(d.txn, "x/", func(k, v []byte) (storage.Record, error) {
		ns, key, ok := strings.Cut(string(k), "\x00")
		if !ok {
			return storage.Record{}, fmt.Errorf("malformed key")
		}
		return storage.Record{NS: ns, Key: key, Value: v}, nil
	})
}

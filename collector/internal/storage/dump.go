package storage

import (
	"iter"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Dump is a store's whole content read from one snapshot, for moving it
// into another store (`trainmeter migrate`): its state and rows as stored,
// not the batches that made them, since raw records may be past their
// retention while the aggregates they made are kept. Each sequence yields
// in key order and streams (a Dump holds no more than one row); a row's
// bytes are valid until the sequence yields the next. A sequence that
// fails yields its error last.
type Dump interface {
	// Runs yields every run's aggregate, its node states in it.
	Runs() iter.Seq2[*aggregate.State, error]
	// Nodes yields every node's stored status.
	Nodes() iter.Seq2[*trainmeterv1.NodeStatus, error]
	// AppliedBatches yields the key of every batch applied whose
	// deduplication the store still holds.
	AppliedBatches() iter.Seq2[AppliedBatch, error]
	// Raw yields every raw record of a kind.
	Raw(kind RawKind) iter.Seq2[RawRecord, error]
	// Records yields every record of every namespace (Records).
	Records() iter.Seq2[Record, error]
}

// AppliedBatch is the key of a batch applied.
type AppliedBatch struct {
	Node, Boot string
	Seq        uint64
	// Start is the batch's window start (Unix ns) when StartKnown: a store
	// may hold the key of a batch without its window start.
	Start      int64
	StartKnown bool
}

// RawKind is a kind of raw record.
type RawKind int

const (
	RawRunWindows     RawKind = iota // a run's window (trainmeter.v1.RunWindow)
	RawRunEvents                     // a run's event (trainmeter.v1.RunEvent)
	RawNodeWindows                   // a batch's GPU and host windows (a trainmeter.v1.Batch holding them)
	RawSamples                       // a batch's raw samples (a trainmeter.v1.Batch holding them)
	RawNodeLosses                    // a batch's node loss records (a trainmeter.v1.Batch holding them)
	RawDeletedWindows                // a deleted run's window (trainmeter.store.v1.DeletedRunWindow)
)

// RawKinds are every kind of raw record.
var RawKinds = []RawKind{RawRunWindows, RawRunEvents, RawNodeWindows, RawSamples, RawNodeLosses, RawDeletedWindows}

// RawRecord is a raw record with its key: the run (run windows and events
// only), the node that sent it, its time (a window's start, an event's
// time; Unix ns), the sequence number of its batch, its index in the batch
// (run windows and events, deleted windows) and the deletion (deleted
// windows only). Value is the record as stored (its locked prices in it).
type RawRecord struct {
	Run, Node string
	Start     int64
	Seq       uint64
	I         uint32
	Deletion  uint64
	Value     []byte
}

// Record is one of the collector's own records.
type Record struct {
	NS, Key string
	Value   []byte
}

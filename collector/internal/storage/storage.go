// Package storage is the collector's store seam: what its services need
// from a database, and the words they share with it. BadgerDB
// (collector/internal/store) implements it; a second implementation must
// pass the conformance suite in storage/storagetest.
//
// What every implementation guarantees (docs/storage.md):
//
//   - A batch is applied exactly once per (node, boot, seq): a batch
//     applied before changes nothing and is reported Duplicate, across
//     restarts and across collectors sharing one database.
//   - A batch's raw records and the changes to its runs' aggregates are
//     one transaction: all of them or none.
//   - A call returns nil only once its writes are durable: the ingest
//     stream acks a batch after ApplyBatchResult returns, so an ack means
//     committed.
//
// Methods are safe for concurrent use.
package storage

import (
	"errors"
	"fmt"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/internal/plural"
	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Store is a collector database: everything the collector's services use.
type Store interface {
	Ingester
	Runs
	Windows
	Records
	// DeleteRun removes a run's aggregate, windows and events; its
	// windows stay in usage as the deleted run's. It returns how many raw
	// records went, or ErrNotFound. Later batches of the run start it
	// again.
	DeleteRun(id string) (records int, err error)
	// DeleteLiveRun is DeleteRun for a run that has not ended: its data in
	// later batches is dropped (kept in usage as the deleted run's) until
	// a run_start after now reuses the id.
	DeleteLiveRun(id string) (records int, err error)
	// Reprice books the GPU time of run id at usdPerHour: all of it (since
	// zero) or that of its windows starting at or after since, and returns
	// the run's report before and after (after nil: nothing to reprice),
	// or ErrNotFound.
	Reprice(id string, since time.Time, usdPerHour float64, reason string, report func(*aggregate.State) *trainmeterv1.RunReport) (before, after *trainmeterv1.RunReport, ch aggregate.Repricing, err error)
}

// Ingester takes what agents send.
type Ingester interface {
	// ApplyBatchResult applies a validated batch from sender exactly once
	// per (sender.Node, sender.Boot, b.Seq), its raw records and its runs'
	// aggregate changes in one transaction, and returns once that is
	// durable. A batch too large for one transaction gives
	// ErrBatchTooLarge.
	ApplyBatchResult(sender Sender, b *trainmeterv1.Batch) (Applied, error)
	// PutHello records a node's hello (boot, GPUs, host energy status) in
	// its status.
	PutHello(h *trainmeterv1.Hello) error
}

// Runs reads run aggregates and node status.
type Runs interface {
	// GetRun returns a run's aggregate, or ErrNotFound.
	GetRun(id string) (*aggregate.State, error)
	// ListRuns returns the aggregates of ids in that order, or of every
	// run by id when ids is empty; unknown ids give a *NotFoundError.
	ListRuns(ids []string) ([]*aggregate.State, error)
	// RunsAfter returns at most limit runs whose ids sort after `after`
	// ("": from the first), in id order: one page of a listing.
	RunsAfter(after string, limit int) ([]*aggregate.State, error)
	// Nodes returns every node's stored status by node name (Connected
	// false: only the ingest server knows it).
	Nodes() ([]*trainmeterv1.NodeStatus, error)
	// SelectRuns returns the ids of the runs f selects, in f's order. It
	// reads each run's summary (aggregate.Summary, kept with the aggregate
	// at every write, computed with the pricing SetPricer set; cost
	// unknown without one), not the aggregates: a listing of a few runs
	// among many reads only the few afterwards.
	SelectRuns(f RunFilter) ([]string, error)
}

// RunFilter selects and orders runs by their summaries.
type RunFilter struct {
	// LiveOnly: only runs that have not ended.
	LiveOnly bool
	// ActiveSince, when set: only runs not ended or that ended at or
	// after it.
	ActiveSince time.Time
	// EndedOnly: only runs that have ended (LiveOnly and EndedOnly
	// together select none).
	EndedOnly bool
	// Model, when set: only runs of that model (metadata.model).
	Model string
	// ByCost orders by total cost, the highest first, runs of unknown cost
	// last, then by id; otherwise by id (byte order).
	ByCost bool
	// ByStart (when ByCost is not set) orders by start, the newest first,
	// runs with no start last, then by id.
	ByStart bool
}

// Selects reports whether f selects a run of summary sum.
func (f RunFilter) Selects(sum aggregate.Summary) bool {
	if (f.LiveOnly && sum.Ended) || (f.EndedOnly && !sum.Ended) || (f.Model != "" && sum.Model != f.Model) {
		return false
	}
	if !f.ActiveSince.IsZero() && sum.Ended && (!sum.HasEnd || sum.EndNanos < f.ActiveSince.UnixNano()) {
		return false
	}
	return true
}

// Windows reads raw records.
type Windows interface {
	// RunTimeline returns a run's windows and events with their nodes, per
	// node in time order.
	RunTimeline(runID string) ([]NodeWindow, []NodeEvent, error)
	// NodeGPUWindows returns a node's GPU windows (each a Batch holding its
	// window, GPU windows and host window) starting in [from, to], in time
	// order.
	NodeGPUWindows(node string, from, to time.Time) ([]*trainmeterv1.Batch, error)
	// UsageScan calls gpu for every GPU-window record and node loss
	// record, run for every run window and deleted for every deleted run's
	// window whose start is in [since, until) (zero: unbounded), all from
	// one snapshot: runs + deleted + idle add up to the node.
	UsageScan(since, until time.Time, gpu func(node string, b *trainmeterv1.Batch) error,
		run func(runID, node string, w *trainmeterv1.RunWindow) error,
		deleted func(node string, d *storev1.DeletedRunWindow) error) error
}

// Records are the collector's own small documents (budgets, alerts, price
// history, advice history) under fixed namespaces; keys sort bytewise and
// values are the owner's bytes. Writes are durable when the call returns.
type Records interface {
	PutRecord(ns, k string, v []byte) error
	// PutRecords writes several records in one transaction.
	PutRecords(ns string, kv map[string][]byte) error
	// PutRecordIfAbsent writes a record unless one is there; it reports
	// whether it wrote (exactly one of concurrent callers wins).
	PutRecordIfAbsent(ns, k string, v []byte) (bool, error)
	// GetRecord returns a record, or ErrNotFound.
	GetRecord(ns, k string) ([]byte, error)
	// DeleteRecord deletes a record; deleting none is no error.
	DeleteRecord(ns, k string) error
	// ScanRecords calls fn for every record of ns whose key starts with
	// keyPrefix, in key order, until fn returns false or an error; v is
	// valid only during the call.
	ScanRecords(ns, keyPrefix string, fn func(k string, v []byte) (bool, error)) error
}

// ErrNotFound is returned for an unknown run or record.
var ErrNotFound = errors.New("not found")

// ErrBatchTooLarge is returned when a batch does not fit in one transaction;
// retrying it cannot succeed.
var ErrBatchTooLarge = errors.New("batch too large for one transaction")

// NotFoundError names the unknown run ids of a ListRuns call.
type NotFoundError struct{ IDs []string }

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("unknown %s: %q", plural.Noun(int64(len(e.IDs)), "run"), e.IDs)
}

// Unwrap makes errors.Is(err, ErrNotFound) true.
func (e *NotFoundError) Unwrap() error { return ErrNotFound }

// Sender is who sent a batch: the node and its agent's boot (from the
// stream's Hello).
type Sender struct {
	Node, Boot string
}

// Refusal is a start the store refused, or a refused start whose node sent
// more records of the run (dropped): what the agent is to be told.
type Refusal struct {
	RunID  string
	Start  int64 // the refused RunStart's time, Unix ns
	Reason string
	// Records is the number of the batch's records of the run dropped.
	Records int
}

// Applied is the outcome of ApplyBatchResult.
type Applied struct {
	// Duplicate: the batch was applied before; nothing changed.
	Duplicate bool
	// Refused lists the runs whose start the batch carried was refused, or
	// whose records from a refused start on it carried were dropped: what
	// the agent is told (StartRefused).
	Refused []Refusal
	// Dropped lists, per run, the batch's records the node may not send:
	// dropped, the rest of the batch applied.
	Dropped []Refusal
	// Batch is the batch as applied when records were dropped from it (nil
	// when none were): what observers of applied batches are to see.
	Batch *trainmeterv1.Batch
}

// NodeWindow is a stored run window with the node that sent it.
type NodeWindow struct {
	Node   string
	Window *trainmeterv1.RunWindow
}

// NodeEvent is a stored run event with the node that sent it.
type NodeEvent struct {
	Node  string
	Event *trainmeterv1.RunEvent
}

package fold

import (
	"crypto/rand"
	"encoding/binary"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Deleting a live run (delete-run --force): its agents go on sending its
// windows until its trainers end it, and each would bring the run back
// without its run_start (no metadata, "running" for ever). A store keeps a
// tombstone per such run (a record in DeletedNS) and drops the run's
// records from later batches (DropDeleted), until a run_start later than
// the deletion starts the id afresh.

// DeletedNS is the records namespace of the tombstones, by run id.
const DeletedNS = "deleted-runs"

// A Deletion is what a deleted run's windows keep (DeletedRunWindow): the
// GPU time and energy stay in usage as "(deleted)", priced as the run was.
type Deletion struct {
	ID      uint64
	Price   float64 // the run's own GPU price per hour; 0: none
	GPUName string
	At      int64 // of a live run's deletion: when, Unix ns
}

// NewDeletion is the deletion of a run whose aggregate is st (nil when it
// is gone: a delete interrupted and done again), with a random id.
func NewDeletion(st *aggregate.State) (Deletion, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return Deletion{}, err
	}
	d := Deletion{ID: binary.BigEndian.Uint64(b[:])}
	if st != nil {
		d.Price, d.GPUName = st.GetRunStart().GetGpuPricePerHour(), st.GetRunStart().GetGpuName()
	}
	return d, nil
}

// Tombstone is the record of a live run's deletion: "<deleted at, Unix ns>
// <deletion id> <price> <GPU name>".
func (d Deletion) Tombstone() []byte {
	return []byte(strconv.FormatInt(d.At, 10) + " " + strconv.FormatUint(d.ID, 10) + " " +
		strconv.FormatFloat(d.Price, 'g', -1, 64) + " " + d.GPUName)
}

// ParseTombstone reads a Tombstone.
func ParseTombstone(v string) (d Deletion, ok bool) {
	f := strings.SplitN(v, " ", 4)
	if len(f) != 4 {
		return d, false
	}
	var err error
	if d.At, err = strconv.ParseInt(f[0], 10, 64); err != nil {
		return d, false
	}
	d.ID, _ = strconv.ParseUint(f[1], 10, 64)
	d.Price, _ = strconv.ParseFloat(f[2], 64)
	d.GPUName = f[3]
	return d, true
}

// DeletedWindow is a run window of a deleted run dropped from a batch: its
// index in the batch and its run's deletion.
type DeletedWindow struct {
	I int
	W *trainmeterv1.RunWindow
	D Deletion
}

// DeletedRecord encodes a deleted run's window as kept for usage: naming no
// run.
func DeletedRecord(w *trainmeterv1.RunWindow, d Deletion) ([]byte, error) {
	w = proto.Clone(w).(*trainmeterv1.RunWindow)
	w.RunId = ""
	return proto.Marshal(&storev1.DeletedRunWindow{Window: w, Deletion: d.ID, GpuPricePerHour: d.Price, GpuName: d.GPUName})
}

// DropDeleted returns b without the records of runs deleted while live
// (deleted looks a tombstone up; runs lists b's runs), a copy, or b itself
// when it has none; the run windows it dropped (kept as the deleted runs'
// usage); and the runs whose ids a run_start after the deletion starts
// afresh, whose tombstones the caller removes.
func DropDeleted(b *trainmeterv1.Batch, runs []string, deleted func(id string) (Deletion, bool)) (*trainmeterv1.Batch, []DeletedWindow, []string) {
	del := map[string]Deletion{}
	for _, id := range runs {
		if d, ok := deleted(id); ok {
			del[id] = d
		}
	}
	if len(del) == 0 {
		return b, nil, nil
	}
	// A run_start after the deletion starts the id afresh: records from
	// that run_start on are kept.
	keepFrom := map[string]int64{}
	var restarted []string
	for _, e := range b.GetRunEvents() {
		rs := e.GetRunStart()
		if d, ok := del[rs.GetRunId()]; ok && rs != nil && NanosOf(rs.GetTime()) > d.At {
			if _, seen := keepFrom[rs.GetRunId()]; !seen {
				restarted = append(restarted, rs.GetRunId())
			}
			keepFrom[rs.GetRunId()] = NanosOf(rs.GetTime())
		}
	}
	gone := func(id string) bool {
		_, ok := del[id]
		_, restarted := keepFrom[id]
		return ok && !restarted
	}
	keep := func(id string, t int64) bool {
		from, restarted := keepFrom[id]
		return !gone(id) && (!restarted || t >= from)
	}
	nb := proto.Clone(b).(*trainmeterv1.Batch)
	nb.RunWindows = nb.RunWindows[:0]
	var dropped []DeletedWindow
	for i, w := range b.GetRunWindows() {
		if keep(w.GetRunId(), w.GetStart().AsTime().UnixNano()) {
			nb.RunWindows = append(nb.RunWindows, w)
		} else {
			dropped = append(dropped, DeletedWindow{I: i, W: w, D: del[w.GetRunId()]})
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
	return nb, dropped, restarted
}

package fold

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// A batch's raw records as both stores keep them: its run windows and
// events one by one, and per batch a node record (GPU and host windows),
// a samples record and a node-loss record, each a Batch holding only
// those and the window.

// HasNodeRecord: the batch has GPU or host windows (a node record).
func HasNodeRecord(b *trainmeterv1.Batch) bool {
	return len(b.GetGpuWindows()) > 0 || b.GetHost() != nil || len(b.GetHostEnergy()) > 0
}

// NodeRecord is the batch's GPU and host windows as one record, carrying
// the sender's boot (with its key it identifies the batch).
func NodeRecord(b *trainmeterv1.Batch, boot string) *trainmeterv1.Batch {
	return &trainmeterv1.Batch{WindowStart: b.GetWindowStart(), WindowEnd: b.GetWindowEnd(), GpuWindows: b.GetGpuWindows(), Host: b.GetHost(),
		HostEnergy: b.GetHostEnergy(), StoredBootId: boot}
}

// SamplesRecord is the batch's raw samples (only from agents asked for
// them), nil when it has none.
func SamplesRecord(b *trainmeterv1.Batch) *trainmeterv1.Batch {
	if len(b.GetRawSamples()) == 0 {
		return nil
	}
	return &trainmeterv1.Batch{WindowStart: b.GetWindowStart(), WindowEnd: b.GetWindowEnd(), RawSamples: b.GetRawSamples()}
}

// LossesIn is a node-loss record with only the losses whose dropped data
// began in the period (by first_window_start; the one batch's
// window_start, or the record's, where a loss has none), nil when none did.
func LossesIn(b *trainmeterv1.Batch, in func(*timestamppb.Timestamp) bool) *trainmeterv1.Batch {
	kept := &trainmeterv1.Batch{WindowStart: b.GetWindowStart()}
	for _, l := range b.GetNodeLosses() {
		at := l.GetFirstWindowStart()
		if at == nil {
			at = l.GetWindowStart()
		}
		if at == nil {
			at = b.GetWindowStart()
		}
		if in(at) {
			kept.NodeLosses = append(kept.NodeLosses, l)
		}
	}
	if len(kept.NodeLosses) == 0 {
		return nil
	}
	return kept
}

// Locked prices (docs/costs.md): each window is priced as it is stored, at
// the prices in force then, and its records carry those prices: the run's
// aggregate books the cost (aggregate.State.BookPrice), the run window's
// record and the batch's node record (idle GPU time) carry the price
// (RunWindow, Batch: locked_*). Only Reprice changes a booked price.

// AppendStamp appends the encoded stamp to a record's encoding: protobuf
// merges the concatenation, so the stamp's fields are set in the record
// without decoding it. The record was encoded with no locked_* field set
// (ClearLocked), so nothing of it is left to override.
func AppendStamp(v []byte, stamp proto.Message) ([]byte, error) {
	b, err := proto.Marshal(stamp)
	if err != nil {
		return nil, err
	}
	return append(append(make([]byte, 0, len(v)+len(b)), v...), b...), nil
}

// NodeGPUName is the name of a node's GPUs from its hello (the last one's,
// as usage rows name them).
func NodeGPUName(ns *trainmeterv1.NodeStatus) string {
	name := ""
	for _, g := range ns.GetGpus() {
		name = g.GetName()
	}
	return name
}

// IdleStamp is the price of node's idle GPU time and energy in b's window,
// for its node record.
func IdleStamp(p aggregate.Pricer, node, gpu string, b *trainmeterv1.Batch) *trainmeterv1.Batch {
	st := &trainmeterv1.Batch{PriceLocked: true}
	if price, src, ok := p.GPUPrice(0, node, gpu); ok {
		st.LockedUsdPerGpuHour, st.LockedPriceSource = &price, src
	}
	from, to := b.GetWindowStart().AsTime(), b.GetWindowEnd().AsTime()
	if to.Sub(from) > aggregate.MaxBandedWindow {
		to = from
	}
	var perJ float64
	if _, ok := p.EnergyRate(from, to, func(_ string, _, usd float64) { perJ += usd }); ok {
		st.LockedUsdPerJoule = &perJ
	}
	return st
}

// ClearLocked returns b without prices in the fields only a store sets (a
// copy when it had any).
func ClearLocked(b *trainmeterv1.Batch) *trainmeterv1.Batch {
	set := b.GetPriceLocked() || b.LockedUsdPerGpuHour != nil || b.LockedUsdPerJoule != nil || b.GetLockedPriceSource() != ""
	for _, w := range b.GetRunWindows() {
		set = set || w.GetPriceLocked() || w.LockedUsdPerGpuHour != nil || w.LockedUsdPerJoule != nil || w.GetLockedPriceSource() != ""
	}
	if !set {
		return b
	}
	b = proto.CloneOf(b)
	b.PriceLocked, b.LockedUsdPerGpuHour, b.LockedPriceSource, b.LockedUsdPerJoule = false, nil, "", nil
	for _, w := range b.GetRunWindows() {
		w.PriceLocked, w.LockedUsdPerGpuHour, w.LockedPriceSource, w.LockedUsdPerJoule = false, nil, "", nil
	}
	return b
}

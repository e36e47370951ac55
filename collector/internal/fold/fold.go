package fold

import (
	"slices"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// BatchRuns lists the run ids a batch touches, sorted.
func BatchRuns(b *trainmeterv1.Batch) []string {
	var out []string
	for _, w := range b.GetRunWindows() {
		out = append(out, w.GetRunId())
	}
	for _, e := range b.GetRunEvents() {
		out = append(out, aggregate.EventRunID(e))
	}
	for _, l := range b.GetLosses() {
		out = append(out, l.GetRunId())
	}
	for _, h := range b.GetHostEnergy() {
		for _, sh := range h.GetRuns() {
			out = append(out, sh.GetRunId())
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Booking is how a store books windows as it folds them: tariff bands,
// carbon, and the prices in force (nil Pricer: windows stay unpriced).
type Booking struct {
	Bands  aggregate.EnergyBands
	Carbon aggregate.CarbonBooker
	Pricer aggregate.Pricer
}

// Fold folds an admitted batch of node into aggs (an aggregate for every
// run it names), with the run losses that count (those of batches not
// held after all), at now. With a pricer it returns each run window's
// price stamp, by the window's index, for its raw record (docs/costs.md,
// "Locked prices"); nodeGPU is the node's GPU name from its hello.
func Fold(aggs map[string]*aggregate.State, node, nodeGPU string, b *trainmeterv1.Batch, bk Booking, runLosses []*trainmeterv1.DataLoss, now time.Time) []*trainmeterv1.RunWindow {
	// Starts first, then windows, evals and ends, so that a batch that
	// carries a whole short run folds the same as one split over batches.
	for _, e := range b.GetRunEvents() {
		if ev := e.GetRunStart(); ev != nil {
			aggs[ev.GetRunId()].AddStart(node, ev)
		}
	}
	var stamps []*trainmeterv1.RunWindow
	for _, w := range b.GetRunWindows() {
		st := aggs[w.GetRunId()]
		st.AddWindowBooked(node, w, bk.Bands, bk.Carbon)
		if bk.Pricer != nil {
			stamp := &trainmeterv1.RunWindow{}
			st.BookPrice(node, w, bk.Pricer, nodeGPU).Stamp(stamp)
			stamps = append(stamps, stamp)
		}
	}
	for _, e := range b.GetRunEvents() {
		if ev := e.GetEval(); ev != nil {
			aggs[ev.GetRunId()].AddEval(node, ev)
		}
	}
	// A run's last host energy interval may come a batch after its end:
	// it is folded whenever it comes (the run's figures, not its end).
	for _, h := range b.GetHostEnergy() {
		for _, sh := range h.GetRuns() {
			aggs[sh.GetRunId()].AddHostEnergy(node, h, sh)
		}
	}
	for _, e := range b.GetRunEvents() {
		if ev := e.GetRunEnd(); ev != nil {
			aggs[ev.GetRunId()].AddEnd(node, ev)
		}
	}
	for _, st := range aggs {
		st.NoteEnded(now)
	}
	for _, l := range runLosses {
		aggs[l.GetRunId()].AddLoss(node, l)
	}
	return stamps
}

// RepriceWindow books window w at usdPerHour when it starts at or after
// since (zero: every window), counting what it was booked at in ch; it
// reports whether it did.
func RepriceWindow(w *trainmeterv1.RunWindow, since time.Time, usdPerHour float64, ch *aggregate.Repricing) bool {
	if !since.IsZero() && w.GetStart().AsTime().Before(since) {
		return false
	}
	gs := w.GetGpuSeconds()
	ch.GPUSeconds += gs
	switch {
	case !w.GetPriceLocked():
		ch.UnbookedS += gs
	case w.LockedUsdPerGpuHour == nil:
		ch.UnpricedS += gs
	default:
		ch.BookedUSD += gs / 3600 * w.GetLockedUsdPerGpuHour()
	}
	w.PriceLocked = true
	w.LockedUsdPerGpuHour, w.LockedPriceSource = &usdPerHour, "repriced"
	return true
}

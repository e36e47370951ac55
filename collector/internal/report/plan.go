package report

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/trainmeter/trainmeter/internal/money"
	"github.com/trainmeter/trainmeter/internal/plural"
)

// priceSourceWords say where a run's GPU-hour price came from.
var priceSourceWords = map[string]string{
	"run_start": "run_start (the trainer's gpu_price_per_hour)",
	"node":      "node (serve --node-gpu-price)",
	"amortized": "amortized (owned GPU: purchase − residual over its lifetime, serve --owned-hardware)",
	"catalog":   "catalog (the GPU price catalog's current price)",
	"flag":      "flag (serve --gpu-price-per-hour)",
	"mixed":     "mixed (nodes priced by different rules)",
	"repriced":  "repriced (trainmeter reprice)",
}

// PriceSourceWords says in words where a run's GPU-hour price came from.
func PriceSourceWords(src string) string { return cmp.Or(priceSourceWords[src], src) }

// writeReprice says when the run's booked cost was last changed by
// `trainmeter reprice`, from what and why (docs/costs.md, "Locked prices").
func writeReprice(line func(string, string, ...any), r *RunReport) {
	if r.GetRepricedAt() == nil {
		return
	}
	was := "no cost"
	if r.PreviousTotalCostUsd != nil {
		was = money.Amount(r.GetPreviousTotalCostUsd()) + " total"
		if r.PreviousCostUsd != nil {
			was += ", GPU " + money.Amount(r.GetPreviousCostUsd())
		}
	}
	line("repriced", "%s (was %s): %s", r.GetRepricedAt().AsTime().UTC().Format(TimeFormat), was, strconv.Quote(r.GetRepriceReason()))
}

// writePlan adds what the run was started with: its cost cap, and the
// estimate next to the cost so far (the final cost once it ended).
func writePlan(line func(string, string, ...any), r *RunReport) {
	if r.MaxCostUsd != nil {
		line("max cost", "%s (its ranks are told to stop when the total reaches it)", money.USD(r.GetMaxCostUsd()))
	}
	e := r.GetEstimate()
	if e == nil {
		if msg := r.GetEstimateError(); msg != "" {
			line("estimate", "none at start: %s", msg)
		}
		return
	}
	c, w, k := e.GetCostUsd(), e.GetWallS(), e.GetEnergyKwh()
	runs := plural.Noun(int64(len(e.GetBasedOn())), "run")
	if c != nil {
		band := money.USDs(c.GetMid(), c.GetLow(), c.GetHigh())
		line("estimate", "%s (band %s to %s) for %d tokens on %d GPU(s), from %d past %s", band[0], band[1], band[2],
			e.GetTokens(), e.GetGpus(), len(e.GetBasedOn()), runs)
	} else {
		line("estimate", "- (no price) for %d tokens on %d GPU(s), from %d past %s", e.GetTokens(), e.GetGpus(), len(e.GetBasedOn()), runs)
	}
	line("  est. time", "%s (%s to %s)", DurS(w.GetMid()), DurS(w.GetLow()), DurS(w.GetHigh()))
	line("  est. energy", "%.4g kWh (%.4g to %.4g)", k.GetMid(), k.GetLow(), k.GetHigh())
	if r.TotalCostUsd != nil && c.GetMid() > 0 {
		what := "cost so far"
		if r.GetEnded() {
			what = "final cost"
		}
		line("  vs estimate", "%s %s = %.0f%% of the estimate", what, money.USD(r.GetTotalCostUsd()), 100*r.GetTotalCostUsd()/c.GetMid())
	}
	for _, n := range e.GetNotes() {
		line("  note", "%s", n)
	}
}

// DurS is a duration in seconds as 1h2m, 5m30s, 45s.
func DurS(s float64) string {
	d := time.Duration(s * float64(time.Second)).Round(time.Second)
	if d < time.Second {
		return fmt.Sprintf("%.2fs", s)
	}
	ds := d.String()
	if strings.HasSuffix(ds, "m0s") {
		ds = strings.TrimSuffix(ds, "0s")
	}
	return ds
}

// Package report renders run reports: the CSV contract (docs/measurement.md,
// "Per-run figures"), a table for terminals and a readable per-run report.
//
// CSV rules:
//   - Columns are exactly Header(), in that order: run_id, the contract
//     columns, the metadata columns, the required extras, then further extras.
//     New columns are only ever appended.
//   - An unknown value is an empty cell, never 0, NaN or Inf: metadata ints
//     without their has_ flag, costs without a price, J_per_token/E10k_J
//     without measured tokens, rates without a measured period, energy figures
//     of the measured period when the run has no measured window yet, VRAM when
//     no memory sample arrived, and any non-finite value.
//   - Floats are rounded to 6 decimals and written with
//     strconv.FormatFloat(v, 'f', -1, 64) (no exponent, no trailing zeros).
//     J_per_token, E10k_J, the per-unit costs (usd_per_sample, _epoch,
//     _accuracy_point), flops_* and J_per_PFLOP are rounded to 9 significant
//     digits instead, so tiny (or huge) figures keep their precision.
//   - Times are RFC 3339 in UTC with up to nanosecond precision.
package report

import (
	"cmp"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/trainmeter/trainmeter/internal/plural"
	"github.com/trainmeter/trainmeter/pkg/money"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// RunReport is the report message the collector produces.
type RunReport = trainmeterv1.RunReport

var header = []string{
	"run_id",
	// contract columns
	"tokens_processed", "wall_s", "warmup_s", "energy_J", "avg_power_W", "peak_power_W",
	"tok_per_s", "J_per_token", "E10k_J", "vram_peak_MB", "vram_avg_MB",
	// metadata
	"model", "dataset", "backend", "optimizer", "batch_size", "grad_accum", "seq_len",
	"precision", "seed", "notes",
	// required extras
	"tokens_measured", "energy_total_J", "energy_J_integrated", "energy_method", "gpus",
	"nodes", "gpu_name", "gpu_hours", "cost_usd", "energy_kWh", "energy_cost_usd",
	"usd_per_mtok", "co2_kg",
	// further extras
	"gpu_price_per_hour", "energy_disagreement_pct", "energy_estimated", "gap_s", "steps",
	"data_wait_s", "compute_s", "data_wait_share", "last_loss", "evals", "status",
	"start_time", "end_time",
	// data dropped on an agent (spool or disk full, rejected batch)
	"complete", "lost_batches", "lost_tokens", "lost_energy_J",
	// cost model and throughput/compute report (docs/costs.md)
	"total_cost_usd", "projected_cost_usd", "priority_multiplier", "gpu_price_source",
	"usd_per_sample", "epochs_done", "usd_per_epoch", "accuracy_points", "usd_per_accuracy_point",
	"efficiency_score", "steps_per_s", "epoch_s", "est_total_s", "flops_per_step", "flops_total",
	"peak_TFLOPS", "mfu", "J_per_PFLOP",
	// run lifecycle (docs/measurement.md, "End status")
	"end_status",
	// shared GPUs (docs/measurement.md, "Shared GPUs and idle")
	"gpu_share_method", "shared_gpu_s",
	// where the GPU-hour price came from (docs/costs.md)
	"price_source",
	// whole-run power, warmup included (docs/measurement.md)
	"avg_power_total_W", "peak_power_total_W",
	// stated uncertainty of energy_J, ± % (docs/accuracy.md)
	"energy_uncertainty_pct",
	// host energy from RAPL, whole run (docs/measurement.md, "Host energy (CPU and DRAM)")
	"cpu_energy_J", "dram_energy_J", "node_energy_J",
	// carbon by the hour (docs/costs.md, "CO2")
	"co2_gco2_per_kwh", "co2_source", "carbon_zone",
	// the runs' host energy (CPU+DRAM) in batches dropped on an agent, next
	// to lost_energy_J (GPUs); last, so the columns before keep their places
	"lost_host_energy_J",
	// locked prices: the run's latest reprice (docs/costs.md, "Locked prices")
	"repriced_at", "previous_cost_usd", "previous_total_cost_usd", "reprice_reason",
	// why a rate after warmup is empty, and the share of the time after
	// warmup with energy (docs/measurement.md, "Rates after warmup")
	"rates_unavailable", "energy_coverage",
	// the cause of a failed end, as the trainer gave it (docs/measurement.md,
	// "End status")
	"end_error",
}

// Header returns the CSV header row.
func Header() []string { return append([]string(nil), header...) }

// Status is "ended" for a finished run, "running" otherwise.
func Status(r *RunReport) string {
	if r.GetEnded() {
		return "ended"
	}
	return "running"
}

// EndStatus is how the run ended ("ok", "error", "exit 3", "signal
// SIGTERM", "stopped: budget", "lost"), "running" while it runs, and
// "ended" for a run whose agents sent no status.
func EndStatus(r *RunReport) string {
	switch {
	case !r.GetEnded():
		return "running"
	case r.GetEndStatus() == "":
		return "ended"
	}
	return r.GetEndStatus()
}

// Failed reports whether the run ended in failure (error, a non-zero exit,
// a signal, lost): its figures describe a partial run, so forecasts, ROI,
// the optimizer and baselines leave it out. A run stopped on request
// (stopped: budget) did what it was asked and is not failed.
func Failed(r *RunReport) bool {
	if !r.GetEnded() {
		return false
	}
	switch st := r.GetEndStatus(); {
	case st == "", st == "ok", st == "ended", strings.HasPrefix(st, "stopped"):
		return false
	}
	return true
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// F formats a float for the CSV: rounded to 6 decimals; "" if not finite.
func F(v float64) string {
	if !finite(v) {
		return ""
	}
	v = math.Round(v*1e6) / 1e6
	if !finite(v) { // v*1e6 overflowed; keep the value as it is
		return ""
	}
	if v == 0 {
		v = 0 // no "-0"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// G9 formats a float rounded to 9 significant digits, without exponent.
func G9(v float64) string {
	if !finite(v) {
		return ""
	}
	v, _ = strconv.ParseFloat(strconv.FormatFloat(v, 'g', 9, 64), 64)
	if v == 0 {
		v = 0
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

func fIf(ok bool, v float64) string {
	if !ok {
		return ""
	}
	return F(v)
}

func iIf(ok bool, v int64) string {
	if !ok {
		return ""
	}
	return strconv.FormatInt(v, 10)
}

func u(v uint64) string { return strconv.FormatUint(v, 10) }

func tm(r *RunReport, end bool) string {
	t := r.GetStart()
	if end {
		t = r.GetEnd()
	}
	if t == nil {
		return ""
	}
	return t.AsTime().UTC().Format(time.RFC3339Nano)
}

// TimeFormat is the one format of times in human output (tables, reports,
// alerts): RFC 3339 in UTC to the second, e.g. 2025-03-01T12:00:00Z. UTC,
// so that what one user pastes reads the same to a colleague elsewhere and
// sorts as text; the CSV and --json carry the same instant with its
// fraction of a second.
const TimeFormat = time.RFC3339

// Time formats t for human output (TimeFormat).
func Time(t time.Time) string { return t.UTC().Format(TimeFormat) }

// humanTime is the run's start or end for human output; "" when unknown.
func humanTime(r *RunReport, end bool) string {
	t := r.GetStart()
	if end {
		t = r.GetEnd()
	}
	if t == nil {
		return ""
	}
	return Time(t.AsTime())
}

// known tells which figures of r are defined.
type known struct {
	times, measured, period, perToken, vram, counter, usdPerMtok, dataShare bool
	// The rates after warmup the collector knows (set, not null).
	tokPerS, jPerToken, avgPower bool
}

func knownOf(r *RunReport) known {
	k := known{
		times:    r.GetStart() != nil,
		measured: r.GetEnergyMethod() != "",
		perToken: r.GetTokensMeasured() > 0 && r.GetEnergyMethod() != "",
		vram:     r.GetVramPeakMb() > 0 || r.GetVramAvgMb() > 0,
		counter:  r.GetEnergyMethod() == "counter" || r.GetEnergyMethod() == "mixed",
		usdPerMtok: r.GetTokensProcessed() > 0 &&
			(r.GetHasCost() || r.GetHasEnergyCost()),
		dataShare: r.GetDataWaitS()+r.GetComputeS() > 0,
		tokPerS:   r.TokPerS != nil,
		jPerToken: r.JPerToken != nil,
		avgPower:  r.AvgPowerW != nil,
	}
	k.period = k.times && r.GetWallS()-r.GetWarmupS() > 0
	return k
}

// Row returns the CSV row of r, matching Header().
func Row(r *RunReport) []string {
	k := knownOf(r)
	m := cmp.Or(r.GetMetadata(), &trainmeterv1.RunMetadata{}) // optional fields read below
	share := 0.0
	if k.dataShare {
		share = r.GetDataWaitS() / (r.GetDataWaitS() + r.GetComputeS())
	}
	jpt, e10k := "", ""
	if k.jPerToken {
		jpt, e10k = G9(r.GetJPerToken()), G9(r.GetJPerToken()*10000)
	}
	priced := r.GetHasCost() || r.GetHasEnergyCost()
	return []string{
		r.GetRunId(),
		u(r.GetTokensProcessed()),
		fIf(k.times, r.GetWallS()),
		fIf(k.times, r.GetWarmupS()),
		fIf(k.measured, r.GetEnergyJ()),
		opt(r.AvgPowerW, F),
		fIf(k.measured, r.GetPeakPowerW()),
		opt(r.TokPerS, F),
		jpt,
		e10k,
		fIf(k.vram, r.GetVramPeakMb()),
		fIf(k.vram, r.GetVramAvgMb()),

		m.GetModel(),
		m.GetDataset(),
		m.GetBackend(),
		m.GetOptimizer(),
		iIf(m.BatchSize != nil, m.GetBatchSize()),
		iIf(m.GradAccum != nil, m.GetGradAccum()),
		iIf(m.SeqLen != nil, m.GetSeqLen()),
		m.GetPrecision(),
		iIf(m.Seed != nil, m.GetSeed()),
		m.GetNotes(),

		u(r.GetTokensMeasured()),
		F(r.GetEnergyTotalJ()),
		fIf(k.measured, r.GetEnergyJIntegrated()),
		r.GetEnergyMethod(),
		u(uint64(r.GetGpus())),
		u(uint64(r.GetNodes())),
		r.GetGpuName(),
		F(r.GetGpuHours()),
		fIf(r.GetHasCost(), r.GetCostUsd()),
		F(r.GetEnergyKwh()),
		fIf(r.GetHasEnergyCost(), r.GetEnergyCostUsd()),
		fIf(k.usdPerMtok && r.UsdPerMtok != nil, r.GetUsdPerMtok()),
		fIf(r.GetHasCo2(), r.GetCo2Kg()),

		fIf(r.GetHasCost(), r.GetGpuPricePerHour()),
		fIf(k.counter, r.GetEnergyDisagreementPct()),
		strconv.FormatBool(r.GetEnergyEstimated()),
		F(r.GetGapS()),
		u(r.GetSteps()),
		F(r.GetDataWaitS()),
		F(r.GetComputeS()),
		fIf(k.dataShare, share),
		fIf(r.GetHasLoss(), r.GetLastLoss()),
		strconv.Itoa(len(r.GetEvals())),
		Status(r),
		tm(r, false),
		tm(r, true),

		Complete(r),
		u(r.GetLostBatches()),
		u(r.GetLostTokens()),
		F(r.GetLostEnergyJ()),

		fIf(priced, r.GetTotalCostUsd()),
		fIf(priced, r.GetProjectedCostUsd()),
		fIf(r.GetPriorityMultiplier() > 0, r.GetPriorityMultiplier()),
		r.GetGpuPriceSource(),
		opt(r.UsdPerSample, G9),
		opt(r.EpochsDone, F),
		opt(r.UsdPerEpoch, G9),
		opt(r.AccuracyPoints, F),
		opt(r.UsdPerAccuracyPoint, G9),
		opt(r.EfficiencyScore, F),
		opt(r.StepsPerS, F),
		opt(r.EpochS, F),
		opt(r.EstTotalS, F),
		opt(r.FlopsPerStep, G9),
		opt(r.FlopsTotal, G9),
		opt(r.PeakTflops, F),
		opt(r.Mfu, F),
		opt(r.JPerPflop, G9),

		r.GetEndStatus(),
		r.GetGpuShareMethod(),
		fIf(r.GetGpuShareMethod() != "", r.GetSharedGpuS()),
		r.GetPriceSource(),
		fOK(AvgPowerTotal(r)),
		fOK(PeakPowerTotal(r)),
		opt(r.EnergyUncertaintyPct, F),
		opt(r.CpuEnergyJ, F),
		opt(r.DramEnergyJ, F),
		opt(r.NodeEnergyJ, F),

		fIf(r.GetHasCo2(), r.GetCo2Gco2PerKwh()),
		r.GetCo2Source(),
		r.GetCarbonZone(),

		fIf(r.CpuEnergyJ != nil || r.GetLostHostEnergyJ() > 0, r.GetLostHostEnergyJ()),

		repricedAt(r),
		opt(r.PreviousCostUsd, F),
		opt(r.PreviousTotalCostUsd, F),
		r.GetRepriceReason(),
		r.GetRatesUnavailable(),
		opt(r.EnergyCoverage, F),
		r.GetEndError(),
	}
}

// repricedAt is when the run was last repriced (RFC 3339), "" if never.
func repricedAt(r *RunReport) string {
	if t := r.GetRepricedAt(); t != nil {
		return t.AsTime().UTC().Format(time.RFC3339Nano)
	}
	return ""
}

func fOK(v float64, ok bool) string { return fIf(ok, v) }

// opt formats an optional figure; "" when it is unknown.
func opt(v *float64, format func(float64) string) string {
	if v == nil {
		return ""
	}
	return format(*v)
}

// Complete is "no" when an agent dropped some of the run's data (the
// lost_* columns say how much), "yes" otherwise.
func Complete(r *RunReport) string {
	if r.GetIncomplete() {
		return "no"
	}
	return "yes"
}

// Incomplete describes the data a run lost, or "" when nothing was lost.
func Incomplete(r *RunReport) string {
	if !r.GetIncomplete() {
		return ""
	}
	why := ""
	if rs := r.GetLostReasons(); len(rs) > 0 {
		why = " (" + strings.Join(rs, "; ") + ")"
	}
	were := "were"
	if r.GetLostBatches() == 1 {
		were = "was"
	}
	host := ""
	if lh := r.GetLostHostEnergyJ(); lh > 0 {
		host = ", " + F(lh) + " J host energy (CPU+DRAM)"
	}
	return fmt.Sprintf("INCOMPLETE: %s of this run %s dropped on an agent%s; missing from the figures: %d tokens, %s J GPU energy%s, %.4g GPU-hours",
		plural.N(r.GetLostBatches(), "batch"), were, why, r.GetLostTokens(), F(r.GetLostEnergyJ()), host, r.GetLostGpuSeconds()/3600)
}

// WriteCSV writes the header and one row per run.
func WriteCSV(w io.Writer, runs []*RunReport) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(header); err != nil {
		return err
	}
	for _, r := range runs {
		if err := cw.Write(Row(r)); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// Duration formats seconds as e.g. "1h02m03s" or "4.5s".
func Duration(s float64) string {
	if !finite(s) || s < 0 {
		return "-"
	}
	if s < 60 {
		return strconv.FormatFloat(math.Round(s*10)/10, 'f', -1, 64) + "s"
	}
	d := time.Duration(math.Round(s)) * time.Second
	h := int64(d / time.Hour)
	mnt := int64(d/time.Minute) % 60
	sec := int64(d/time.Second) % 60
	if h > 0 {
		return fmt.Sprintf("%dh%02dm%02ds", h, mnt, sec)
	}
	return fmt.Sprintf("%dm%02ds", mnt, sec)
}

// Count formats a count with an SI suffix: 950, 12.3k, 4.56M, 7.89G.
func Count(v uint64) string {
	f := float64(v)
	switch {
	case f >= 1e12:
		return fmt.Sprintf("%.3gT", f/1e12)
	case f >= 1e9:
		return fmt.Sprintf("%.3gG", f/1e9)
	case f >= 1e6:
		return fmt.Sprintf("%.3gM", f/1e6)
	case f >= 1e4:
		return fmt.Sprintf("%.3gk", f/1e3)
	}
	return strconv.FormatUint(v, 10)
}

func dash(ok bool, format string, v float64) string {
	if !ok || !finite(v) {
		return "-"
	}
	return fmt.Sprintf(format, v)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// tableScopes is the runs table's second header line: each column's scope
// (docs/measurement.md, "What each figure holds").
var tableScopes = []string{"", "", "", "", "", "whole run", "whole run", "after warmup", "after warmup",
	"whole run, all GPUs", "whole run, all GPUs", "per GPU", "whole run"}

// WriteTable writes a one-line-per-run table for terminals.
func WriteTable(w io.Writer, runs []*RunReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tMODEL\tBACKEND\tSTATUS\tSTART\tWALL\tTOKENS\tTOK/S\tJ/TOKEN\tAVG W\tENERGY kJ\tVRAM PEAK MiB\tCOST $")
	fmt.Fprintln(tw, strings.Join(tableScopes, "\t"))
	inWarmup := 0
	var noRates []string
	for _, r := range runs {
		k := knownOf(r)
		if NeverLeftWarmup(r) {
			inWarmup++
		} else if why := r.GetRatesUnavailable(); why != "" {
			noRates = append(noRates, r.GetRunId()+": "+why)
		}
		avg, hasAvg := AvgPowerTotal(r)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			r.GetRunId(),
			orDash(r.GetMetadata().GetModel()),
			orDash(r.GetMetadata().GetBackend()),
			EndStatus(r),
			orDash(humanTime(r, false)),
			dashS(k.times, Duration(r.GetWallS())),
			Count(r.GetTokensProcessed()),
			dash(k.tokPerS, "%.0f", r.GetTokPerS()),
			dash(k.jPerToken, "%.4g", r.GetJPerToken()),
			dash(hasAvg, "%.0f", avg),
			dash(k.times, "%.1f", r.GetEnergyTotalJ()/1000),
			dash(k.vram, "%.0f", r.GetVramPeakMb()),
			dashS(r.GetHasCost() || r.GetHasEnergyCost(), strings.TrimPrefix(money.USD(r.GetTotalCostUsd()), "$")),
		)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if inWarmup > 0 {
		if _, err := fmt.Fprintf(w, "TOK/S and J/TOKEN are - for %s that never left the warmup: %s\n", plural.N(inWarmup, "run"), WarmupHint); err != nil {
			return err
		}
	}
	if len(noRates) > 0 {
		_, err := fmt.Fprintf(w, "rates after warmup unknown (rates_unavailable): %s\n", strings.Join(noRates, ", "))
		return err
	}
	return nil
}

// RatesUnavailable explains RunReport.rates_unavailable in words; "" when
// every rate after warmup is known.
func RatesUnavailable(r *RunReport) string {
	switch why := r.GetRatesUnavailable(); why {
	case "":
		return ""
	case "in_warmup":
		return "in_warmup: no time after warmup yet, so no rate after warmup"
	case "too_short":
		return fmt.Sprintf("too_short: %s after warmup, under the 1 s a rate needs", Duration(max(0, r.GetWallS()-r.GetWarmupS())))
	case "too_few_steps":
		return "too_few_steps: under the 2 steps after warmup a rate needs"
	case "no_tokens":
		return "no_tokens: no tokens reported after warmup, so no tok/s or J/token"
	case "no_energy":
		return "no_energy: under 1 s after warmup with measured energy, so no J/token or power after warmup"
	default:
		return why
	}
}

// WarmupHint says how to set the warmup; shown where efficiency figures
// are empty because a run never left it.
const WarmupHint = "set a shorter one with warmup_s=/warmup_steps= in trainmeter.start(), `trainmeter run --warmup`, or the agent's --warmup/--warmup-steps (default: 60 s or the 20th step, whichever comes first)"

// AvgPowerTotal is the whole run's mean power, all of its GPUs summed:
// energy_total_J / wall_s (what the collector sends as avg_power_total_W,
// computed here too for collectors before that field).
func AvgPowerTotal(r *RunReport) (float64, bool) {
	if r.GetStart() == nil || r.GetWallS() <= 0 {
		return 0, false
	}
	return r.GetEnergyTotalJ() / r.GetWallS(), true
}

// PeakPowerTotal is the whole run's peak power, all of its GPUs summed,
// warmup included; unknown (false) before any power was seen.
func PeakPowerTotal(r *RunReport) (float64, bool) {
	p := max(r.GetPeakPowerTotalW(), r.GetPeakPowerW())
	return p, p > 0
}

// NeverLeftWarmup: the run has data but no time after its warmup, so its
// efficiency figures (tok/s, J/token, after-warmup energy and power) are
// unknown.
func NeverLeftWarmup(r *RunReport) bool {
	return r.GetStart() != nil && r.GetEnergyMethod() == "" && r.GetWallS() > 0
}

func dashS(ok bool, s string) string {
	if !ok {
		return "-"
	}
	return s
}

func optS(v *float64, format string) string {
	if v == nil || !finite(*v) {
		return "-"
	}
	return fmt.Sprintf(format, *v)
}

func optDur(v *float64) string {
	if v == nil {
		return "-"
	}
	return Duration(*v)
}

// writeCost writes the report's cost lines: the whole run, each line its
// own value rounded (money.Amount), never fitted to the total; a sum its
// shown lines do not add up to says "(rounded)" (docs/costs.md, "How money
// is shown").
func writeCost(b *strings.Builder, line func(label, format string, args ...any), r *RunReport, k known) {
	b.WriteString("cost (whole run)\n")
	line("gpu hours", "%.4g", r.GetGpuHours())
	priced := r.GetHasCost() || r.GetHasEnergyCost()
	// The GPU line is what the total holds of it: the GPU cost times the
	// priority multiplier.
	energyPart := 0.0
	if r.GetHasEnergyCost() && !r.GetEnergyIncluded() {
		energyPart = r.GetEnergyCostUsd()
	}
	var shown []string // the amounts on the lines the total sums
	mult := r.GetPriorityMultiplier()
	if r.GetHasCost() {
		gpu := money.Amount(r.GetTotalCostUsd() - energyPart)
		shown = append(shown, gpu)
		at := "at " + money.Rate(r.GetGpuPricePerHour()) + "/GPU-hour"
		if mult != 1 && mult != 0 {
			at = fmt.Sprintf("%s × %.4g priority", at, mult)
		}
		line("gpu cost", "%s %s", gpu, at)
	} else {
		line("gpu cost", "%s", "- (no GPU price)")
	}
	if src := r.GetPriceSource(); src != "" {
		line("price source", "%s", PriceSourceWords(src))
	}
	if r.GetPue() > 1 {
		line("PUE", "%.3g (energy cost and CO2 are of the GPU energy x %.3g)", r.GetPue(), r.GetPue())
	}
	switch {
	case r.GetEnergyIncluded():
		line("energy cost", "%s", "included in the GPU price")
	case r.GetHasEnergyCost():
		energy := money.Amount(energyPart)
		shown = append(shown, energy)
		bands := r.GetEnergyBands()
		bandShown := make([]string, len(bands))
		for i, eb := range bands {
			bandShown[i] = money.Amount(eb.GetCostUsd())
		}
		line("energy cost", "%s%s", energy, roundedNote(len(bands) > 0, energy, bandShown))
		for i, eb := range bands {
			line("  band "+eb.GetBand(), "%.6g kWh at %s/kWh = %s", eb.GetKwh(), money.Rate(eb.GetUsdPerKwh()), bandShown[i])
		}
	default:
		line("energy cost", "%s", "- (no energy price)")
	}
	total := money.Amount(r.GetTotalCostUsd())
	line("total", "%s", dashS(priced, total+roundedNote(true, total, shown)))
	writeReprice(line, r)
	writePlan(line, r)
	if !r.GetEnded() && r.GetProjectionBasis() != "" {
		line("projected", "%s at completion (%.1f%% of planned %s done)", dashS(priced, money.USD(r.GetProjectedCostUsd())),
			100*r.GetProgress(), r.GetProjectionBasis())
	}
	line("$ per Mtok", "%s (whole run's cost ÷ all tokens)", dashS(k.usdPerMtok, money.Rate(r.GetUsdPerMtok())))
	if r.UsdPerSample != nil {
		line("$ per sample", "%s", money.Rate(r.GetUsdPerSample()))
	}
	if r.UsdPerEpoch != nil {
		line("$ per epoch", "%s (%.3g epochs done)", money.Rate(r.GetUsdPerEpoch()), r.GetEpochsDone())
	}
	if r.UsdPerAccuracyPoint != nil {
		line("$ per acc. point", "%s (accuracy %.2f points)", money.Rate(r.GetUsdPerAccuracyPoint()), r.GetAccuracyPoints())
	}
	if r.EfficiencyScore != nil {
		line("efficiency", "%.3f (1 = the model's best accuracy per $)", r.GetEfficiencyScore())
	}
}

// roundedNote is " (rounded)" where the amounts shown as parts do not add
// up to the total shown, "" otherwise or when there are no parts to sum.
func roundedNote(hasParts bool, total string, parts []string) string {
	if !hasParts || money.AddsUp(total, parts...) {
		return ""
	}
	return " (rounded)"
}

// WriteReport writes a readable multi-line report of one run.
func WriteReport(w io.Writer, r *RunReport) error {
	k := knownOf(r)
	m := cmp.Or(r.GetMetadata(), &trainmeterv1.RunMetadata{}) // optional fields read below
	var b strings.Builder
	line := func(label, format string, args ...any) {
		if label != "" { // "": a continuation line
			label += ":"
		}
		fmt.Fprintf(&b, "  %-18s "+format+"\n", append([]any{label}, args...)...)
	}
	if st := r.GetEndStatus(); st != "" && st != "ended" && r.GetEnded() {
		fmt.Fprintf(&b, "run %s (ended: %s)\n", r.GetRunId(), r.GetEndStatus())
		if cause := r.GetEndError(); cause != "" {
			// Quoted: a newline or a terminal escape in it stays visible text.
			line("cause", "%s", strconv.Quote(cause))
		}
	} else {
		fmt.Fprintf(&b, "run %s (%s)\n", r.GetRunId(), Status(r))
	}
	if inc := Incomplete(r); inc != "" {
		b.WriteString(inc + "\n")
	}

	b.WriteString("metadata\n")
	line("model", "%s", orDash(m.GetModel()))
	line("dataset", "%s", orDash(m.GetDataset()))
	line("backend", "%s", orDash(m.GetBackend()))
	line("optimizer", "%s", orDash(m.GetOptimizer()))
	line("precision", "%s", orDash(m.GetPrecision()))
	line("batch size", "%s", orDash(iIf(m.BatchSize != nil, m.GetBatchSize())))
	line("grad accum", "%s", orDash(iIf(m.GradAccum != nil, m.GetGradAccum())))
	line("seq len", "%s", orDash(iIf(m.SeqLen != nil, m.GetSeqLen())))
	line("seed", "%s", orDash(iIf(m.Seed != nil, m.GetSeed())))
	if m.GetNotes() != "" {
		line("notes", "%s", m.GetNotes())
	}
	line("hardware", "%s on %s %s", plural.N(r.GetGpus(), "GPU"), plural.N(r.GetNodes(), "node"), orDash(r.GetGpuName()))
	if r.GetHasUid() {
		line("user", "%s (uid %d)", orDash(r.GetUser()), r.GetUid())
	}
	if n := r.GetMaxSharingRuns(); n > 1 {
		line("shared GPUs", "with up to %d runs at once (this run included) for %.4g GPU-seconds, split by %s; energy, GPU-hours and cost below are this run's share",
			n, r.GetSharedGpuS(), orDash(r.GetGpuShareMethod()))
	} else if r.GetGpuShareMethod() == "exclusive" {
		line("shared GPUs", "%s", "no: its GPUs ran no other run meanwhile")
	}

	b.WriteString("time\n")
	line("start", "%s", orDash(humanTime(r, false)))
	endLabel := "end"
	if !r.GetEnded() {
		endLabel = "last data"
	}
	line(endLabel, "%s", orDash(humanTime(r, true)))
	line("wall", "%s (whole run)", dashS(k.times, Duration(r.GetWallS())))
	if r.GetResumes() > 0 {
		line("paused", "%s between an end and a resume (%s; not run time, in no rate)", Duration(r.GetPausedS()), plural.N(r.GetResumes(), "resume"))
	}
	line("warmup", "%s (excluded from the after-warmup figures)", dashS(k.times, Duration(r.GetWarmupS())))
	if NeverLeftWarmup(r) {
		what := "the run never left its warmup"
		if !r.GetEnded() {
			what = "the run is still in its warmup"
		}
		line("note", "%s: tok/s, J/token and the after-warmup energy and power are unknown;", what)
		line("", "%s", WarmupHint)
	} else if why := RatesUnavailable(r); why != "" {
		line("rates unknown", "%s", why)
	}
	if k.dataShare {
		line("data wait", "%.1f%% of step time (%s waiting, %s computing; whole run, all ranks)",
			100*r.GetDataWaitS()/(r.GetDataWaitS()+r.GetComputeS()), Duration(r.GetDataWaitS()), Duration(r.GetComputeS()))
	}
	if r.GetGapS() > 0 {
		line("sample gaps", "%s", Duration(r.GetGapS()))
	}

	b.WriteString("tokens (all ranks)\n")
	line("whole run", "%d in %s", r.GetTokensProcessed(), plural.N(r.GetSteps(), "step"))
	line("after warmup", "%d", r.GetTokensMeasured())
	line("throughput", "%s tok/s after warmup", dash(k.tokPerS, "%.1f", r.GetTokPerS()))
	if r.GetHasLoss() {
		line("last loss", "%.4g", r.GetLastLoss())
	}

	b.WriteString("energy (all GPUs)\n")
	line("whole run", "%.1f J = %.6g kWh", r.GetEnergyTotalJ(), r.GetEnergyKwh())
	line("after warmup", "%s J (%s)", dash(k.measured, "%.1f", r.GetEnergyJ()), orDash(r.GetEnergyMethod()))
	line("per token", "%s J after warmup (E10k %s J)", dash(k.jPerToken, "%.6g", r.GetJPerToken()), dash(k.jPerToken, "%.6g", r.GetJPerToken()*10000))
	if c := r.EnergyCoverage; c != nil && *c < 1 {
		line("energy coverage", "%.1f%% of the time after warmup had measured energy; J/token and power after warmup are over that part", 100**c)
	}
	line("integrated", "%s J after warmup", dash(k.measured, "%.1f", r.GetEnergyJIntegrated()))
	if k.counter {
		line("counter vs integ.", "%+.2f%%", r.GetEnergyDisagreementPct())
	}
	if r.EnergyUncertaintyPct != nil {
		line("uncertainty", "±%.2f%% after warmup (method and sensor; board gain ±5%% not included)", r.GetEnergyUncertaintyPct())
	}
	if r.GetEnergyEstimated() {
		line("note", "%s", "part of the energy is estimated, not measured: a GPU that stopped reporting (its counter energy replaced by its sampled power, or its time a gap), a cut past a GPU's newest reading, or an agent restart without a counter")
	}

	writeHostEnergy(&b, line, r)

	b.WriteString("power (all GPUs summed)\n")
	avgTotal, hasAvgTotal := AvgPowerTotal(r)
	peakTotal, hasPeakTotal := PeakPowerTotal(r)
	line("average", "%s W whole run, %s W after warmup", dash(hasAvgTotal, "%.1f", avgTotal),
		dash(k.avgPower, "%.1f", r.GetAvgPowerW()))
	line("peak", "%s W whole run, %s W after warmup", dash(hasPeakTotal, "%.1f", peakTotal),
		dash(k.measured, "%.1f", r.GetPeakPowerW()))

	b.WriteString("vram (per GPU, whole run)\n")
	line("peak", "%s MiB (the highest on any one GPU)", dash(k.vram, "%.0f", r.GetVramPeakMb()))
	line("mean", "%s MiB", dash(k.vram, "%.0f", r.GetVramAvgMb()))

	writeCost(&b, line, r, k)
	writeCO2(line, r)

	if r.StepsPerS != nil || r.FlopsTotal != nil {
		b.WriteString("compute\n")
		line("steps/s", "%s", optS(r.StepsPerS, "%.4g"))
		line("time per epoch", "%s", optDur(r.EpochS))
		line("est. total time", "%s", optDur(r.EstTotalS))
		line("FLOPs per step", "%s", optS(r.FlopsPerStep, "%.4g"))
		line("FLOPs total", "%s", optS(r.FlopsTotal, "%.4g"))
		line("MFU", "%s", optS(r.Mfu, "%.4f"))
		line("peak per GPU", "%s TFLOPS", optS(r.PeakTflops, "%.4g"))
		line("J per PFLOP", "%s", optS(r.JPerPflop, "%.4g"))
	}

	if len(r.GetEvals()) > 0 {
		b.WriteString("evals\n")
		for _, e := range r.GetEvals() {
			parts := []string{fmt.Sprintf("epoch %d", e.GetEpoch())}
			if e.ValLoss != nil {
				parts = append(parts, fmt.Sprintf("val_loss %.4g", e.GetValLoss()))
			}
			if e.Accuracy != nil {
				parts = append(parts, fmt.Sprintf("accuracy %.4g", e.GetAccuracy()))
			}
			t := ""
			if e.GetTime() != nil {
				t = Time(e.GetTime().AsTime())
			}
			fmt.Fprintf(&b, "  %s  %s\n", t, strings.Join(parts, ", "))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeHostEnergy writes the run's CPU and DRAM energy (RAPL) and the
// node total, when a node measured them.
func writeHostEnergy(b *strings.Builder, line func(string, string, ...any), r *RunReport) {
	if r.CpuEnergyJ == nil {
		return
	}
	b.WriteString("host energy (CPU packages and DRAM, RAPL; whole run, the run's share of its nodes)\n")
	line("cpu", "%.1f J", r.GetCpuEnergyJ())
	if r.DramEnergyJ != nil {
		line("dram", "%.1f J", r.GetDramEnergyJ())
	} else {
		line("dram", "%s", "- (no DRAM domain on the nodes: not in node energy)")
	}
	line("node", "%.1f J = GPUs %.1f J + cpu + dram", r.GetNodeEnergyJ(), r.GetEnergyTotalJ())
	if m := r.GetHostEnergySplit(); m != "" && m != "exclusive" {
		line("split", "%s (the node's host energy shared with other runs)", m)
	}
}

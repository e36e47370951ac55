// Package report renders run reports: the CSV contract (docs/measurement.md,
// "Per-run figures"), a table for terminals and a readable per-run report,
// all from one table of the run's fields (Fields).
//
// CSV rules:
//   - Columns are exactly Header(), in that order: run_id, the contract
//     columns, the metadata columns, the required extras, then further extras.
//     New columns are only ever appended.
//   - An unknown value is an empty cell, never 0, NaN or Inf: an unset
//     optional field (metadata ints not given, costs without a price, rates
//     without a measured period), energy figures of the measured period when
//     the run has no measured window yet, VRAM when no memory sample arrived,
//     and any non-finite value.
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
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/internal/money"
	"github.com/trainmeter/trainmeter/internal/plural"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// RunReport is the report message the collector produces.
type RunReport = trainmeterv1.RunReport

// Field is one figure of a run: a CSV column, and what the runs table and
// the readable report show of it.
type Field struct {
	Name  string // the CSV column
	Unit  string // "" for text, counts, flags and times
	Scope string // the part of the run it covers (docs/measurement.md)
	// Value is the figure: a float64, uint64, int64, string, bool or
	// time.Time; nil when unknown. Nil in the table: the RunReport (or
	// RunMetadata) field of the same name, case aside, read by reflection.
	Value func(*RunReport) any
	g9    bool // written to 9 significant digits rather than 6 decimals
}

// Scopes (docs/measurement.md, "What each figure holds").
const (
	run, runGPUs, runRanks    = "whole run", "whole run, all GPUs", "whole run, all ranks"
	runPerGPU, runNodes       = "whole run, per GPU", "whole run, all its nodes"
	warm, warmGPUs, warmRanks = "after warmup", "after warmup, all GPUs", "after warmup, all ranks"
	perToken, usdPerUnit      = "J/{token}", "USD/{unit}"
)

// fields are the CSV's columns, in order.
var fields = []Field{
	{Name: "run_id"},
	// contract columns
	{Name: "tokens_processed", Unit: "{token}", Scope: runRanks},
	{"wall_s", "s", run, func(r *RunReport) any { return when(hasTimes(r), r.GetWallS()) }, false},
	{"warmup_s", "s", run, func(r *RunReport) any { return when(hasTimes(r), r.GetWarmupS()) }, false},
	{"energy_J", "J", warmGPUs, func(r *RunReport) any { return when(measured(r), r.GetEnergyJ()) }, false},
	{Name: "avg_power_W", Unit: "W", Scope: warmGPUs},
	{"peak_power_W", "W", warmGPUs, func(r *RunReport) any { return when(measured(r), r.GetPeakPowerW()) }, false},
	{Name: "tok_per_s", Unit: "{token}/s", Scope: warmRanks},
	{Name: "J_per_token", Unit: perToken, Scope: warmGPUs, g9: true},
	{"E10k_J", "J/(10000 {token})", warmGPUs, func(r *RunReport) any { return scaled(r.JPerToken, 1e4) }, true},
	{"vram_peak_MB", "MiB", runPerGPU, func(r *RunReport) any { return when(hasVRAM(r), r.GetVramPeakMb()) }, false},
	{"vram_avg_MB", "MiB", runPerGPU, func(r *RunReport) any { return when(hasVRAM(r), r.GetVramAvgMb()) }, false},
	// metadata
	{Name: "model"}, {Name: "dataset"}, {Name: "backend"}, {Name: "optimizer"},
	{Name: "batch_size"}, {Name: "grad_accum"}, {Name: "seq_len"}, {Name: "precision"},
	{Name: "seed"}, {Name: "notes"},
	// required extras
	{Name: "tokens_measured", Unit: "{token}", Scope: warmRanks}, {Name: "energy_total_J", Unit: "J", Scope: runGPUs},
	{"energy_J_integrated", "J", warmGPUs, func(r *RunReport) any { return when(measured(r), r.GetEnergyJIntegrated()) }, false},
	{Name: "energy_method", Scope: warm},
	{Name: "gpus", Scope: run}, {Name: "nodes", Scope: run}, {Name: "gpu_name", Scope: run},
	{Name: "gpu_hours", Unit: "h", Scope: runGPUs}, {Name: "cost_usd", Unit: "USD", Scope: runGPUs},
	{Name: "energy_kWh", Unit: "kWh", Scope: runGPUs}, {Name: "energy_cost_usd", Unit: "USD", Scope: runGPUs},
	{Name: "usd_per_mtok", Unit: "USD/M{token}", Scope: run}, {Name: "co2_kg", Unit: "kg", Scope: runGPUs},
	// further extras
	{Name: "gpu_price_per_hour", Unit: "USD/h", Scope: run},
	{"energy_disagreement_pct", "%", warm, func(r *RunReport) any { return when(hasCounter(r), r.GetEnergyDisagreementPct()) }, false},
	{Name: "energy_estimated", Scope: run}, {Name: "gap_s", Unit: "s", Scope: run}, {Name: "steps", Scope: runRanks},
	{Name: "data_wait_s", Unit: "s", Scope: runRanks}, {Name: "compute_s", Unit: "s", Scope: runRanks},
	{"data_wait_share", "1", runRanks, dataWaitShare, false},
	{Name: "last_loss", Scope: run},
	{"evals", "", run, func(r *RunReport) any { return uint64(len(r.GetEvals())) }, false},
	{"status", "", "", func(r *RunReport) any { return Status(r) }, false},
	{"start_time", "", "", func(r *RunReport) any { return at(r.GetStart()) }, false},
	{"end_time", "", "", func(r *RunReport) any { return at(r.GetEnd()) }, false},
	// data dropped on an agent (spool or disk full, rejected batch)
	{"complete", "", runNodes, func(r *RunReport) any { return Complete(r) }, false},
	{Name: "lost_batches", Scope: runNodes}, {Name: "lost_tokens", Unit: "{token}", Scope: runNodes}, {Name: "lost_energy_J", Unit: "J", Scope: runNodes},
	// cost model and throughput/compute report (docs/costs.md)
	{Name: "total_cost_usd", Unit: "USD", Scope: run}, {Name: "projected_cost_usd", Unit: "USD", Scope: run},
	{"priority_multiplier", "1", run, func(r *RunReport) any { return when(r.GetPriorityMultiplier() > 0, r.GetPriorityMultiplier()) }, false},
	{Name: "usd_per_sample", Unit: usdPerUnit, Scope: run, g9: true}, {Name: "epochs_done", Scope: run},
	{Name: "usd_per_epoch", Unit: usdPerUnit, Scope: run, g9: true}, {Name: "accuracy_points", Scope: run},
	{Name: "usd_per_accuracy_point", Unit: usdPerUnit, Scope: run, g9: true}, {Name: "efficiency_score", Unit: "1", Scope: run},
	{Name: "steps_per_s", Unit: "1/s", Scope: warmRanks}, {Name: "epoch_s", Unit: "s", Scope: warm}, {Name: "est_total_s", Unit: "s", Scope: run},
	{Name: "flops_per_step", Unit: "FLOP", Scope: run, g9: true}, {Name: "flops_total", Unit: "FLOP", Scope: run, g9: true},
	{Name: "peak_TFLOPS", Unit: "TFLOP/s", Scope: "per GPU"}, {Name: "mfu", Unit: "1", Scope: warmGPUs},
	{Name: "J_per_PFLOP", Unit: "J/PFLOP", Scope: warmGPUs, g9: true},
	// run lifecycle (docs/measurement.md, "End status")
	{Name: "end_status", Scope: run},
	// shared GPUs (docs/measurement.md, "Shared GPUs and idle")
	{Name: "gpu_share_method", Scope: run},
	{"shared_gpu_s", "s", runGPUs, func(r *RunReport) any { return when(r.GetGpuShareMethod() != "", r.GetSharedGpuS()) }, false},
	// where the GPU-hour price came from (docs/costs.md)
	{Name: "price_source", Scope: run},
	// whole-run power, warmup included (docs/measurement.md)
	{"avg_power_total_W", "W", runGPUs, func(r *RunReport) any { return ok(AvgPowerTotal(r)) }, false},
	{"peak_power_total_W", "W", runGPUs, func(r *RunReport) any { return ok(PeakPowerTotal(r)) }, false},
	// stated uncertainty of energy_J, ± % (docs/accuracy.md)
	{Name: "energy_uncertainty_pct", Unit: "%", Scope: warmGPUs},
	// host energy from RAPL (docs/measurement.md, "Host energy (CPU and DRAM)")
	{Name: "cpu_energy_J", Unit: "J", Scope: runNodes}, {Name: "dram_energy_J", Unit: "J", Scope: runNodes}, {Name: "node_energy_J", Unit: "J", Scope: runNodes},
	// carbon by the hour (docs/costs.md, "CO2")
	{Name: "co2_gco2_per_kwh", Unit: "g/kWh", Scope: runGPUs}, {Name: "co2_source", Scope: run}, {Name: "carbon_zone", Scope: run},
	// the run's host energy (CPU+DRAM) in batches dropped on an agent:
	// empty where no node measured host energy, 0 where none was lost
	{"lost_host_energy_J", "J", runNodes, func(r *RunReport) any {
		return when(r.CpuEnergyJ != nil || r.GetLostHostEnergyJ() > 0, r.GetLostHostEnergyJ())
	}, false},
	// locked prices: the run's latest reprice (docs/costs.md, "Locked prices")
	{Name: "repriced_at"}, {Name: "previous_cost_usd", Unit: "USD", Scope: run},
	{Name: "previous_total_cost_usd", Unit: "USD", Scope: run}, {Name: "reprice_reason"},
	// why a rate after warmup is empty, and the share of the time after
	// warmup with energy (docs/measurement.md, "Rates after warmup")
	{Name: "rates_unavailable", Scope: warm}, {Name: "energy_coverage", Unit: "1", Scope: warmGPUs},
	// the cause of a failed end, as the trainer gave it (docs/measurement.md,
	// "End status")
	{Name: "end_error", Scope: run},
	// where the run came from: run, slurm, kubernetes or process
	// (docs/attribution.md)
	{Name: "attribution", Scope: run},
}

var (
	header = make([]string, len(fields))
	byName = make(map[string]*Field, len(fields))
)

func init() {
	for i := range fields {
		f := &fields[i]
		header[i], byName[f.Name] = f.Name, f
		if f.Value == nil {
			f.Value = protoValue(f.Name)
		}
	}
}

// protoValue reads the RunReport field, else the RunMetadata field, whose
// name is name in lower case. An unset field with presence is unknown, and
// so is one whose message has a has_<name> flag that is not set.
func protoValue(name string) func(*RunReport) any {
	name = strings.ToLower(name)
	inMeta := false
	md := (*RunReport)(nil).ProtoReflect().Descriptor()
	fd := md.Fields().ByName(protoreflect.Name(name))
	if fd == nil {
		inMeta, md = true, (*trainmeterv1.RunMetadata)(nil).ProtoReflect().Descriptor()
		if fd = md.Fields().ByName(protoreflect.Name(name)); fd == nil {
			panic("report: no RunReport or RunMetadata field " + name)
		}
	}
	flag := md.Fields().ByName(protoreflect.Name("has_" + name))
	return func(r *RunReport) any {
		var m protoreflect.Message = r.ProtoReflect()
		if inMeta {
			m = r.GetMetadata().ProtoReflect()
		}
		if fd.HasPresence() && !m.Has(fd) || flag != nil && !m.Get(flag).Bool() {
			return nil
		}
		v := m.Get(fd)
		switch fd.Kind() {
		case protoreflect.DoubleKind, protoreflect.FloatKind:
			return v.Float()
		case protoreflect.Uint32Kind, protoreflect.Uint64Kind:
			return v.Uint()
		case protoreflect.Int32Kind, protoreflect.Int64Kind:
			return v.Int()
		case protoreflect.BoolKind:
			return v.Bool()
		case protoreflect.MessageKind:
			if ts, isTime := v.Message().Interface().(*timestamppb.Timestamp); isTime {
				return ts.AsTime()
			}
		}
		return v.String()
	}
}

// Header returns the CSV header row.
func Header() []string { return slices.Clone(header) }

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

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// F formats a float for the CSV: rounded to 6 decimals; "" if not finite
// (or so large that v*1e6 overflows).
func F(v float64) string { return plain(math.Round(v*1e6) / 1e6) }

// G9 formats a float rounded to 9 significant digits, without exponent.
func G9(v float64) string {
	v, _ = strconv.ParseFloat(strconv.FormatFloat(v, 'g', 9, 64), 64) // ±Inf and NaN parse back
	return plain(v)
}

// plain writes v without exponent and never as "-0"; "" if not finite.
func plain(v float64) string {
	if !finite(v) {
		return ""
	}
	if v == 0 {
		v = 0
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// TimeFormat is the one format of times in human output (tables, reports,
// alerts): RFC 3339 in UTC to the second, e.g. 2025-03-01T12:00:00Z. UTC,
// so that what one user pastes reads the same to a colleague elsewhere and
// sorts as text; the CSV and --json carry the same instant with its
// fraction of a second.
const TimeFormat = time.RFC3339

// Time formats t for human output (TimeFormat).
func Time(t time.Time) string { return t.UTC().Format(TimeFormat) }

// Stamp is Time of ts; "-" when unknown.
func Stamp(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return Time(ts.AsTime())
}

// when is v where ok, else unknown (nil).
func when(ok bool, v any) any {
	if !ok {
		return nil
	}
	return v
}

func ok(v float64, known bool) any { return when(known, v) }

// scaled is *v × k; nil when v is.
func scaled(v *float64, k float64) any {
	if v == nil {
		return nil
	}
	return *v * k
}

func at(t *timestamppb.Timestamp) any {
	if t == nil {
		return nil
	}
	return t.AsTime()
}

func hasTimes(r *RunReport) bool { return r.GetStart() != nil }
func measured(r *RunReport) bool { return r.GetEnergyMethod() != "" }
func hasVRAM(r *RunReport) bool  { return r.GetVramPeakMb() > 0 || r.GetVramAvgMb() > 0 }
func hasCounter(r *RunReport) bool {
	return r.GetEnergyMethod() == "counter" || r.GetEnergyMethod() == "mixed"
}

func dataWaitShare(r *RunReport) any {
	step := r.GetDataWaitS() + r.GetComputeS()
	return when(step > 0, r.GetDataWaitS()/step)
}

// Cell is f's value of r as the CSV writes it; "" when unknown.
func (f Field) Cell(r *RunReport) string {
	switch v := f.Value(r).(type) {
	case float64:
		if f.g9 {
			return G9(v)
		}
		return F(v)
	case uint64:
		return strconv.FormatUint(v, 10)
	case int64:
		return strconv.FormatInt(v, 10)
	case bool:
		return strconv.FormatBool(v)
	case string:
		return v
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	}
	return ""
}

// Row returns the CSV row of r, matching Header().
func Row(r *RunReport) []string {
	row := make([]string, len(fields))
	for i, f := range fields {
		row[i] = f.Cell(r)
	}
	return row
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

// figure is r's figure of the field called name in format, "-" when it is
// unknown (or empty text).
func figure(r *RunReport, name, format string) string {
	return showWith(r, name, func(v any) string { return fmt.Sprintf(format, v) })
}

// showWith is r's figure of the field called name as show shows it; "-"
// when it is unknown.
func showWith(r *RunReport, name string, show func(any) string) string {
	v := byName[name].Value(r)
	if unknown(v) {
		return "-"
	}
	return show(v)
}

func asDuration(v any) string { return Duration(v.(float64)) }
func asTime(v any) string     { return Time(v.(time.Time)) }

func unknown(v any) bool {
	x, isFloat := v.(float64)
	return v == nil || v == "" || isFloat && !finite(x)
}

func orDash(s string) string { return cmp.Or(s, "-") }

// tableColumns are the runs table's columns: the title, the field whose
// figure it shows (its scope is the second header line), and how.
var tableColumns = []struct {
	title, field string
	show         func(r *RunReport, v any) string // v known; nil: as fmt.Sprint
}{
	{"RUN", "run_id", nil},
	{"MODEL", "model", nil},
	{"BACKEND", "backend", nil},
	{"STATUS", "status", func(r *RunReport, _ any) string { return EndStatus(r) }},
	{"START", "start_time", func(_ *RunReport, v any) string { return asTime(v) }},
	{"WALL", "wall_s", func(_ *RunReport, v any) string { return asDuration(v) }},
	{"TOKENS", "tokens_processed", func(_ *RunReport, v any) string { return Count(v.(uint64)) }},
	{"TOK/S", "tok_per_s", sprintf("%.0f")},
	{"J/TOKEN", "J_per_token", sprintf("%.4g")},
	{"AVG W", "avg_power_total_W", sprintf("%.0f")},
	{"ENERGY kJ", "energy_total_J", func(_ *RunReport, v any) string { return fmt.Sprintf("%.1f", v.(float64)/1000) }},
	{"VRAM PEAK MiB", "vram_peak_MB", sprintf("%.0f")},
	{"COST $", "total_cost_usd", func(_ *RunReport, v any) string { return strings.TrimPrefix(money.USD(v.(float64)), "$") }},
	// Where the run came from (run, slurm, kubernetes, process:
	// docs/attribution.md).
	{"SOURCE", "attribution", nil},
}

func sprintf(format string) func(*RunReport, any) string {
	return func(_ *RunReport, v any) string { return fmt.Sprintf(format, v) }
}

// WriteTable writes a one-line-per-run table for terminals.
func WriteTable(w io.Writer, runs []*RunReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	titles, scopes, cells := make([]string, len(tableColumns)), make([]string, len(tableColumns)), make([]string, len(tableColumns))
	for i, c := range tableColumns {
		titles[i], scopes[i] = c.title, byName[c.field].Scope
	}
	fmt.Fprintln(tw, strings.Join(titles, "\t"))
	fmt.Fprintln(tw, strings.Join(scopes, "\t"))
	inWarmup := 0
	var noRates []string
	for _, r := range runs {
		if NeverLeftWarmup(r) {
			inWarmup++
		} else if why := r.GetRatesUnavailable(); why != "" {
			noRates = append(noRates, r.GetRunId()+": "+why)
		}
		for i, c := range tableColumns {
			switch v := byName[c.field].Value(r); {
			case unknown(v):
				cells[i] = "-"
			case c.show == nil:
				cells[i] = fmt.Sprint(v)
			default:
				cells[i] = c.show(r, v)
			}
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
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

// ratesUnavailableWords explain each value of rates_unavailable but
// too_short, whose words give the time.
var ratesUnavailableWords = map[string]string{
	"in_warmup":     "in_warmup: no time after warmup yet, so no rate after warmup",
	"too_few_steps": "too_few_steps: under the 2 steps after warmup a rate needs",
	"no_tokens":     "no_tokens: no tokens reported after warmup, so no tok/s or J/token",
	"no_energy":     "no_energy: under 1 s after warmup with measured energy, so no J/token or power after warmup",
}

// RatesUnavailable explains RunReport.rates_unavailable in words; "" when
// every rate after warmup is known.
func RatesUnavailable(r *RunReport) string {
	why := r.GetRatesUnavailable()
	if why == "too_short" {
		return fmt.Sprintf("too_short: %s after warmup, under the 1 s a rate needs", Duration(max(0, r.GetWallS()-r.GetWarmupS())))
	}
	return cmp.Or(ratesUnavailableWords[why], why)
}

// WarmupHint says how to set the warmup; shown where efficiency figures
// are empty because a run never left it.
const WarmupHint = "set a shorter one with warmup_s=/warmup_steps= in trainmeter.start(), `trainmeter run --warmup`, or the agent's --warmup/--warmup-steps (default: 60 s or the 20th step, whichever comes first)"

// AvgPowerTotal is the whole run's mean power, all of its GPUs summed:
// energy_total_J / wall_s, as the collector computes avg_power_total_W.
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

// writeCost writes the report's cost lines: the whole run, each line its
// own value rounded (money.Amount), never fitted to the total; a sum its
// shown lines do not add up to says "(rounded)" (docs/costs.md, "How money
// is shown").
func writeCost(b *strings.Builder, line func(label, format string, args ...any), r *RunReport) {
	b.WriteString("cost (whole run)\n")
	line("gpu hours", "%.4g", r.GetGpuHours())
	priced := r.TotalCostUsd != nil
	// The GPU line is what the total holds of it: the GPU cost times the
	// priority multiplier.
	energyPart := 0.0
	if !r.GetEnergyIncluded() {
		energyPart = r.GetEnergyCostUsd()
	}
	var shown []string // the amounts on the lines the total sums
	mult := r.GetPriorityMultiplier()
	if r.CostUsd != nil {
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
	case r.EnergyCostUsd != nil:
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
	line("$ per Mtok", "%s (whole run's cost ÷ all tokens)", dashS(r.UsdPerMtok != nil, money.Rate(r.GetUsdPerMtok())))
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
	m := r.GetMetadata()
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
	for _, f := range []string{"model", "dataset", "backend", "optimizer", "precision", "batch_size", "grad_accum", "seq_len", "seed"} {
		line(strings.ReplaceAll(f, "_", " "), "%s", figure(r, f, "%v"))
	}
	if m.GetNotes() != "" {
		line("notes", "%s", m.GetNotes())
	}
	line("hardware", "%s on %s %s", plural.N(r.GetGpus(), "GPU"), plural.N(r.GetNodes(), "node"), orDash(r.GetGpuName()))
	if r.Uid != nil {
		line("user", "%s (uid %d)", orDash(r.GetUser()), r.GetUid())
		line("attribution", "%s", orDash(r.GetAttribution()))
	}
	if n := r.GetMaxSharingRuns(); n > 1 {
		line("shared GPUs", "with up to %d runs at once (this run included) for %.4g GPU-seconds, split by %s; energy, GPU-hours and cost below are this run's share",
			n, r.GetSharedGpuS(), orDash(r.GetGpuShareMethod()))
	} else if r.GetGpuShareMethod() == "exclusive" {
		line("shared GPUs", "%s", "no: its GPUs ran no other run meanwhile")
	}

	b.WriteString("time\n")
	line("start", "%s", showWith(r, "start_time", asTime))
	endLabel := "end"
	if !r.GetEnded() {
		endLabel = "last data"
	}
	line(endLabel, "%s", showWith(r, "end_time", asTime))
	line("wall", "%s (whole run)", showWith(r, "wall_s", asDuration))
	if r.GetResumes() > 0 {
		line("paused", "%s between an end and a resume (%s; not run time, in no rate)", Duration(r.GetPausedS()), plural.N(r.GetResumes(), "resume"))
	}
	line("warmup", "%s (excluded from the after-warmup figures)", showWith(r, "warmup_s", asDuration))
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
	if r.GetDataWaitS()+r.GetComputeS() > 0 {
		line("data wait", "%.1f%% of step time (%s waiting, %s computing; whole run, all ranks)",
			100*r.GetDataWaitS()/(r.GetDataWaitS()+r.GetComputeS()), Duration(r.GetDataWaitS()), Duration(r.GetComputeS()))
	}
	if r.GetGapS() > 0 {
		line("sample gaps", "%s", Duration(r.GetGapS()))
	}

	b.WriteString("tokens (all ranks)\n")
	line("whole run", "%d in %s", r.GetTokensProcessed(), plural.N(r.GetSteps(), "step"))
	line("after warmup", "%d", r.GetTokensMeasured())
	line("throughput", "%s tok/s after warmup", figure(r, "tok_per_s", "%.1f"))
	if r.LastLoss != nil {
		line("last loss", "%.4g", r.GetLastLoss())
	}

	b.WriteString("energy (all GPUs)\n")
	line("whole run", "%.1f J = %.6g kWh", r.GetEnergyTotalJ(), r.GetEnergyKwh())
	line("after warmup", "%s J (%s)", figure(r, "energy_J", "%.1f"), orDash(r.GetEnergyMethod()))
	line("per token", "%s J after warmup (E10k %s J)", figure(r, "J_per_token", "%.6g"), figure(r, "E10k_J", "%.6g"))
	if c := r.EnergyCoverage; c != nil && *c < 1 {
		line("energy coverage", "%.1f%% of the time after warmup had measured energy; J/token and power after warmup are over that part", 100**c)
	}
	line("integrated", "%s J after warmup", figure(r, "energy_J_integrated", "%.1f"))
	if hasCounter(r) {
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
	line("average", "%s W whole run, %s W after warmup", figure(r, "avg_power_total_W", "%.1f"), figure(r, "avg_power_W", "%.1f"))
	line("peak", "%s W whole run, %s W after warmup", figure(r, "peak_power_total_W", "%.1f"), figure(r, "peak_power_W", "%.1f"))

	b.WriteString("vram (per GPU, whole run)\n")
	line("peak", "%s MiB (the highest on any one GPU)", figure(r, "vram_peak_MB", "%.0f"))
	line("mean", "%s MiB", figure(r, "vram_avg_MB", "%.0f"))

	writeCost(&b, line, r)
	writeCO2(line, r)

	if r.StepsPerS != nil || r.FlopsTotal != nil {
		b.WriteString("compute\n")
		line("steps/s", "%s", figure(r, "steps_per_s", "%.4g"))
		line("time per epoch", "%s", showWith(r, "epoch_s", asDuration))
		line("est. total time", "%s", showWith(r, "est_total_s", asDuration))
		line("FLOPs per step", "%s", figure(r, "flops_per_step", "%.4g"))
		line("FLOPs total", "%s", figure(r, "flops_total", "%.4g"))
		line("MFU", "%s", figure(r, "mfu", "%.4f"))
		line("peak per GPU", "%s TFLOPS", figure(r, "peak_TFLOPS", "%.4g"))
		line("J per PFLOP", "%s", figure(r, "J_per_PFLOP", "%.4g"))
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

package ingest

import (
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/internal/batchcheck"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Limits on one batch.
const (
	MaxIDBytes    = batchcheck.MaxIDBytes
	MaxRunWindows = 10000
	MaxRunEvents  = 10000
	MaxGPUWindows = 10000
	// MaxRawSamples caps the raw samples of one batch, over all its GPUs
	// (an agent at 10 ms with 64 GPUs sends 6,400 a second).
	MaxRawSamples    = 1 << 20
	MaxLabels        = 256
	MaxMetadataBytes = batchcheck.MaxMetadataBytes
	MaxPhys          = batchcheck.MaxPhys
	// MaxWindowTokens caps tokens per run window (2^48), so run totals cannot
	// wrap around uint64.
	MaxWindowTokens = 1 << 48
	// MaxBatchSpan caps window_end − window_start (agent windows are 1 s).
	MaxBatchSpan = time.Hour
	// A run window's or event's times may lie up to MaxBatchAge before its
	// batch's window (downtime bridged after a crash) and up to MaxEventSkew
	// after it.
	MaxEventSkew = 10 * time.Minute
)

// inWindow checks that t lies within the batch window widened by MaxEventSkew.
func inWindow(what string, t *timestamppb.Timestamp, b *trainmeterv1.Batch) error {
	at := t.AsTime()
	if at.Before(b.GetWindowStart().AsTime().Add(-MaxBatchAge)) {
		return fmt.Errorf("%s %s is more than %s before the batch window", what, at.Format(time.RFC3339Nano), MaxBatchAge)
	}
	if at.After(b.GetWindowEnd().AsTime().Add(MaxEventSkew)) {
		return fmt.Errorf("%s %s is more than %s after the batch window", what, at.Format(time.RFC3339Nano), MaxEventSkew)
	}
	return nil
}

// each checks every element of xs, naming a failing one name[i].
func each[T any](name string, xs []T, check func(T) error) error {
	for i, x := range xs {
		if err := check(x); err != nil {
			return fmt.Errorf("%s[%d]: %w", name, i, err)
		}
	}
	return nil
}

// firstErr is the first non-nil of errs.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func finite(name string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("%s is not finite (%v)", name, v)
	}
	return nil
}

func validateHello(h *trainmeterv1.Hello) error {
	if err := batchcheck.ID("hello.node", h.GetNode()); err != nil {
		return err
	}
	return batchcheck.ID("hello.boot_id", h.GetBootId())
}

// maxSeq is the largest batch seq the collector takes.
const maxSeq = 1 << 53

// ValidateBatch checks a batch before anything of it is stored. The error
// text is what the agent gets in the Reject.
func ValidateBatch(b *trainmeterv1.Batch) error {
	if b.GetSeq() == 0 {
		return fmt.Errorf("seq must be > 0")
	}
	// Seqs count up from 1, one a second: 2^53 is never reached by an
	// agent, and a seq near 2^64 would wrap at seq+1.
	if b.GetSeq() > maxSeq {
		return fmt.Errorf("seq %d is implausibly large (> 2^53)", b.GetSeq())
	}
	if err := firstErr(batchcheck.Time("window_start", b.GetWindowStart()), batchcheck.Time("window_end", b.GetWindowEnd())); err != nil {
		return err
	}
	if b.GetWindowEnd().AsTime().Before(b.GetWindowStart().AsTime()) {
		return fmt.Errorf("window_end is before window_start")
	}
	if d := b.GetWindowEnd().AsTime().Sub(b.GetWindowStart().AsTime()); d > MaxBatchSpan {
		return fmt.Errorf("window spans %s, more than %s", d, MaxBatchSpan)
	}
	if n := len(b.GetRunWindows()); n > MaxRunWindows {
		return fmt.Errorf("%d run windows, more than %d", n, MaxRunWindows)
	}
	if n := len(b.GetRunEvents()); n > MaxRunEvents {
		return fmt.Errorf("%d run events, more than %d", n, MaxRunEvents)
	}
	if n := len(b.GetGpuWindows()); n > MaxGPUWindows {
		return fmt.Errorf("%d gpu windows, more than %d", n, MaxGPUWindows)
	}
	if err := each("gpu_windows", b.GetGpuWindows(), validateGPUWindow); err != nil {
		return err
	}
	if err := each("run_windows", b.GetRunWindows(), func(w *trainmeterv1.RunWindow) error {
		return firstErr(validateRunWindow(w), inWindow("start", w.GetStart(), b), inWindow("end", w.GetEnd(), b))
	}); err != nil {
		return err
	}
	if err := each("run_events", b.GetRunEvents(), func(e *trainmeterv1.RunEvent) error {
		return firstErr(validateEvent(e), inWindow("time", aggregate.EventTime(e), b))
	}); err != nil {
		return err
	}
	if n := len(b.GetLosses()); n > MaxLosses {
		return fmt.Errorf("%d loss records, more than %d", n, MaxLosses)
	}
	if err := each("losses", b.GetLosses(), batchcheck.Loss); err != nil {
		return err
	}
	if n := len(b.GetNodeLosses()); n > MaxLosses {
		return fmt.Errorf("%d node loss records, more than %d", n, MaxLosses)
	}
	if err := each("node_losses", b.GetNodeLosses(), batchcheck.NodeLoss); err != nil {
		return err
	}
	if err := validateRawSamples(b); err != nil {
		return err
	}
	if err := validateHostEnergy(b); err != nil {
		return err
	}
	if h := b.GetHost(); h != nil {
		if err := batchcheck.Phys("host.memory_used_mib", h.GetMemoryUsedMib(), "host.memory_total_mib", h.GetMemoryTotalMib(),
			"host.cpu_pct", h.GetCpuPct()); err != nil {
			return err
		}
	}
	return nil
}

// validateRawSamples checks the raw sample columns: lengths agree, times
// increase and lie in the batch window (widened like events), values are
// physical. It does not allocate: a batch may hold a million samples.
func validateRawSamples(b *trainmeterv1.Batch) error {
	rs := b.GetRawSamples()
	if len(rs) == 0 {
		return nil
	}
	lo := uint64(b.GetWindowStart().AsTime().Add(-MaxEventSkew).UnixNano())
	hi := uint64(b.GetWindowEnd().AsTime().Add(MaxEventSkew).UnixNano())
	total := 0
	for i, r := range rs {
		if r == nil {
			return fmt.Errorf("raw_samples[%d] is null", i)
		}
		ts := r.GetTUnixNs()
		n := len(ts)
		total += n
		if total > MaxRawSamples {
			return fmt.Errorf("more than %d raw samples", MaxRawSamples)
		}
		if len(r.GetPowerW()) != n {
			return fmt.Errorf("raw_samples[%d]: %d power_w values for %d times", i, len(r.GetPowerW()), n)
		}
		for _, col := range []struct {
			name string
			v    []float32
		}{{"utilization_pct", r.GetUtilizationPct()}, {"memory_used_mib", r.GetMemoryUsedMib()}} {
			if len(col.v) != 0 && len(col.v) != n {
				return fmt.Errorf("raw_samples[%d]: %d %s values for %d times", i, len(col.v), col.name, n)
			}
		}
		prev := uint64(0)
		for j, t := range ts {
			if t < lo || t > hi {
				return fmt.Errorf("raw_samples[%d]: t_unix_ns[%d] lies outside the batch window", i, j)
			}
			if t <= prev {
				return fmt.Errorf("raw_samples[%d]: t_unix_ns[%d] does not increase", i, j)
			}
			prev = t
		}
		for _, col := range []struct {
			name string
			v    []float32
		}{{"power_w", r.GetPowerW()}, {"utilization_pct", r.GetUtilizationPct()}, {"memory_used_mib", r.GetMemoryUsedMib()}} {
			for j, v := range col.v {
				if !(v >= 0 && v <= MaxPhys) { // also false for NaN
					return fmt.Errorf("raw_samples[%d]: %s[%d] is not a physical value (%v)", i, col.name, j, v)
				}
			}
		}
	}
	return nil
}

func validateGPUWindow(g *trainmeterv1.GpuWindow) error {
	if g == nil {
		return fmt.Errorf("is null")
	}
	if err := batchcheck.Text("uuid", g.GetUuid()); err != nil {
		return err
	}
	return batchcheck.Phys("energy_counter_j", g.GetEnergyCounterJ(), "energy_integrated_j", g.GetEnergyIntegratedJ(),
		"power_avg_w", g.GetPowerAvgW(), "power_max_w", g.GetPowerMaxW(), "power_last_w", g.GetPowerLastW(),
		"gap_s", g.GetGapS(), "memory_used_max_mib", g.GetMemoryUsedMaxMib(),
		"memory_used_avg_mib", g.GetMemoryUsedAvgMib(), "memory_total_mib", g.GetMemoryTotalMib(),
		"utilization_avg_pct", g.GetUtilizationAvgPct(),
		"gpu_seconds", g.GetGpuSeconds(), "idle_gpu_seconds", g.GetIdleGpuSeconds(),
		"idle_energy_counter_j", g.GetIdleEnergyCounterJ(), "idle_energy_integrated_j", g.GetIdleEnergyIntegratedJ(),
		"downtime_gpu_seconds", g.GetDowntimeGpuSeconds(), "downtime_energy_counter_j", g.GetDowntimeEnergyCounterJ(),
		"downtime_idle_gpu_seconds", g.GetDowntimeIdleGpuSeconds(), "downtime_idle_energy_counter_j", g.GetDowntimeIdleEnergyCounterJ(),
		"reclaimed_gpu_seconds", g.GetReclaimedGpuSeconds(), "reclaimed_energy_counter_j", g.GetReclaimedEnergyCounterJ(),
		"reclaimed_energy_integrated_j", g.GetReclaimedEnergyIntegratedJ())
}

func validateRunWindow(w *trainmeterv1.RunWindow) error {
	if w == nil {
		return fmt.Errorf("is null")
	}
	if err := batchcheck.ID("run_id", w.GetRunId()); err != nil {
		return err
	}
	if err := firstErr(batchcheck.Time("start", w.GetStart()), batchcheck.Time("end", w.GetEnd())); err != nil {
		return err
	}
	if w.GetEnd().AsTime().Before(w.GetStart().AsTime()) {
		return fmt.Errorf("end is before start")
	}
	switch w.GetPhase() {
	case trainmeterv1.Phase_PHASE_WARMUP, trainmeterv1.Phase_PHASE_MEASURED:
	default:
		return fmt.Errorf("phase must be PHASE_WARMUP or PHASE_MEASURED, got %v", w.GetPhase())
	}
	if w.GetTokens() > MaxWindowTokens {
		return fmt.Errorf("tokens (%d) more than %d in one window", w.GetTokens(), uint64(MaxWindowTokens))
	}
	if w.GetTokensMeasured() > w.GetTokens() {
		return fmt.Errorf("tokens_measured (%d) > tokens (%d)", w.GetTokensMeasured(), w.GetTokens())
	}
	if err := batchcheck.Phys("energy_counter_j", w.GetEnergyCounterJ(), "energy_integrated_j", w.GetEnergyIntegratedJ(),
		"gap_s", w.GetGapS(), "peak_power_w", w.GetPeakPowerW(), "vram_peak_mib", w.GetVramPeakMib(),
		"vram_sum_mib", w.GetVramSumMib(), "gpu_seconds", w.GetGpuSeconds(), "data_wait_s", w.GetDataWaitS(),
		"compute_s", w.GetComputeS(), "utilization_sum_pct", w.GetUtilizationSumPct(),
		"shared_gpu_seconds", w.GetSharedGpuSeconds()); err != nil {
		return err
	}
	switch w.GetShareMethod() {
	case "", "exclusive", "utilization", "memory", "equal", "mig", "mixed":
	default:
		return fmt.Errorf("share_method %q is not exclusive, utilization, memory, equal, mig or mixed", w.GetShareMethod())
	}
	if len(w.GetGpuShares()) > MaxGPUWindows {
		return fmt.Errorf("%d gpu_shares, at most %d", len(w.GetGpuShares()), MaxGPUWindows)
	}
	for i, sh := range w.GetGpuShares() {
		if err := batchcheck.Phys(fmt.Sprintf("gpu_shares[%d].energy_counter_j", i), sh.GetEnergyCounterJ(),
			fmt.Sprintf("gpu_shares[%d].energy_integrated_j", i), sh.GetEnergyIntegratedJ(),
			fmt.Sprintf("gpu_shares[%d].gpu_seconds", i), sh.GetGpuSeconds(),
			fmt.Sprintf("gpu_shares[%d].shared_gpu_seconds", i), sh.GetSharedGpuSeconds()); err != nil {
			return err
		}
	}
	return finite("last_loss", w.GetLastLoss())
}

func validateEvent(e *trainmeterv1.RunEvent) error {
	switch ev := e.GetEvent().(type) {
	case *trainmeterv1.RunEvent_RunStart:
		s := ev.RunStart
		if err := batchcheck.ID("run_start.run_id", s.GetRunId()); err != nil {
			return err
		}
		if err := batchcheck.Time("run_start.time", s.GetTime()); err != nil {
			return err
		}
		if err := batchcheck.Phys("run_start.warmup_s", s.GetWarmupS(), "run_start.gpu_price_per_hour", s.GetGpuPricePerHour()); err != nil {
			return err
		}
		if err := batchcheck.Text("run_start.user", s.GetUser()); err != nil {
			return err
		}
		for _, f := range []struct {
			name string
			v    float64
		}{{"run_start.target_gpu_utilization", s.GetTargetGpuUtilization()}, {"run_start.max_ram_usage", s.GetMaxRamUsage()}} {
			if math.IsNaN(f.v) || f.v < 0 || f.v > 1 {
				return fmt.Errorf("%s must be a fraction in [0, 1], got %v", f.name, f.v)
			}
		}
		m := s.GetMetadata()
		texts := []string{
			"model", m.GetModel(), "dataset", m.GetDataset(), "backend", m.GetBackend(),
			"optimizer", m.GetOptimizer(), "precision", m.GetPrecision(), "notes", m.GetNotes(),
			"gpu_name", s.GetGpuName(), "budget_scope", s.GetBudgetScope(), "plan_key", s.GetPlanKey(),
		}
		for i := 0; i < len(texts); i += 2 {
			if err := batchcheck.Text("run_start."+texts[i], texts[i+1]); err != nil {
				return err
			}
		}
		if len(s.GetLabels()) > MaxLabels {
			return fmt.Errorf("run_start.labels: %d labels, more than %d", len(s.GetLabels()), MaxLabels)
		}
		for k, v := range s.GetLabels() {
			if err := batchcheck.Text("run_start.labels key", k); err != nil {
				return err
			}
			if err := batchcheck.Text("run_start.labels["+k+"]", v); err != nil {
				return err
			}
		}
	case *trainmeterv1.RunEvent_RunEnd:
		if err := batchcheck.ID("run_end.run_id", ev.RunEnd.GetRunId()); err != nil {
			return err
		}
		if err := batchcheck.Time("run_end.time", ev.RunEnd.GetTime()); err != nil {
			return err
		}
		if w := ev.RunEnd.GetWarmupEnd(); w != nil {
			if err := batchcheck.Time("run_end.warmup_end", w); err != nil {
				return err
			}
		}
		if err := batchcheck.EndError("run_end.end_error", ev.RunEnd.GetEndError()); err != nil {
			return err
		}
		return batchcheck.Text("run_end.reason", ev.RunEnd.GetReason())
	case *trainmeterv1.RunEvent_Eval:
		if err := batchcheck.ID("eval.run_id", ev.Eval.GetRunId()); err != nil {
			return err
		}
		if err := batchcheck.Time("eval.time", ev.Eval.GetTime()); err != nil {
			return err
		}
		if err := finite("eval.val_loss", ev.Eval.GetValLoss()); err != nil {
			return err
		}
		// As the agent's socket parser: finite and >= 0 (a fraction or a
		// percentage; the collector does not know which).
		return batchcheck.Phys("eval.accuracy", ev.Eval.GetAccuracy())
	default:
		return fmt.Errorf("empty event")
	}
	return nil
}

// MaxLosses bounds the loss records in one batch (the agent sends one per
// run plus one per in-doubt batch, at most 4,096 of those).
const MaxLosses = 10000

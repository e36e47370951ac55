package ledger

import (
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
)

// A run started by `trainmeter run` (attribute_pid) carries only the
// metadata given on its command line; the script it wraps usually knows
// more (its client sends model, batch size, params, ...). The first joining
// client that names a field the wrapper left out fills it, so the run's
// summaries, budgets per model and forecasts see it. Where both name a field
// differently the command line wins: the join is still accepted (its tokens
// count), and both sides are told.

// MetadataConflict is returned by StartRun when a client joined a run
// started by `trainmeter run` whose command line set some fields
// differently. The join took effect; Error is what the joining client is
// told, StarterMessage what the wrapper (connection StarterConn) is told.
type MetadataConflict struct {
	Run          string
	StarterConn  uint64
	StarterFound bool     // false when the wrapper's connection is gone
	Fields       []string // `model "b" (kept "a")`, one per conflicting field
}

func (c *MetadataConflict) Error() string {
	return fmt.Sprintf("run_start: joined run %q, which keeps the values of trainmeter run's command line where this script's differ: %s",
		c.Run, strings.Join(c.Fields, ", "))
}

// StarterMessage is the conflict as `trainmeter run` shows it on stderr.
func (c *MetadataConflict) StarterMessage() string {
	return fmt.Sprintf("the command's client sent metadata that differs from this command line: %s; the run keeps the command line's values (leave those flags out to use the script's)",
		strings.Join(c.Fields, ", "))
}

// fillFrom fills the fields of dst (the run's merged run_start) that are
// unset from ev, and returns whether anything was filled and the
// conflicts: fields both set to different values (dst's are kept). Only
// the identifying fields conflict; for the others (notes, seed, plan,
// labels, ...) dst's value is kept silently.
func fillFrom(dst, ev *trainerproto.RunStart) (filled bool, conflicts []string) {
	strs := []struct {
		key      string
		dst      *string
		got      string
		identity bool
	}{
		{"model", &dst.Model, ev.Model, true}, {"dataset", &dst.Dataset, ev.Dataset, true},
		{"backend", &dst.Backend, ev.Backend, true}, {"optimizer", &dst.Optimizer, ev.Optimizer, true},
		{"precision", &dst.Precision, ev.Precision, true}, {"notes", &dst.Notes, ev.Notes, false},
		{"budget_scope", &dst.BudgetScope, ev.BudgetScope, false},
		{"plan_key", &dst.PlanKey, ev.PlanKey, false},
	}
	for _, s := range strs {
		switch {
		case s.got == "":
		case *s.dst == "":
			*s.dst, filled = s.got, true
		case *s.dst != s.got && s.identity:
			conflicts = append(conflicts, fmt.Sprintf("%s %q (kept %q)", s.key, s.got, *s.dst))
		}
	}
	ints := []struct {
		key      string
		dst      **int64
		got      *int64
		identity bool
	}{
		{"batch_size", &dst.BatchSize, ev.BatchSize, true}, {"grad_accum", &dst.GradAccum, ev.GradAccum, true},
		{"seq_len", &dst.SeqLen, ev.SeqLen, true}, {"seed", &dst.Seed, ev.Seed, false},
		{"num_workers", &dst.NumWorkers, ev.NumWorkers, false}, {"prefetch_factor", &dst.PrefetchFactor, ev.PrefetchFactor, false},
	}
	for _, n := range ints {
		switch {
		case n.got == nil:
		case *n.dst == nil:
			v := *n.got
			*n.dst, filled = &v, true
		case **n.dst != *n.got && n.identity:
			conflicts = append(conflicts, fmt.Sprintf("%s %s (kept %s)", n.key,
				strconv.FormatInt(*n.got, 10), strconv.FormatInt(**n.dst, 10)))
		}
	}
	for _, u := range []struct {
		dst **uint64
		got *uint64
	}{
		{&dst.PlannedSteps, ev.PlannedSteps}, {&dst.PlannedTokens, ev.PlannedTokens},
		{&dst.PlannedEpochs, ev.PlannedEpochs}, {&dst.Params, ev.Params}, {&dst.DatasetSize, ev.DatasetSize},
		{&dst.AdjustmentInterval, ev.AdjustmentInterval},
	} {
		if u.got != nil && *u.dst == nil {
			v := *u.got
			*u.dst, filled = &v, true
		}
	}
	for _, f := range []struct {
		dst **float64
		got *float64
	}{
		{&dst.GPUPricePerHour, ev.GPUPricePerHour}, {&dst.TargetGPUUtilization, ev.TargetGPUUtilization},
		{&dst.MaxRAMUsage, ev.MaxRAMUsage},
	} {
		if f.got != nil && *f.dst == nil {
			v := *f.got
			*f.dst, filled = &v, true
		}
	}
	for k, v := range ev.Labels {
		if _, have := dst.Labels[k]; !have {
			if dst.Labels == nil {
				dst.Labels = map[string]string{}
			}
			dst.Labels[k], filled = v, true
		}
	}
	return filled, conflicts
}

// starterCopy is the run_start a run started by `trainmeter run` keeps to
// fill: a copy, so filling never touches the event the caller passed.
func starterCopy(ev *trainerproto.RunStart) *trainerproto.RunStart {
	cp := *ev
	cp.Labels = maps.Clone(ev.Labels)
	return &cp
}

// starterConn is the connection of the member that started the run (the
// wrapper, possibly reconnected), or false when it is gone.
func (r *run) starterConn() (uint64, bool) {
	for c, key := range r.members {
		if key == r.starterKey {
			return c, true
		}
	}
	return 0, false
}

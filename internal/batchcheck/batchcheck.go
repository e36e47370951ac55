// Package batchcheck holds the checks on the parts of a batch that both the
// agent and the collector apply: the collector refuses a batch that fails
// them, and the agent checks the loss records it sends with the same code,
// because a refused batch's loss records go on with the next batch. A loss
// record the collector refuses would get every batch after it refused too.
package batchcheck

import (
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Limits on one batch's ids, texts and figures.
const (
	MaxIDBytes       = 256
	MaxMetadataBytes = 4096
	// MaxEndErrorBytes bounds RunEnd.end_error, the cause of a failed end
	// (the agent cuts a trainer's longer one at a character boundary).
	MaxEndErrorBytes = 1024
	// MaxPhys caps every physical figure (J, W, MiB, %, s) in a batch, so no
	// sum the collector folds can overflow to ±Inf (which JSON cannot store).
	MaxPhys = 1e12
	// MaxLossTokens and MaxLossBatches cap a loss record's counts, so run
	// totals cannot wrap around uint64.
	MaxLossTokens  = 1 << 56
	MaxLossBatches = 1 << 40
)

// ID checks a node, boot or run id: non-empty, at most MaxIDBytes, valid
// UTF-8, no NUL (the collector's store uses NUL as its key separator).
func ID(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%s is empty", what)
	case len(s) > MaxIDBytes:
		return fmt.Errorf("%s is %d bytes, more than %d", what, len(s), MaxIDBytes)
	case !utf8.ValidString(s):
		return fmt.Errorf("%s is not valid UTF-8", what)
	case strings.ContainsRune(s, 0):
		return fmt.Errorf("%s contains a NUL byte", what)
	}
	return nil
}

// Text checks a free text: at most MaxMetadataBytes of valid UTF-8.
func Text(what, s string) error { return utf8Max(what, s, MaxMetadataBytes) }

// EndError checks a run's end cause: at most MaxEndErrorBytes of valid
// UTF-8.
func EndError(what, s string) error { return utf8Max(what, s, MaxEndErrorBytes) }

func utf8Max(what, s string, limit int) error {
	if len(s) > limit {
		return fmt.Errorf("%s is %d bytes, more than %d", what, len(s), limit)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s is not valid UTF-8", what)
	}
	return nil
}

// Time checks a timestamp that must be there.
func Time(what string, t *timestamppb.Timestamp) error {
	if t == nil {
		return fmt.Errorf("%s is missing", what)
	}
	if err := t.CheckValid(); err != nil {
		return fmt.Errorf("%s: %v", what, err)
	}
	return nil
}

// Phys checks physical quantities, given as name, value pairs: finite,
// >= 0 and at most MaxPhys.
func Phys(pairs ...any) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		name, v := pairs[i].(string), pairs[i+1].(float64)
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("%s is not finite (%v)", name, v)
		}
		if v < 0 {
			return fmt.Errorf("%s is negative (%v)", name, v)
		}
		if v > MaxPhys {
			return fmt.Errorf("%s is implausibly large (%v > %g)", name, v, MaxPhys)
		}
	}
	return nil
}

// Loss checks a run's DataLoss record (Batch.losses: the agent's spool
// dropped data of the run).
func Loss(l *trainmeterv1.DataLoss) error {
	if l == nil {
		return fmt.Errorf("is null")
	}
	if err := ID("run_id", l.GetRunId()); err != nil {
		return err
	}
	if err := lossCommon(l); err != nil {
		return err
	}
	if l.GetTokens() > MaxLossTokens {
		return fmt.Errorf("tokens (%d) more than %d", l.GetTokens(), uint64(MaxLossTokens))
	}
	return Phys("energy_j", l.GetEnergyJ(), "gpu_seconds", l.GetGpuSeconds(), "host_energy_j", l.GetHostEnergyJ())
}

// NodeLoss checks a node's DataLoss record (Batch.node_losses): no run,
// and its idle parts and first window start as well.
func NodeLoss(l *trainmeterv1.DataLoss) error {
	if l == nil {
		return fmt.Errorf("is null")
	}
	if l.GetRunId() != "" {
		return fmt.Errorf("run_id %q is set (a node's record has none)", l.GetRunId())
	}
	if err := lossCommon(l); err != nil {
		return err
	}
	if l.GetFirstWindowStart() != nil {
		if err := Time("first_window_start", l.GetFirstWindowStart()); err != nil {
			return err
		}
	}
	return Phys("energy_j", l.GetEnergyJ(), "gpu_seconds", l.GetGpuSeconds(), "host_energy_j", l.GetHostEnergyJ(),
		"idle_energy_j", l.GetIdleEnergyJ(), "idle_gpu_seconds", l.GetIdleGpuSeconds(), "idle_host_energy_j", l.GetIdleHostEnergyJ())
}

func lossCommon(l *trainmeterv1.DataLoss) error {
	if err := Text("reason", l.GetReason()); err != nil {
		return err
	}
	if l.GetBatches() > MaxLossBatches {
		return fmt.Errorf("batches (%d) more than %d", l.GetBatches(), uint64(MaxLossBatches))
	}
	// Only read with a seq (the one batch's window); checked either way.
	if l.GetWindowStart() != nil {
		if err := Time("window_start", l.GetWindowStart()); err != nil {
			return err
		}
	}
	return nil
}

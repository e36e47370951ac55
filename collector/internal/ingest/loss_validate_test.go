package ingest

import (
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestLossRecordsAreValidated(t *testing.T) {
	now := timestamppb.Now()
	base := func(l *trainmeterv1.DataLoss) *trainmeterv1.Batch {
		return &trainmeterv1.Batch{Seq: 1, WindowStart: now, WindowEnd: now, Losses: []*trainmeterv1.DataLoss{l}}
	}
	if err := ValidateBatch(base(&trainmeterv1.DataLoss{RunId: "r", Batches: 2, Tokens: 10, EnergyJ: 1, GpuSeconds: 2, Reason: "spool full", Seq: 3, WindowStart: now})); err != nil {
		t.Errorf("good loss record rejected: %v", err)
	}
	for _, tc := range []struct {
		l    *trainmeterv1.DataLoss
		want string
	}{
		{&trainmeterv1.DataLoss{RunId: ""}, "run_id is empty"},
		{&trainmeterv1.DataLoss{RunId: "r", EnergyJ: math.NaN()}, "energy_j is not finite"},
		{&trainmeterv1.DataLoss{RunId: "r", EnergyJ: math.Inf(1)}, "energy_j is not finite"},
		{&trainmeterv1.DataLoss{RunId: "r", GpuSeconds: -1}, "gpu_seconds is negative"},
		{&trainmeterv1.DataLoss{RunId: "r", HostEnergyJ: math.NaN()}, "host_energy_j is not finite"},
		{&trainmeterv1.DataLoss{RunId: "r", HostEnergyJ: -1}, "host_energy_j is negative"},
		{&trainmeterv1.DataLoss{RunId: "r", Tokens: math.MaxUint64}, "tokens"},
		{&trainmeterv1.DataLoss{RunId: "r", Reason: "\xff"}, "reason is not valid UTF-8"},
		{&trainmeterv1.DataLoss{RunId: "r", Seq: 3, WindowStart: &timestamppb.Timestamp{Seconds: 1, Nanos: -1}}, "window_start"},
	} {
		err := ValidateBatch(base(tc.l))
		if err == nil || !strings.Contains(err.Error(), "losses[0]") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want %q", tc.l, err, tc.want)
		}
	}
}

func TestNodeLossValidation(t *testing.T) {
	now := timestamppb.Now()
	base := func(l *trainmeterv1.DataLoss) *trainmeterv1.Batch {
		return &trainmeterv1.Batch{Seq: 1, WindowStart: now, WindowEnd: now, NodeLosses: []*trainmeterv1.DataLoss{l}}
	}
	ok := &trainmeterv1.DataLoss{Batches: 2, EnergyJ: 10, GpuSeconds: 2, HostEnergyJ: 3, IdleEnergyJ: 4, IdleGpuSeconds: 1,
		IdleHostEnergyJ: 1, Reason: "spool full", Seq: 3, WindowStart: now, FirstWindowStart: now}
	if err := ValidateBatch(base(ok)); err != nil {
		t.Fatalf("valid node loss rejected: %v", err)
	}
	for _, tc := range []struct {
		l    *trainmeterv1.DataLoss
		want string
	}{
		{&trainmeterv1.DataLoss{RunId: "r"}, "run_id \"r\" is set"},
		{&trainmeterv1.DataLoss{IdleEnergyJ: math.NaN()}, "idle_energy_j is not finite"},
		{&trainmeterv1.DataLoss{IdleHostEnergyJ: -1}, "idle_host_energy_j is negative"},
		{&trainmeterv1.DataLoss{IdleGpuSeconds: math.Inf(1)}, "idle_gpu_seconds is not finite"},
		{&trainmeterv1.DataLoss{FirstWindowStart: &timestamppb.Timestamp{Seconds: 1, Nanos: -1}}, "first_window_start"},
		{&trainmeterv1.DataLoss{Reason: "\xff"}, "reason is not valid UTF-8"},
	} {
		err := ValidateBatch(base(tc.l))
		if err == nil || !strings.Contains(err.Error(), "node_losses[0]") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want %q", tc.l, err, tc.want)
		}
	}
}

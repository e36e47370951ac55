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

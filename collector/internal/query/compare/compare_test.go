package compare

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func run(id, backend string, jpt, tps float64, gpu string) *trainmeterv1.RunReport {
	return &trainmeterv1.RunReport{RunId: id, Ended: true, JPerToken: proto.Float64(jpt), TokPerS: proto.Float64(tps), VramPeakMb: 1000, GpuName: gpu, Nodes: 1,
		Metadata: &trainmeterv1.RunMetadata{Model: "m", Backend: backend, BatchSize: proto.Int64(8)}}
}

func TestCompareByBackend(t *testing.T) {
	runs := []*trainmeterv1.RunReport{
		run("u1", "unsloth", 1.0, 200, "A100"), run("b1", "bnb", 2.0, 100, "A100"), run("u2", "unsloth", 1.2, 220, "A100"),
		run("b2", "bnb", 2.2, 90, "A100"), run("b3", "bnb", 1.8, 110, "A100"), run("x", "other", 5, 10, "H100"),
	}
	resp, err := Compare(&trainmeterv1.CompareRequest{Model: "m", By: "backend", Baseline: "bnb"}, runs)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetBaseline() != "bnb" || len(resp.GetGroups()) != 3 || resp.GetGroups()[0].GetKey() != "bnb" {
		t.Fatalf("%v", resp)
	}
	// Each run's own rates, in its group's order, for a scatter.
	var pts []string
	for _, p := range resp.GetGroups()[0].GetPoints() {
		pts = append(pts, fmt.Sprintf("%s %g %g", p.GetRunId(), p.GetJPerToken(), p.GetTokPerS()))
	}
	if got := strings.Join(pts, ", "); got != "b1 2 100, b2 2.2 90, b3 1.8 110" {
		t.Errorf("bnb points %s", got)
	}
	bnb := resp.GetGroups()[0].GetJPerToken()
	if bnb.GetN() != 3 || math.Abs(bnb.GetMean()-2) > 1e-12 || bnb.CiLow == nil {
		t.Errorf("bnb J/token %v", bnb)
	}
	var uns *trainmeterv1.CompareRow
	for _, r := range resp.GetRows() {
		if r.GetKey() == "unsloth" {
			uns = r
		}
	}
	if uns == nil {
		t.Fatalf("no unsloth row: %v", resp.GetRows())
	}
	// 1.1 J/token against 2.0: ratio 0.55, a 45 % saving; 210 tok/s against 100.
	if math.Abs(uns.GetJPerTokenRatio().GetValue()-0.55) > 1e-12 || math.Abs(uns.GetEnergySavingPct().GetValue()-45) > 1e-9 ||
		math.Abs(uns.GetSpeedup().GetValue()-2.1) > 1e-12 {
		t.Errorf("unsloth row %v", uns)
	}
	e := uns.GetEnergySavingPct()
	if e.CiLow == nil || e.GetCiLow() > 45 || e.GetCiHigh() < 45 || e.PValue == nil || e.GetPValue() <= 0 || e.GetPValue() > 0.05 {
		t.Errorf("energy saving %v: want an interval around 45 and p < 0.05", e)
	}
	if uns.GetCostSavingPct() != nil {
		t.Errorf("no run has a price, yet a cost saving: %v", uns.GetCostSavingPct())
	}
	w := strings.Join(resp.GetWarnings(), "\n")
	for _, want := range []string{"group other has one run: no confidence interval", "unfair comparison: the runs differ in GPU model (bnb: A100; other: H100; unsloth: A100)"} {
		if !strings.Contains(w, want) {
			t.Errorf("warnings lack %q:\n%s", want, w)
		}
	}
	for _, r := range resp.GetRows() {
		if r.GetKey() == "other" && (r.GetSpeedup().CiLow != nil || r.GetSpeedup().PValue != nil) {
			t.Errorf("one-run group has an interval or p-value: %v", r)
		}
	}
}

func TestComparePickedRunsAndErrors(t *testing.T) {
	all := []*trainmeterv1.RunReport{run("a", "x", 2, 100, "A100"), run("b", "x", 1, 150, "A100")}
	sel, err := Select(&trainmeterv1.CompareRequest{RunIds: []string{"b", "a"}}, all)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := Compare(&trainmeterv1.CompareRequest{}, sel)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetBaseline() != "b" || resp.GetRows()[0].GetKey() != "a" || resp.GetRows()[0].GetSpeedup().GetValue() != 100.0/150 {
		t.Errorf("%v", resp)
	}
	for _, tc := range []struct {
		req  *trainmeterv1.CompareRequest
		want string
	}{
		{&trainmeterv1.CompareRequest{RunIds: []string{"a", "zz"}}, `unknown run(s): ["zz"]`},
		{&trainmeterv1.CompareRequest{}, "give at least two runs, or a model"},
		{&trainmeterv1.CompareRequest{Model: "nope"}, `model "nope" has no ended runs`},
		{&trainmeterv1.CompareRequest{Model: "m", By: "colour"}, `cannot group by "colour"`},
		{&trainmeterv1.CompareRequest{Model: "m", By: "backend"}, "all 2 run(s) have backend = x"},
		{&trainmeterv1.CompareRequest{Model: "m", By: "label:team"}, "all 2 run(s) have label:team = (none)"},
		{&trainmeterv1.CompareRequest{Model: "m", Baseline: "q"}, `no group "q"`},
	} {
		sel, err := Select(tc.req, all)
		if err == nil {
			_, err = Compare(tc.req, sel)
		}
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.req, err, tc.want)
		}
	}
}

func TestGroupsSortNumerically(t *testing.T) {
	a, b := run("a", "x", 1, 1, "g"), run("b", "x", 1, 1, "g")
	a.Metadata.BatchSize, b.Metadata.BatchSize = proto.Int64(16), proto.Int64(8)
	resp, err := Compare(&trainmeterv1.CompareRequest{By: "batch_size"}, []*trainmeterv1.RunReport{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetBaseline() != "8" || resp.GetGroups()[1].GetKey() != "16" {
		t.Errorf("%v", resp)
	}
}

func TestCompareNoRuns(t *testing.T) {
	if _, err := Compare(&trainmeterv1.CompareRequest{By: "backend"}, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("no runs: %v", err)
	}
}

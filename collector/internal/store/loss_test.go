package store

import (
	"testing"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestLossReportsMarkTheRunIncompleteAndSkipBatchesThatArrived(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	if _, err := s.ApplyBatch("n", "b", batch(1, "r", 0, 100, 10, runStart("r", 0))); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ApplyBatch("n", "b", batch(2, "r", 1, 200, 20)); err != nil {
		t.Fatal(err)
	}
	// Batch 3 carries: a certain loss of 2 batches, an in-doubt loss of
	// batch 2 (which arrived: ignored), and an in-doubt loss of batch 9
	// (never arrived: counted).
	b := batch(3, "r", 5, 300, 30)
	b.Losses = []*trainmeterv1.DataLoss{
		{RunId: "r", Batches: 2, Tokens: 700, EnergyJ: 70, GpuSeconds: 2, Reason: "spool full"},
		{RunId: "r", Batches: 1, Tokens: 200, EnergyJ: 20, GpuSeconds: 1, Reason: "spool full", Seq: 2, WindowStart: ts(1)},
		{RunId: "r", Batches: 1, Tokens: 50, EnergyJ: 5, GpuSeconds: 1, Reason: "disk full", Seq: 9},
	}
	if _, err := s.ApplyBatch("n", "b", b); err != nil {
		t.Fatal(err)
	}
	// Re-sent: deduplicated, the loss is not counted twice.
	if dup, err := s.ApplyBatch("n", "b", b); err != nil || !dup {
		t.Fatalf("dup %v err %v", dup, err)
	}
	st, err := s.GetRun("r")
	if err != nil {
		t.Fatal(err)
	}
	r := st.Report(aggregate.Pricing{})
	if !r.Incomplete || r.LostBatches != 3 || r.LostTokens != 750 || r.LostEnergyJ != 75 || r.LostGpuSeconds != 3 {
		t.Errorf("report incomplete %v lost batches %d tokens %d energy %v gpu-s %v",
			r.Incomplete, r.LostBatches, r.LostTokens, r.LostEnergyJ, r.LostGpuSeconds)
	}
	if r.TokensProcessed != 600 {
		t.Errorf("tokens_processed %d, want 600", r.TokensProcessed)
	}
	if len(r.LostReasons) != 2 || r.LostReasons[0] != "spool full" || r.LostReasons[1] != "disk full" {
		t.Errorf("reasons %v", r.LostReasons)
	}
}

// hostShare gives b one RAPL interval wholly the run's: cpu and dram J.
func hostShare(b *trainmeterv1.Batch, run string, cpu, dram float64) *trainmeterv1.Batch {
	b.HostEnergy = append(b.HostEnergy, &trainmeterv1.HostEnergy{Start: b.WindowStart, End: b.WindowEnd,
		CpuEnergyJ: cpu, DramEnergyJ: dram, DramOk: true,
		Runs: []*trainmeterv1.HostEnergyShare{{RunId: run, CpuEnergyJ: cpu, DramEnergyJ: dram, Share: 1, Split: "exclusive"}}})
	return b
}

// The run's host energy in dropped batches is counted lost like their GPU
// energy (an in-doubt record of a batch that arrived: not at all), and
// kept across a restart of the collector.
func TestLostHostEnergyShowsInTheRunsReport(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if _, err := s.ApplyBatch("n", "b", hostShare(batch(1, "r", 0, 100, 10, runStart("r", 0)), "r", 40, 8)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ApplyBatch("n", "b", hostShare(batch(2, "r", 1, 100, 10), "r", 40, 8)); err != nil {
		t.Fatal(err)
	}
	b := hostShare(batch(5, "r", 4, 100, 10), "r", 40, 8)
	b.Losses = []*trainmeterv1.DataLoss{
		{RunId: "r", Batches: 2, Tokens: 200, EnergyJ: 20, GpuSeconds: 2, HostEnergyJ: 96, Reason: "spool full"},
		{RunId: "r", Batches: 1, Tokens: 100, EnergyJ: 10, GpuSeconds: 1, HostEnergyJ: 48, Reason: "spool full", Seq: 2, WindowStart: ts(1)},
	}
	if _, err := s.ApplyBatch("n", "b", b); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		st, err := s.GetRun("r")
		if err != nil {
			t.Fatal(err)
		}
		r := st.Report(aggregate.Pricing{})
		if r.LostHostEnergyJ != 96 || r.LostEnergyJ != 20 {
			t.Errorf("%s: lost host energy %v J, GPU energy %v J; want 96 and 20", when, r.LostHostEnergyJ, r.LostEnergyJ)
		}
		if r.GetCpuEnergyJ()+r.GetDramEnergyJ() != 144 {
			t.Errorf("%s: host energy %v + %v J, want the 144 J that arrived", when, r.GetCpuEnergyJ(), r.GetDramEnergyJ())
		}
	}
	check("live")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	defer s.Close()
	check("after a restart")
}

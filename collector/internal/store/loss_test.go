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

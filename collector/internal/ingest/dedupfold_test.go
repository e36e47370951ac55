package ingest

import (
	"testing"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// An in-doubt loss record of a batch the collector applied is dropped; one
// of a batch never applied is counted. Over a real stream.
func TestInDoubtLossOfAnAppliedBatchIsDropped(t *testing.T) {
	st := openStore(t)
	_, conn := serve(t, st)
	a := tu.Connect(t, conn, "n1", "boot")
	a.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r1", 0, 100, 10)}, tu.Start("r1", 0, "m")))
	a.MustAck(tu.Batch(2, 1, []*trainmeterv1.RunWindow{tu.Window("r1", 1, 100, 10)}))
	loss := func(seq uint64, sec float64) *trainmeterv1.DataLoss {
		return &trainmeterv1.DataLoss{RunId: "r1", Batches: 1, Tokens: 100, EnergyJ: 10, GpuSeconds: 1, Reason: "spool full", Seq: seq, WindowStart: tu.TS(sec)}
	}
	b := tu.Batch(5, 4, []*trainmeterv1.RunWindow{tu.Window("r1", 4, 100, 10)})
	b.Losses = []*trainmeterv1.DataLoss{loss(2, 1), loss(3, 2)} // 2 was applied, 3 never came
	a.MustAck(b)
	run, err := st.GetRun("r1")
	if err != nil {
		t.Fatal(err)
	}
	if r := run.Report(aggregate.Pricing{}); r.LostBatches != 1 || r.LostTokens != 100 {
		t.Errorf("lost batches %d tokens %d, want 1 and 100 (seq 3 only)", r.LostBatches, r.LostTokens)
	}
}

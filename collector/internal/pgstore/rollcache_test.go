package pgstore_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/storage"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/pgtest"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// TestRollupsAcrossReplicas: a node's batches alternate between two
// collectors on one database, each keeping the rollup rows it wrote; a
// late batch lands in a minute already left. Every minute's rollup rows
// hold exactly the sum of its records: a collector whose rows the other
// wrote since reads them again rather than adding to its own stale copy.
func TestRollupsAcrossReplicas(t *testing.T) {
	url := pgtest.DB(t)
	a, b := open(t, url), open(t, url)
	node := storage.Sender{Node: "n", Boot: "b"}
	send := func(st interface {
		ApplyBatchResult(storage.Sender, *trainmeterv1.Batch) (storage.Applied, error)
	}, seq uint64, sec float64) {
		t.Helper()
		bt := tu.Batch(seq, sec, []*trainmeterv1.RunWindow{tu.Window("r", sec, 10, 5)})
		if seq == 1 {
			bt.RunEvents = append(bt.RunEvents, tu.Start("r", sec, "m"))
		}
		if ap, err := st.ApplyBatchResult(node, bt); err != nil || ap.Duplicate {
			t.Fatalf("batch %d: %+v, %v", seq, ap, err)
		}
	}
	send(a, 1, 0)
	send(a, 2, 1) // from a's cache
	send(b, 3, 2) // b reads a's rows
	send(a, 4, 3) // a's cache is stale: read again
	send(a, 5, 61)
	send(b, 6, 62)
	send(a, 7, 63) // stale again
	send(a, 8, 4)  // late: minute 0 again, not cached
	if n := a.CommitStats().RollupRereads; n != 2 {
		t.Errorf("collector a read its cached rows again %d times, want 2 (after each of b's writes)", n)
	}

	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	tokens := map[int64]uint64{}
	gpuS := map[int64]float64{}
	rows, _ := conn.Query(t.Context(), `SELECT start_ns, w FROM run_rollups WHERE node = 'n' AND run_id = 'r'`)
	var start int64
	var val []byte
	if _, err := pgx.ForEachRow(rows, []any{&start, &val}, func() error {
		w := &trainmeterv1.RunWindow{}
		if err := proto.Unmarshal(val, w); err != nil {
			return err
		}
		tokens[start-tu.T0.UnixNano()] += w.GetTokens()
		gpuS[start-tu.T0.UnixNano()] += w.GetGpuSeconds()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	const m1 = int64(60e9)
	if tokens[0] != 50 || tokens[m1] != 30 || gpuS[0] != 5 || gpuS[m1] != 3 || len(tokens) != 2 {
		t.Errorf("run rollups: tokens %v, GPU-s %v; want minute 0: 50 tokens, 5 GPU-s; minute 1: 30, 3", tokens, gpuS)
	}
	energy := map[int64]float64{}
	rows, _ = conn.Query(t.Context(), `SELECT start_ns, b FROM node_rollups WHERE node = 'n'`)
	if _, err := pgx.ForEachRow(rows, []any{&start, &val}, func() error {
		b := &trainmeterv1.Batch{}
		if err := proto.Unmarshal(val, b); err != nil {
			return err
		}
		for _, g := range b.GetGpuWindows() {
			energy[start-tu.T0.UnixNano()] += g.GetEnergyCounterJ()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if energy[0] != 500 || energy[m1] != 300 || len(energy) != 2 {
		t.Errorf("node rollups: GPU energy by minute %v, want minute 0: 500 J, minute 1: 300 J", energy)
	}
}

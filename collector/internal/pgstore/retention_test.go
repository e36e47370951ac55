package pgstore_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/pgstore"
	"github.com/trainmeter/trainmeter/collector/internal/query"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/pgtest"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// retentionBatch is a second of node n1: the run's window takes 0.75
// GPU-seconds and 80 J of the GPU's 1 s and 100 J, idle the rest.
func retentionBatch(seq uint64, sec float64, events ...*trainmeterv1.RunEvent) *trainmeterv1.Batch {
	w := tu.Window("r", sec, 10, 80)
	w.GpuSeconds = 0.75
	b := tu.Batch(seq, sec, []*trainmeterv1.RunWindow{w}, events...)
	b.GpuWindows = []*trainmeterv1.GpuWindow{{Gpu: 0, GpuSeconds: 1, EnergyCounterJ: 100, CounterOk: true,
		IdleGpuSeconds: 0.25, IdleEnergyCounterJ: 20, Samples: 20}}
	return b
}

// usageTotals is a usage answer's node totals and the sums of its rows
// (runs, deleted runs and idle), which must match.
type usageTotals struct{ nodeS, nodeJ, rowS, rowJ, idleS float64 }

func usageOf(t *testing.T, q *query.Server, since, until time.Time) usageTotals {
	t.Helper()
	req := &trainmeterv1.UsageRequest{}
	if !since.IsZero() {
		req.Since = timestamppb.New(since)
	}
	if !until.IsZero() {
		req.Until = timestamppb.New(until)
	}
	resp, err := q.Usage(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	var u usageTotals
	for _, n := range resp.GetNodes() {
		u.nodeS += n.GetGpuSeconds()
		u.nodeJ += n.GetEnergyJ()
	}
	for _, r := range resp.GetRows() {
		u.rowS += r.GetGpuSeconds()
		u.rowJ += r.GetEnergyJ()
		if r.GetIdle() {
			u.idleS += r.GetGpuSeconds()
		}
	}
	return u
}

func nearRel6(a, b float64) bool { return math.Abs(a-b) < 1e-6*max(1, math.Abs(b)) }

func (u usageTotals) addsUp(t *testing.T, what string, nodeS float64) {
	t.Helper()
	if !nearRel6(u.nodeS, nodeS) || !nearRel6(u.rowS, u.nodeS) || !nearRel6(u.rowJ, u.nodeJ) || !nearRel6(u.nodeJ, nodeS*100) {
		t.Errorf("%s: node %v GPU-s %v J, rows %v GPU-s %v J; want node %v GPU-s %v J, rows adding up to it", what, u.nodeS, u.nodeJ, u.rowS, u.rowJ, nodeS, nodeS*100)
	}
}

// TestRetentionDropsDays: past the raw retention Maintain drops whole day
// partitions; run aggregates and rollups stay, so usage across the drop
// still adds up (runs + idle = node), a timeline still answers, and
// reprice and delete count what was dropped once.
func TestRetentionDropsDays(t *testing.T) {
	url := pgtest.DB(t)
	clk := clock.NewFake(tu.T0)
	st := openWith(t, url, pgstore.Options{Clock: clk, RawRetention: 48 * time.Hour, DedupRetention: 48 * time.Hour})
	q := query.New(st, nil, aggregate.Pricing{GPUPricePerHour: 2})
	apply := func(seq uint64, sec float64, ev ...*trainmeterv1.RunEvent) {
		t.Helper()
		if _, err := st.ApplyBatchResult(storage.Sender{Node: "n1", Boot: "b"}, retentionBatch(seq, sec, ev...)); err != nil {
			t.Fatal(err)
		}
	}
	// Two minutes on 1 March, one on 4 March.
	for s := range 120 {
		var ev []*trainmeterv1.RunEvent
		if s == 0 {
			ev = append(ev, tu.Start("r", 0, "m"))
		}
		apply(uint64(s+1), float64(s), ev...)
	}
	later := float64(3 * 24 * 3600)
	for s := range 60 {
		apply(uint64(121+s), later+float64(s))
	}
	before := usageOf(t, q, time.Time{}, time.Time{})
	before.addsUp(t, "usage before the drop", 180)

	clk.Advance(3*24*time.Hour + time.Hour)
	if err := st.Maintain(context.Background()); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for name, want := range map[string]bool{"run_windows_p20250301": false, "node_windows_p20250301": false, "applied_batches_p20250301": false,
		"run_windows_p20250304": true, "node_windows_p20250305": true} {
		var has bool
		if err := conn.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&has); err != nil || has != want {
			t.Errorf("partition %s exists: %v (%v), want %v", name, has, err, want)
		}
	}
	var raw int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM run_windows`).Scan(&raw); err != nil || raw != 60 {
		t.Errorf("raw run windows left: %d (%v), want 60", raw, err)
	}

	after := usageOf(t, q, time.Time{}, time.Time{})
	after.addsUp(t, "usage across the drop", 180)
	if !nearRel6(after.idleS, before.idleS) {
		t.Errorf("idle GPU-s %v after the drop, %v before", after.idleS, before.idleS)
	}
	usageOf(t, q, tu.T0, tu.T0.Add(time.Minute)).addsUp(t, "usage of the first minute (rollups)", 60)
	usageOf(t, q, tu.T0.Add(time.Minute), tu.T0.Add(4*24*time.Hour)).addsUp(t, "usage from the second minute (rollups and raw)", 120)

	r, err := st.GetRun("r")
	if err != nil || r.GetTokens() != 1800 {
		t.Fatalf("run aggregate after the drop: %d tokens (%v), want 1800", r.GetTokens(), err)
	}
	ws, _, err := st.RunTimeline("r")
	if err != nil || len(ws) != 2+60 {
		t.Fatalf("timeline after the drop: %d windows (%v), want 2 minute rollups and 60 raw", len(ws), err)
	}
	var tokens uint64
	for _, w := range ws {
		tokens += w.Window.GetTokens()
	}
	if tokens != 1800 {
		t.Errorf("timeline tokens %d, want 1800", tokens)
	}

	_, _, ch, err := st.Reprice("r", time.Time{}, 3, "test", func(*aggregate.State) *trainmeterv1.RunReport { return &trainmeterv1.RunReport{} })
	if err != nil || !nearRel6(ch.GPUSeconds, 180*0.75) {
		t.Errorf("reprice after the drop: %v GPU-s (%v), want %v (rollups and raw, each once)", ch.GPUSeconds, err, 180*0.75)
	}
	usageOf(t, q, time.Time{}, time.Time{}).addsUp(t, "usage after reprice", 180)

	if _, err := st.DeleteRun("r"); err != nil {
		t.Fatal(err)
	}
	usageOf(t, q, time.Time{}, time.Time{}).addsUp(t, "usage after delete (deleted run's rows)", 180)
}

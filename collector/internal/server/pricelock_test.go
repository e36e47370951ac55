package server_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

const lockGPU = "NVIDIA H100 80GB HBM3" // the catalog's "H100 SXM"

// lockBatch is one second of node-1: GPU 0 used by run (1 GPU-second,
// 300 J), GPU 1 idle (1 GPU-second, 100 J).
func lockBatch(seq uint64, sec float64, run string, events ...*trainmeterv1.RunEvent) *trainmeterv1.Batch {
	var ws []*trainmeterv1.RunWindow
	if run != "" {
		ws = append(ws, tu.Window(run, sec, 100, 300))
	}
	b := tu.Batch(seq, sec, ws, events...)
	b.GpuWindows = []*trainmeterv1.GpuWindow{
		{Gpu: 0, EnergyCounterJ: 300, CounterOk: true, EnergyIntegratedJ: 300, GpuSeconds: 1, Samples: 20},
		{Gpu: 1, EnergyCounterJ: 100, CounterOk: true, EnergyIntegratedJ: 100, GpuSeconds: 1, Samples: 20,
			IdleGpuSeconds: 1, IdleEnergyCounterJ: 100, IdleEnergyIntegratedJ: 100},
	}
	return b
}

func lockStart(run string, sec float64, gpu string) *trainmeterv1.RunEvent {
	e := tu.Start(run, sec, "llama")
	e.GetRunStart().GpuName = gpu
	return e
}

// lockFigures is what a bill is made of: the runs' cost, the idle rows'
// cost and the budget's spent.
type lockFigures struct {
	costR, totalR, costF, totalF, idle, spent float64
	sourceR                                   string
}

func readLockFigures(t *testing.T, addr string) lockFigures {
	t.Helper()
	conn := tu.Dial(t, addr)
	q := trainmeterv1.NewQueryServiceClient(conn)
	var f lockFigures
	r := getRun(t, q, "r")
	if !r.GetEnded() || r.CostUsd == nil || r.EnergyCostUsd == nil {
		t.Fatalf("run r: ended %v, cost %v, energy cost %v", r.GetEnded(), r.CostUsd, r.EnergyCostUsd)
	}
	f.costR, f.totalR, f.sourceR = r.GetCostUsd(), r.GetTotalCostUsd(), r.GetPriceSource()
	fr := getRun(t, q, "f")
	f.costF, f.totalF = fr.GetCostUsd(), fr.GetTotalCostUsd()
	u, err := q.Usage(t.Context(), &trainmeterv1.UsageRequest{By: []string{"node"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range u.GetRows() {
		if row.GetIdle() {
			f.idle += row.GetCostUsd()
		}
	}
	bs, err := trainmeterv1.NewBudgetServiceClient(conn).ListBudgets(t.Context(), &trainmeterv1.ListBudgetsRequest{})
	if err != nil || len(bs.GetBudgets()) != 1 {
		t.Fatalf("budgets %v %v", bs, err)
	}
	f.spent = bs.GetBudgets()[0].GetSpentUsd()
	return f
}

func sameMoney(a, b float64) bool { return math.Abs(a-b) <= 1e-12*math.Max(1, math.Abs(a)) }

func (f lockFigures) same(g lockFigures) bool {
	return sameMoney(f.costR, g.costR) && sameMoney(f.totalR, g.totalR) && sameMoney(f.costF, g.costF) &&
		sameMoney(f.totalF, g.totalF) && sameMoney(f.idle, g.idle) && sameMoney(f.spent, g.spent)
}

// TestEndedRunKeepsItsPrice: the cost of usage is locked when it is
// ingested. Run r (priced from the catalog at $3.60/GPU-hour), run f (on a
// GPU the catalog lacks: priced at --gpu-price-per-hour) and node-1's idle
// GPU end; a cheaper price list, then a restart with another
// --gpu-price-per-hour, leave their cost, the idle row's and the budget's
// spent as they were.
func TestEndedRunKeepsItsPrice(t *testing.T) {
	dir := t.TempDir()
	cfg := server.Config{Listen: "127.0.0.1:0", DataDir: dir, Clock: tu.Clock(), GPUPricePerHour: 1.8, EnergyPricePerKWh: 0.36,
		Budget: server.BudgetConfig{EvalInterval: time.Hour}}
	srv := server.New(cfg, quiet())
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	conn := tu.Dial(t, srv.Addr().String())
	prices := trainmeterv1.NewPriceServiceClient(conn)
	if _, err := prices.ImportPrices(t.Context(), &trainmeterv1.ImportPricesRequest{Offers: []*trainmeterv1.PriceOffer{
		{GpuName: "H100 SXM", NumGpus: 8, UsdPerHour: 28.8}, // $3.60 per GPU-hour
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := trainmeterv1.NewBudgetServiceClient(conn).SetBudget(t.Context(), &trainmeterv1.SetBudgetRequest{Scope: "model:llama", LimitUsd: 100}); err != nil {
		t.Fatal(err)
	}
	a := tu.ConnectHello(t, conn, &trainmeterv1.Hello{Node: "node-1", BootId: "boot", Gpus: []*trainmeterv1.GpuInfo{{Index: 0, Name: lockGPU}, {Index: 1, Name: lockGPU}}})
	a.MustAck(lockBatch(1, 0, "r", lockStart("r", 0, lockGPU)))
	a.MustAck(lockBatch(2, 1, "r", tu.End("r", 2)))
	a.MustAck(lockBatch(3, 2, "f", lockStart("f", 2, "NVIDIA A10G")))
	a.MustAck(lockBatch(4, 3, "f", tu.End("f", 4)))

	before := readLockFigures(t, srv.Addr().String())
	// r: 2 GPU-seconds at $3.60/h plus 600 J at $0.36/kWh.
	if want := 2.0/3600*3.6 + 600/3.6e6*0.36; !sameMoney(before.totalR, want) || before.sourceR != "catalog" {
		t.Fatalf("run r before: total $%v from %q, want $%v from the catalog", before.totalR, before.sourceR, want)
	}
	if want := 4.0/3600*3.6 + 400/3.6e6*0.36; !sameMoney(before.idle, want) {
		t.Fatalf("idle before: $%v, want $%v (4 idle GPU-seconds at the catalog's $3.60)", before.idle, want)
	}

	// A cheaper offer: $0.45 per GPU-hour.
	if _, err := prices.ImportPrices(t.Context(), &trainmeterv1.ImportPricesRequest{Offers: []*trainmeterv1.PriceOffer{
		{GpuName: "H100 SXM", NumGpus: 8, UsdPerHour: 3.6},
	}}); err != nil {
		t.Fatal(err)
	}
	if after := readLockFigures(t, srv.Addr().String()); !after.same(before) {
		t.Errorf("a cheaper price list re-priced ended usage:\n before %+v\n after  %+v", before, after)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	cfg.GPUPricePerHour, cfg.EnergyPricePerKWh = 7.2, 0.05
	srv2 := start(t, cfg)
	if after := readLockFigures(t, srv2.Addr().String()); !after.same(before) {
		t.Errorf("a restart with other prices re-priced ended usage:\n before %+v\n after  %+v", before, after)
	}

	// reprice is the explicit correction: run r at $0.90/GPU-hour.
	conn2 := tu.Dial(t, srv2.Addr().String())
	q := trainmeterv1.NewQueryServiceClient(conn2)
	for _, bad := range []*trainmeterv1.RepriceRequest{
		{RunId: "r", UsdPerGpuHour: 0.9},                 // no reason
		{RunId: "r", UsdPerGpuHour: -1, Reason: "x"},     // bad price
		{UsdPerGpuHour: 0.9, Reason: "x"},                // neither run nor since
		{RunId: "nope", UsdPerGpuHour: 0.9, Reason: "x"}, // unknown run
	} {
		if _, err := q.Reprice(t.Context(), bad); err == nil {
			t.Errorf("reprice %v accepted", bad)
		}
	}
	resp, err := q.Reprice(t.Context(), &trainmeterv1.RepriceRequest{RunId: "r", UsdPerGpuHour: 0.9, Reason: "contract price from March"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetRuns()) != 1 || !sameMoney(resp.GetRuns()[0].GetPreviousCostUsd(), before.costR) {
		t.Errorf("reprice response %v", resp)
	}
	r := getRun(t, q, "r")
	if want := 2.0 / 3600 * 0.9; !sameMoney(r.GetCostUsd(), want) || r.GetPriceSource() != "repriced" {
		t.Errorf("repriced run: cost $%v from %q, want $%v from \"repriced\"", r.GetCostUsd(), r.GetPriceSource(), want)
	}
	if r.GetRepricedAt() == nil || r.PreviousCostUsd == nil || !sameMoney(r.GetPreviousCostUsd(), before.costR) ||
		!sameMoney(r.GetPreviousTotalCostUsd(), before.totalR) || r.GetRepriceReason() != "contract price from March" {
		t.Errorf("repriced run: repriced_at %v, previous cost %v / %v, reason %q; want them set (previous $%v / $%v)",
			r.GetRepricedAt(), r.PreviousCostUsd, r.PreviousTotalCostUsd, r.GetRepriceReason(), before.costR, before.totalR)
	}
	// The energy booked is not touched; run f and the idle rows neither.
	if want := 2.0/3600*0.9 + 600/3.6e6*0.36; !sameMoney(r.GetTotalCostUsd(), want) {
		t.Errorf("repriced run: total $%v, want $%v", r.GetTotalCostUsd(), want)
	}
	after := readLockFigures(t, srv2.Addr().String())
	if !sameMoney(after.costF, before.costF) || !sameMoney(after.idle, before.idle) {
		t.Errorf("reprice of r changed f or the idle rows: before %+v after %+v", before, after)
	}
	// Usage's run rows follow the reprice: runs + idle still add up.
	u, err := q.Usage(t.Context(), &trainmeterv1.UsageRequest{By: []string{"model"}})
	if err != nil {
		t.Fatal(err)
	}
	var runsUSD float64
	for _, row := range u.GetRows() {
		if !row.GetIdle() {
			runsUSD += row.GetCostUsd()
		}
	}
	if want := after.totalR + after.totalF; !sameMoney(runsUSD, want) {
		t.Errorf("usage run rows $%v, want the runs' total $%v", runsUSD, want)
	}
}

// TestLiveRunCrossingAPriceChange: a run's windows before a new price list
// are booked at the old price, those after at the new one.
func TestLiveRunCrossingAPriceChange(t *testing.T) {
	srv := start(t, server.Config{})
	conn := tu.Dial(t, srv.Addr().String())
	prices := trainmeterv1.NewPriceServiceClient(conn)
	set := func(perGPU float64) {
		t.Helper()
		if _, err := prices.ImportPrices(t.Context(), &trainmeterv1.ImportPricesRequest{Offers: []*trainmeterv1.PriceOffer{
			{GpuName: "H100 SXM", NumGpus: 1, UsdPerHour: perGPU},
		}}); err != nil {
			t.Fatal(err)
		}
	}
	set(3.6)
	a := tu.ConnectHello(t, conn, &trainmeterv1.Hello{Node: "node-1", BootId: "boot", Gpus: []*trainmeterv1.GpuInfo{{Index: 0, Name: lockGPU}, {Index: 1, Name: lockGPU}}})
	a.MustAck(lockBatch(1, 0, "r", lockStart("r", 0, lockGPU)))
	a.MustAck(lockBatch(2, 1, "r"))
	set(0.36)
	a.MustAck(lockBatch(3, 2, "r"))
	q := trainmeterv1.NewQueryServiceClient(conn)
	r := getRun(t, q, "r")
	if want := 2.0/3600*3.6 + 1.0/3600*0.36; r.GetEnded() || !sameMoney(r.GetCostUsd(), want) || r.GetPriceSource() != "catalog" {
		t.Errorf("live run across a price change: cost $%v from %q, want $%v (2 s at $3.60, 1 s at $0.36) from the catalog", r.GetCostUsd(), r.GetPriceSource(), want)
	}
	// Its usage rows agree, and so do the idle ones.
	u, err := q.Usage(t.Context(), &trainmeterv1.UsageRequest{By: []string{"node"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range u.GetRows() {
		want := 2.0/3600*3.6 + 1.0/3600*0.36
		if !sameMoney(row.GetCostUsd(), want) {
			t.Errorf("usage row %v (idle %v): $%v, want $%v", row.GetKeys(), row.GetIdle(), row.GetCostUsd(), want)
		}
	}
}

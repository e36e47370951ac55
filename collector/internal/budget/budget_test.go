package budget

import (
	"context"
	"io"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.GoleakOptions()...)
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func openStore(t *testing.T, dir string) *store.Store {
	t.Helper()
	st, err := store.Open(dir, store.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// $3600 per GPU-hour: each 1-GPU, 1-second test window costs exactly $1.
var pricing = aggregate.Pricing{GPUPricePerHour: 3600}

func report(s *aggregate.State) *trainmeterv1.RunReport { return s.Report(pricing) }

// collected records the alerts it is told of.
type collected struct {
	mu     sync.Mutex
	alerts []alert.Alert
}

func (c *collected) Alert(_ context.Context, a alert.Alert) {
	c.mu.Lock()
	c.alerts = append(c.alerts, a)
	c.mu.Unlock()
}

func (c *collected) keys() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, a := range c.alerts {
		k := "actual"
		if a.Projected {
			k = "projected"
		}
		out = append(out, a.Scope+"/"+k+"/"+ftoa(a.Threshold))
	}
	sort.Strings(out)
	return out
}

func ftoa(f float64) string { return map[float64]string{0.5: "50", 0.75: "75", 0.9: "90", 1: "100"}[f] }

// feed applies seconds [from, to) of 1-GPU windows of run (a $1 window each)
// from node, starting the run (with scope and labels) at second 0.
// Like ingest, it tells the manager (if any) of every applied batch.
type feeder struct {
	t   *testing.T
	st  *store.Store
	m   *Manager
	seq uint64
	// planned is the planned_steps of the runs it starts (one step a
	// window); 0: none.
	planned uint64
	// keys are the plan keys the runs' starts present (run id → key).
	keys map[string]string
}

func (f *feeder) run(node, run, model, scope string, labels map[string]string, from, to int, end bool) {
	f.t.Helper()
	for s := from; s < to; s++ {
		f.seq++
		var evs []*trainmeterv1.RunEvent
		if s == 0 {
			ev := tu.Start(run, 0, model)
			ev.GetRunStart().BudgetScope = scope
			ev.GetRunStart().Labels = labels
			ev.GetRunStart().PlannedSteps = f.planned
			ev.GetRunStart().PlanKey = f.keys[run]
			evs = append(evs, ev)
		}
		if end && s == to-1 {
			evs = append(evs, tu.End(run, float64(s+1)))
		}
		b := tu.Batch(f.seq, float64(s), []*trainmeterv1.RunWindow{tu.Window(run, float64(s), 100, 50)}, evs...)
		if _, err := f.st.ApplyBatch(node, "boot", b); err != nil {
			f.t.Fatal(err)
		}
		if f.m != nil {
			f.m.OnApplied(node, b)
		}
	}
}

func TestMatches(t *testing.T) {
	r := &trainmeterv1.RunReport{BudgetScope: "llama-3-8b", Metadata: &trainmeterv1.RunMetadata{Model: "llama-3-8b-instruct"},
		Labels: map[string]string{"team": "nlp", "project": "x=y"}}
	for scope, want := range map[string]bool{
		"llama-3-8b": true, "Llama-3-8b": false, "llama": false, "*": true,
		"model:llama-3-8b-instruct": true, "model:llama-3-8b": false,
		"team:nlp": true, "team:vision": false, "label:team=nlp": true, "label:project=x=y": true, "label:project=x": false,
		"label:missing=": false,
	} {
		if got := Matches(scope, r); got != want {
			t.Errorf("Matches(%q) = %v, want %v", scope, got, want)
		}
	}
	for _, bad := range []Budget{{Scope: "", LimitUSD: 1}, {Scope: "a", LimitUSD: 0}, {Scope: "a", LimitUSD: math.Inf(1)},
		{Scope: "a", LimitUSD: 1, Period: "week"}, {Scope: "a", LimitUSD: 1, Policy: "kill"}, {Scope: "label:noequals", LimitUSD: 1},
		{Scope: "model:", LimitUSD: 1}, {Scope: "a", LimitUSD: math.NaN()}} {
		if err := bad.Normalize(); err == nil {
			t.Errorf("budget %+v accepted", bad)
		}
	}
}

func TestPeriodKey(t *testing.T) {
	// 23:30 UTC on 31 Oct is already November in Tokyo.
	at := time.Date(2026, 10, 31, 23, 30, 0, 0, time.UTC)
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Skip("no tzdata")
	}
	if k := PeriodKey(PeriodMonth, at, time.UTC); k != "2026-10" {
		t.Errorf("UTC month %s", k)
	}
	if k := PeriodKey(PeriodMonth, at, tokyo); k != "2026-11" {
		t.Errorf("Tokyo month %s", k)
	}
	if k := PeriodKey(PeriodTotal, at, tokyo); k != "total" {
		t.Errorf("total %s", k)
	}
}

// TestAlertsFireOnceAcrossRestarts: each threshold fires once per kind as
// spend grows, never again on later evaluations nor after the store is
// reopened by a new manager; setting the budget again re-arms them.
func TestAlertsFireOnceAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	clk := clock.NewFake(tu.Now())
	sink := &collected{}
	m := New(Config{Clock: clk}, st, report, nil, sink, quiet())
	if _, err := m.Set(Budget{Scope: "proj", LimitUSD: 10}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Set(Budget{Scope: "team:nlp", LimitUSD: 100}); err != nil {
		t.Fatal(err)
	}
	f := &feeder{t: t, st: st, m: m}
	ctx := context.Background()
	eval := func() {
		t.Helper()
		if err := m.Evaluate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	f.run("n1", "r1", "m", "proj", map[string]string{"team": "nlp"}, 0, 4, false) // $4 = 40 %
	eval()
	if k := sink.keys(); len(k) != 0 {
		t.Fatalf("alerts at 40 %%: %v", k)
	}
	f.run("n1", "r1", "m", "proj", nil, 4, 6, false) // 60 %
	eval()
	f.run("n1", "r1", "m", "proj", nil, 6, 10, false) // 100 %: 75, 90 and 100 at once
	eval()
	eval()
	want := []string{"proj/actual/100", "proj/actual/50", "proj/actual/75", "proj/actual/90",
		"proj/projected/100", "proj/projected/50", "proj/projected/75", "proj/projected/90"}
	if got := sink.keys(); !slices.Equal(got, want) {
		t.Fatalf("alerts %v, want %v", got, want)
	}
	sts, err := m.Statuses()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sts {
		if s.Scope == "proj" && (s.SpentUSD != 10 || s.Ratio() != 1 || s.Runs != 1 || s.Live != 1) {
			t.Errorf("status %+v", s)
		}
		if s.Scope == "team:nlp" && s.SpentUSD != 10 {
			t.Errorf("team:nlp matched by the run's label: spent %v", s.SpentUSD)
		}
	}
	if u := m.BudgetUse(); len(u) != 2 {
		t.Errorf("budget use %+v", u)
	}
	st.Close()

	st = openStore(t, dir)
	defer st.Close()
	sink2 := &collected{}
	m = New(Config{Clock: clk}, st, report, nil, sink2, quiet())
	eval()
	f.st, f.m = st, m
	f.run("n1", "r1", "m", "proj", nil, 10, 12, true) // 120 %, ended
	eval()
	if k := sink2.keys(); len(k) != 0 {
		t.Errorf("alerts fired again after a restart: %v", k)
	}
	listed, err := m.Recorder().List(alert.KindBudget)
	if err != nil || len(listed) != 8 {
		t.Errorf("stored alerts %d (%v), want 8", len(listed), err)
	}
	// The API's alerts (alerts --json) name the runs, as webhooks' do.
	resp, err := NewService(m).ListAlerts(ctx, &trainmeterv1.ListAlertsRequest{Kind: alert.KindBudget})
	if err != nil || len(resp.GetAlerts()) != 8 {
		t.Fatalf("ListAlerts: %v %v", resp, err)
	}
	for _, a := range resp.GetAlerts() {
		if !slices.Equal(a.GetRunIds(), []string{"r1"}) {
			t.Errorf("listed alert %v: run_ids %v, want [r1]", a.GetMessage(), a.GetRunIds())
		}
	}
	// A new amount is a new budget: $20, spent $12 = 60 %.
	if _, err := m.Set(Budget{Scope: "proj", LimitUSD: 20}); err != nil {
		t.Fatal(err)
	}
	eval()
	if k := sink2.keys(); len(k) != 2 || k[0] != "proj/actual/50" || k[1] != "proj/projected/50" {
		t.Errorf("after raising the budget: %v", k)
	}
	if err := m.Delete("proj", ""); err != nil {
		t.Fatal(err)
	}
	if err := m.Delete("proj", ""); err == nil {
		t.Error("deleting a missing budget succeeded")
	}
}

// TestProjectedAlertsAreNotActual: a live run planned for 12 steps that
// has spent 4 ($4 of $10: 40 %) is projected at $12 (120 %): the projected
// alerts fire, every one of them, and no actual one. At 60 % actual spend
// the actual 50 % alert fires, with the spend, not the projection.
func TestProjectedAlertsAreNotActual(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	sink := &collected{}
	m := New(Config{Clock: clock.NewFake(tu.Now())}, st, report, nil, sink, quiet())
	if _, err := m.Set(Budget{Scope: "proj", LimitUSD: 10}); err != nil {
		t.Fatal(err)
	}
	f := &feeder{t: t, st: st, m: m, planned: 12}
	f.run("n1", "r1", "m", "proj", nil, 0, 4, false)
	if err := m.Evaluate(context.Background()); err != nil {
		t.Fatal(err)
	}
	sts, err := m.Statuses()
	if err != nil || len(sts) != 1 || sts[0].SpentUSD != 4 || math.Abs(sts[0].ProjectedUSD-12) > 1e-9 {
		t.Fatalf("setup: status %+v (%v), want $4 spent and $12 projected", sts, err)
	}
	want := []string{"proj/projected/100", "proj/projected/50", "proj/projected/75", "proj/projected/90"}
	if got := sink.keys(); !slices.Equal(got, want) {
		t.Fatalf("alerts at 40 %% spent, 120 %% projected: %v, want %v", got, want)
	}
	for _, a := range sink.alerts {
		if math.Abs(a.SpentUSD-12) > 1e-9 || !strings.Contains(a.Message, "projected spend at completion $12.00") {
			t.Errorf("projected alert %+v: want the projected $12", a)
		}
	}
	f.run("n1", "r1", "m", "proj", nil, 4, 6, false) // $6: 60 %
	if err := m.Evaluate(context.Background()); err != nil {
		t.Fatal(err)
	}
	want = append(want, "proj/actual/50")
	slices.Sort(want)
	if got := sink.keys(); !slices.Equal(got, want) {
		t.Fatalf("alerts at 60 %% spent: %v, want %v", got, want)
	}
	if a := sink.alerts[len(sink.alerts)-1]; a.Projected || a.SpentUSD != 6 || a.Threshold != 0.5 || !strings.Contains(a.Message, "spent $6.00 of $10.00 (60%)") {
		t.Errorf("actual alert %+v", a)
	}
}

// TestMonthlyBudgets: a run counts in the month it started; each month
// fires its own alerts.
func TestMonthlyBudgets(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	clk := clock.NewFake(tu.Now())
	sink := &collected{}
	m := New(Config{Clock: clk}, st, report, nil, sink, quiet())
	if _, err := m.Set(Budget{Scope: "model:m", LimitUSD: 4, Period: PeriodMonth}); err != nil {
		t.Fatal(err)
	}
	f := &feeder{t: t, st: st, m: m}
	f.run("n1", "march", "m", "", nil, 0, 3, true) // $3 in 2025-03: 75 %
	if err := m.Evaluate(context.Background()); err != nil {
		t.Fatal(err)
	}
	var months []string
	for _, a := range sink.alerts {
		months = append(months, a.PeriodKey)
	}
	if len(sink.alerts) != 4 || months[0] != "2025-03" {
		t.Errorf("alerts %v in %v", sink.keys(), months)
	}
	clk.Advance(31 * 24 * time.Hour) // April: the March run does not count
	sts, err := m.Statuses()
	if err != nil {
		t.Fatal(err)
	}
	if len(sts) != 1 || sts[0].PeriodKey != "2025-04" || sts[0].SpentUSD != 0 {
		t.Errorf("April status %+v", sts)
	}
}

// TestDeletedRunLeavesBudget: a deleted run stops counting at the next
// full reload of the runs.
func TestDeletedRunLeavesBudget(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	clk := clock.NewFake(tu.Now())
	m := New(Config{Clock: clk}, st, report, nil, nil, quiet())
	if _, err := m.Set(Budget{Scope: "s", LimitUSD: 100}); err != nil {
		t.Fatal(err)
	}
	f := &feeder{t: t, st: st, m: m}
	f.run("n1", "a", "m", "s", nil, 0, 3, true)
	f.run("n1", "b", "m", "s", nil, 0, 4, true)
	spent := func() float64 {
		t.Helper()
		if err := m.Evaluate(context.Background()); err != nil {
			t.Fatal(err)
		}
		sts, err := m.Statuses()
		if err != nil || len(sts) != 1 {
			t.Fatal(sts, err)
		}
		return sts[0].SpentUSD
	}
	if s := spent(); s != 7 {
		t.Fatalf("spent %v, want 7", s)
	}
	if _, err := st.DeleteRun("a"); err != nil {
		t.Fatal(err)
	}
	clk.Advance(FullReload)
	if s := spent(); s != 4 {
		t.Errorf("spent %v after deleting run a, want 4", s)
	}
}

// advisor records the stop advisories; it refuses the first one per node
// (a node not connected) to check that the manager asks again.
type advisor struct {
	mu      sync.Mutex
	refused map[string]bool
	got     []string
}

func (a *advisor) Advise(node string, adv *trainmeterv1.Advisory) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.refused[node] {
		a.refused[node] = true
		return false
	}
	a.got = append(a.got, node+" "+adv.GetRunId()+": "+adv.GetStop().GetReason())
	return true
}

// stops is a copy of the advisories taken so far.
func (a *advisor) stops() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.got...)
}

func TestStopPolicy(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	adv := &advisor{refused: map[string]bool{}}
	m := New(Config{Clock: clock.NewFake(tu.Now())}, st, report, adv, nil, quiet())
	if _, err := m.Set(Budget{Scope: "s", LimitUSD: 5, Policy: PolicyStop}); err != nil {
		t.Fatal(err)
	}
	f := &feeder{t: t, st: st, m: m}
	f.run("n1", "done", "m", "s", nil, 0, 2, true) // ended: never told to stop
	f.run("n2", "live", "m", "s", nil, 0, 2, false)
	for range 3 {
		if err := m.Evaluate(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if len(adv.got) != 0 {
		t.Fatalf("stop under budget: %v", adv.got)
	}
	f.run("n2", "live", "m", "s", nil, 2, 4, false) // $6 of $5
	for range 3 {
		if err := m.Evaluate(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if len(adv.got) != 1 || adv.got[0] != "n2 live: budget s exceeded (120%)" {
		t.Errorf("advisories %v, want one stop for the live run on n2 (after a refused first try)", adv.got)
	}
}

// TestLoopEvaluatesOnTick: the manager's own loop evaluates after a batch
// was applied, on its (fake) clock's tick.
func TestLoopEvaluatesOnTick(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	clk := clock.NewFake(tu.Now())
	sink := &collected{}
	m := New(Config{Clock: clk, EvalInterval: time.Second}, st, report, nil, sink, quiet())
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := m.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	if _, err := m.Set(Budget{Scope: "s", LimitUSD: 2}); err != nil {
		t.Fatal(err)
	}
	f := &feeder{t: t, st: st, m: m}
	f.run("n1", "r", "m", "s", nil, 0, 1, false)
	m.OnApplied("n1", nil)
	clk.Advance(time.Second) // the tick is received: the evaluation ran or is running
	clk.Advance(time.Second) // ... and has finished
	if k := sink.keys(); len(k) != 2 || k[0] != "s/actual/50" {
		t.Errorf("alerts %v", k)
	}
}

func TestForecast(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	m := New(Config{Clock: clock.NewFake(tu.Now())}, st, report, nil, nil, quiet())
	f := &feeder{t: t, st: st, m: m}
	f.run("n1", "a", "m", "", nil, 0, 10, true)
	f.run("n1", "b", "m", "", nil, 0, 12, true)
	f.run("n1", "c", "m", "", nil, 0, 14, true)
	f.run("n1", "other", "x", "", nil, 0, 50, true)
	if _, err := m.Forecast("nope", 3, 0); err == nil {
		t.Error("forecast of a model without runs")
	}
	fc, err := m.Forecast("m", 5, 0)
	if err != nil {
		t.Fatal(err)
	}
	if fc.MeanRunUsd != 12 || math.Abs(fc.StddevRunUsd-2) > 1e-9 || fc.ExpectedUsd != 60 || math.Abs(fc.StddevUsd-2*math.Sqrt(5)) > 1e-9 || fc.BudgetUsd != nil {
		t.Errorf("forecast %+v", fc)
	}
	if _, err := m.Set(Budget{Scope: "model:m", LimitUSD: 100}); err != nil {
		t.Fatal(err)
	}
	fc, err = m.Forecast("m", 5, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Remaining 100 − 36 = 64; P(N(60, 4.47) > 64) = 1 − Φ(0.894) ≈ 0.186.
	if fc.BudgetUsd == nil || fc.GetRemainingUsd() != 64 || math.Abs(fc.GetOverageProbability()-0.1856) > 0.001 {
		t.Errorf("forecast against the budget %+v", fc)
	}
	fc, _ = m.Forecast("m", 5, 1) // the last run only: $14, no spread, 70 > 64
	if fc.MeanRunUsd != 14 || fc.GetOverageProbability() != 1 || len(fc.BasedOn) != 1 {
		t.Errorf("forecast on one run %+v", fc)
	}
}

// TestForecastEnergyPricedRuns: runs priced by energy only (no GPU-hour
// price) have a cost the forecast learns from.
func TestForecastEnergyPricedRuns(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	// Each test window has 50 J: at $72000/kWh it costs $1.
	energyOnly := func(s *aggregate.State) *trainmeterv1.RunReport {
		return s.Report(aggregate.Pricing{EnergyPricePerKWh: 72000})
	}
	m := New(Config{Clock: clock.NewFake(tu.Now())}, st, energyOnly, nil, nil, quiet())
	f := &feeder{t: t, st: st, m: m}
	f.run("n1", "a", "m", "", nil, 0, 10, true)
	f.run("n1", "b", "m", "", nil, 0, 14, true)
	fc, err := m.Forecast("m", 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(fc.BasedOn) != 2 || math.Abs(fc.MeanRunUsd-12) > 1e-6 || math.Abs(fc.ExpectedUsd-24) > 1e-6 {
		t.Errorf("forecast %+v, want the mean $12 of two energy-priced runs", fc)
	}
}

// BenchmarkEvaluate: one evaluation of 5 budgets over 1000 stored runs of
// 10 windows each, 10 of them live (touched by a batch since the last
// evaluation): the work done each second while runs report.
func BenchmarkEvaluate(b *testing.B) {
	st, err := store.Open(b.TempDir(), store.Options{Logger: quiet()})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	seq := uint64(0)
	for r := range 1000 {
		run := "run-" + strconv.Itoa(r)
		for s := range 10 {
			seq++
			var evs []*trainmeterv1.RunEvent
			if s == 0 {
				ev := tu.Start(run, 0, "m"+strconv.Itoa(r%5))
				ev.GetRunStart().BudgetScope = "scope-" + strconv.Itoa(r%5)
				evs = append(evs, ev)
			}
			if _, err := st.ApplyBatch("n", "b", tu.Batch(seq, float64(s), []*trainmeterv1.RunWindow{tu.Window(run, float64(s), 1, 1)}, evs...)); err != nil {
				b.Fatal(err)
			}
		}
	}
	m := New(Config{Clock: clock.NewFake(tu.Now())}, st, report, nil, nil, quiet())
	for i := range 5 {
		if _, err := m.Set(Budget{Scope: "scope-" + strconv.Itoa(i), LimitUSD: 1e9}); err != nil {
			b.Fatal(err)
		}
	}
	if err := m.Evaluate(context.Background()); err != nil { // the first reads every run
		b.Fatal(err)
	}
	for b.Loop() {
		for r := range 10 {
			m.OnApplied("n", &trainmeterv1.Batch{RunWindows: []*trainmeterv1.RunWindow{{RunId: "run-" + strconv.Itoa(r)}}})
		}
		if err := m.Evaluate(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

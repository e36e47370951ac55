package budget

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// TestMaxCostStopsAndAlerts: a run capped at $3 ($1 a window) is told to
// stop once it cost $3, on every node it runs on (asked again where the
// first try was refused), with one max-cost alert; an uncapped run and an
// ended capped run are left alone.
func TestMaxCostStopsAndAlerts(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	adv := &advisor{refused: map[string]bool{}}
	sink := &collected{}
	m := New(Config{Clock: clock.NewFake(tu.Now())}, st, report, adv, sink, quiet())
	f := &feeder{t: t, st: st, m: m, keys: map[string]string{}}
	for _, id := range []string{"capped", "ended"} {
		key, _, _, err := m.PlanRun(id, "", 3, nil)
		if err != nil {
			t.Fatal(err)
		}
		f.keys[id] = key
	}
	f.run("n1", "capped", "m", "", nil, 0, 2, false)
	f.run("n1", "free", "m", "", nil, 0, 9, false)
	f.run("n1", "ended", "m", "", nil, 0, 5, true)
	eval := func() {
		t.Helper()
		for range 2 {
			if err := m.Evaluate(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	eval()
	if len(adv.got) != 0 || len(sink.alerts) != 0 {
		t.Fatalf("under the cap: advisories %v, alerts %v", adv.got, sink.alerts)
	}
	f.run("n1", "capped", "m", "", nil, 2, 3, false) // $3 of $3
	eval()
	if len(adv.got) != 1 || !strings.HasPrefix(adv.got[0], "n1 capped: max-cost $3.00 reached") {
		t.Fatalf("advisories %v, want one max-cost stop for capped on n1", adv.got)
	}
	if len(sink.alerts) != 1 || sink.alerts[0].Kind != KindMaxCost || sink.alerts[0].SpentUSD != 3 || sink.alerts[0].BudgetUSD != 3 {
		t.Fatalf("alerts %+v, want one max-cost alert at $3 of $3", sink.alerts)
	}
	// A second node joining the run is told too; the alert stays one.
	f.seq++
	join := tu.Start("capped", 3, "m") // a node sends only for runs it started
	join.GetRunStart().PlanKey = f.keys["capped"]
	b := tu.Batch(f.seq, 3, []*trainmeterv1.RunWindow{tu.Window("capped", 3, 100, 50)}, join)
	if _, err := st.ApplyBatch("n2", "boot", b); err != nil {
		t.Fatal(err)
	}
	m.OnApplied("n2", b)
	eval()
	if len(adv.got) != 2 || !strings.HasPrefix(adv.got[1], "n2 capped: max-cost") || len(sink.alerts) != 1 {
		t.Errorf("after n2 joined: advisories %v, %d alerts", adv.got, len(sink.alerts))
	}
	listed, err := m.Recorder().List(KindMaxCost)
	if err != nil || len(listed) != 1 || listed[0].Scope != "run:capped" {
		t.Errorf("stored max-cost alerts %+v, %v", listed, err)
	}
}

// TestMaxCostCheckedOnEveryBatch: the manager's own loop tells a capped run
// to stop as soon as the batch that takes it to its cap is applied, without
// waiting for its evaluation tick (the clock never moves here).
func TestMaxCostCheckedOnEveryBatch(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	adv := &advisor{refused: map[string]bool{"n1": true}} // n1 takes the first advisory
	m := New(Config{Clock: clock.NewFake(tu.Now()), EvalInterval: time.Hour}, st, report, adv, nil, quiet())
	key, _, _, err := m.PlanRun("capped", "", 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := m.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	f := &feeder{t: t, st: st, m: m, keys: map[string]string{"capped": key}}
	f.run("n1", "capped", "m", "", nil, 0, 2, false) // $2 of $3
	time.Sleep(50 * time.Millisecond)
	if got := adv.stops(); len(got) != 0 {
		t.Fatalf("under the cap: advisories %v", got)
	}
	f.run("n1", "capped", "m", "", nil, 2, 3, false) // $3 of $3
	deadline := time.Now().Add(5 * time.Second)
	for len(adv.stops()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := adv.stops(); len(got) != 1 || !strings.HasPrefix(got[0], "n1 capped: max-cost $3.00 reached") {
		t.Fatalf("advisories %v, want a max-cost stop right after the batch that reached the cap", got)
	}
}

func TestPlanRunRefusesBadInput(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	m := New(Config{Clock: clock.NewFake(tu.Now())}, st, report, nil, nil, quiet())
	for _, tc := range []struct {
		id, key string
		cap     float64
		want    string
	}{{"", "", 1, "run id"}, {"r", "", -1, "max cost"}, {"r", "", 0, "nothing to plan"},
		{"r", "short", 1, "plan key: want 16 to 128 bytes"}, {"r", "0123456789abcdef\n", 1, "plan key"},
		{"r", strings.Repeat("k", 129), 1, "plan key"}} {
		if _, _, _, err := m.PlanRun(tc.id, tc.key, tc.cap, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("PlanRun(%q, %q, %v): %v, want an error about %s", tc.id, tc.key, tc.cap, err, tc.want)
		}
	}
	// A running run cannot be capped after the fact (PlanRun needs only the
	// read token).
	f := &feeder{t: t, st: st, m: m}
	f.run("n1", "running", "m", "", nil, 0, 1, false)
	if _, _, _, err := m.PlanRun("running", "", 1, nil); !errors.Is(err, ErrRunStarted) {
		t.Errorf("PlanRun of a started run: %v, want ErrRunStarted", err)
	}
	if _, ok, _ := m.Plan("running"); ok {
		t.Error("a plan was stored for a started run")
	}
}

// TestPlanKeepsEstimate: the estimate made at PlanRun is attached to the
// run's report, next to its cost; an estimate that cannot be made keeps
// its reason and the cap still holds.
func TestPlanKeepsEstimate(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	m := New(Config{Clock: clock.NewFake(tu.Now())}, st, report, nil, nil, quiet())
	m.SetPricing(pricing)
	f := &feeder{t: t, st: st, m: m}
	f.run("n1", "past", "m", "", nil, 0, 10, true) // 100 tok/s on 1 GPU, 50 J/tok... $1/s
	key, e, estErr, err := m.PlanRun("next", "", 50, &cost.EstimateRequest{Model: "m", Tokens: 2000})
	if err != nil || estErr != "" || e == nil {
		t.Fatalf("PlanRun: %v %q %v", e, estErr, err)
	}
	// 2000 tokens at 100 tokens per GPU-second: 20 GPU-seconds, $20.
	if got := e.GetCostUsd().GetMid(); got < 19.999 || got > 20.001 || e.GetWallS().GetMid() != 20 {
		t.Errorf("estimate cost %v wall %v, want $20 and 20 s", got, e.GetWallS().GetMid())
	}
	f.keys = map[string]string{"next": key}
	f.run("n1", "next", "m", "", nil, 0, 4, false)
	if err := m.Evaluate(context.Background()); err != nil {
		t.Fatal(err)
	}
	states, err := st.ListRuns([]string{"next"})
	if err != nil {
		t.Fatal(err)
	}
	r := states[0].Report(aggregate.Pricing(pricing))
	m.AttachPlan(r)
	if r.GetEstimate().GetCostUsd().GetMid() != e.GetCostUsd().GetMid() || r.GetMaxCostUsd() != 50 || r.GetTotalCostUsd() != 4 {
		t.Errorf("report estimate %v max %v total %v", r.GetEstimate(), r.GetMaxCostUsd(), r.GetTotalCostUsd())
	}
	if key, _, estErr, err = m.PlanRun("other", "", 5, &cost.EstimateRequest{Model: "unknown", Tokens: 10}); err != nil || !strings.Contains(estErr, "no ended runs") {
		t.Errorf("estimate of a model without runs: %q %v", estErr, err)
	}
	f.keys["other"] = key
	f.run("n1", "other", "m", "", nil, 0, 1, false)
	if err := m.Evaluate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p, ok, _ := m.Plan("other"); !ok || p.MaxCostUSD != 5 {
		t.Errorf("plan of other %+v %v: the cap must hold without an estimate", p, ok)
	}
}

// TestPlanOfAnotherNotApplied: a plan made for a run id by someone who does
// not start that run (PlanRun needs only the read token, and run ids are
// predictable) caps nothing: the run's start does not present its key.
func TestPlanOfAnotherNotApplied(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	adv := &advisor{refused: map[string]bool{}}
	sink := &collected{}
	m := New(Config{Clock: clock.NewFake(tu.Now())}, st, report, adv, sink, quiet())
	if _, _, _, err := m.PlanRun("victim", "", 0.5, nil); err != nil {
		t.Fatal(err)
	}
	f := &feeder{t: t, st: st, m: m, keys: map[string]string{}}
	f.run("n1", "victim", "m", "", nil, 0, 5, false) // $5, its start presents no key
	for range 2 {
		if err := m.Evaluate(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if len(adv.got) != 0 || len(sink.alerts) != 0 {
		t.Fatalf("a plan the run's start did not present: advisories %v, alerts %+v", adv.got, sink.alerts)
	}
	r := &trainmeterv1.RunReport{RunId: "victim"}
	m.AttachPlan(r)
	if r.MaxCostUsd != nil {
		t.Fatalf("the victim's report shows a max cost of %v", *r.MaxCostUsd)
	}
}

// TestOwnPlanWinsOverAnother: when someone else planned the run id too
// (a lower cap), the run's start presents its own key and gets its own
// plan; a start presenting a key of no plan of its run gets none.
func TestOwnPlanWinsOverAnother(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	adv := &advisor{refused: map[string]bool{}}
	m := New(Config{Clock: clock.NewFake(tu.Now())}, st, report, adv, nil, quiet())
	if _, _, _, err := m.PlanRun("job", "", 0.5, nil); err != nil { // another's
		t.Fatal(err)
	}
	// The client's own key (trainmeter run sends the same to both
	// collectors of a pair).
	own, _, _, err := m.PlanRun("job", "0123456789abcdef-own", 100, nil)
	if err != nil || own != "0123456789abcdef-own" {
		t.Fatalf("PlanRun with the client's key: %q, %v", own, err)
	}
	other, _, _, err := m.PlanRun("job-2", "", 0.5, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &feeder{t: t, st: st, m: m, keys: map[string]string{"job": own, "wrong": other}}
	f.run("n1", "job", "m", "", nil, 0, 5, false)
	f.run("n1", "wrong", "m", "", nil, 0, 5, false) // job-2's key on another run
	for range 2 {
		if err := m.Evaluate(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if len(adv.got) != 0 {
		t.Fatalf("advisories %v, want none: job's own cap is $100", adv.got)
	}
	if p, ok, _ := m.Plan("job"); !ok || p.MaxCostUSD != 100 {
		t.Errorf("job's plan %+v %v, want its own $100", p, ok)
	}
	if _, ok, _ := m.Plan("wrong"); ok {
		t.Errorf("a run presenting another run's key got a plan")
	}
}

// planReads counts the reads of run plans (storage.Store's GetRecord of
// NSRunPlans).
type planReads struct {
	storage.Store
	n atomic.Int64
}

func (p *planReads) GetRecord(ns, k string) ([]byte, error) {
	if ns == NSRunPlans {
		p.n.Add(1)
	}
	return p.Store.GetRecord(ns, k)
}

// TestCapCheckReadsOnlyPlannedRuns: once a full check listed the plans,
// the check of each batch's runs reads no plan for a run without one; a
// plan this collector binds is checked on the batch that reaches its cap;
// a plan another collector on the same store bound is checked by the next
// full check.
func TestCapCheckReadsOnlyPlannedRuns(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	reads := &planReads{Store: st}
	adv := &advisor{refused: map[string]bool{"n1": true, "n2": true}} // each takes the first advisory
	m := New(Config{Clock: clock.NewFake(tu.Now())}, reads, report, adv, nil, quiet())
	f := &feeder{t: t, st: st, m: m, keys: map[string]string{}}
	capsOf := func() {
		t.Helper()
		m.evalMu.Lock()
		defer m.evalMu.Unlock()
		if err := m.evaluateCapsOf(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Evaluate(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := reads.n.Load()
	f.run("n1", "free", "m", "", nil, 0, 5, false)
	capsOf()
	if n := reads.n.Load() - before; n != 0 {
		t.Errorf("%d plan reads for a run without a plan, want 0", n)
	}
	// Planned and started here: bound and checked on the batch.
	key, _, _, err := m.PlanRun("mine", "", 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.keys["mine"] = key
	f.run("n1", "mine", "m", "", nil, 0, 3, false) // $3 of $3
	capsOf()
	if got := adv.stops(); len(got) != 1 || !strings.HasPrefix(got[0], "n1 mine: max-cost $3.00 reached") {
		t.Fatalf("advisories %v, want the stop of mine", got)
	}
	// Bound by another collector: the next full check stops it.
	v, err := json.Marshal(RunPlan{RunID: "theirs", MaxCostUSD: 2, Created: tu.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PutRecord(NSRunPlans, "theirs", v); err != nil {
		t.Fatal(err)
	}
	f.run("n2", "theirs", "m", "", nil, 0, 2, false) // $2 of $2
	capsOf()
	if err := m.Evaluate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := adv.stops(); len(got) != 2 || !strings.HasPrefix(got[1], "n2 theirs: max-cost $2.00 reached") {
		t.Fatalf("advisories %v, want the stop of theirs after the full check", got)
	}
}

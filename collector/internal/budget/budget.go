// Package budget keeps budgets per scope, evaluates the spend of the runs
// they cover, fires alerts at 50/75/90/100 % once per budget, period,
// threshold and kind (actual or projected spend), delivers them (store,
// webhooks, any AlertSink), and sends stop advisories to the runs of an
// exceeded budget whose policy is "stop". docs/budgets.md.
package budget

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/internal/money"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

	"github.com/trainmeter/trainmeter/internal/lifecycle"
)

// NSBudgets is the store namespace of budgets: key "PERIOD/SCOPE".
const NSBudgets = "budgets"

// Periods and policies.
const (
	PeriodTotal = "total"
	PeriodMonth = "month"
	PolicyAlert = ""
	PolicyStop  = "stop"
)

// Thresholds are the shares of a budget that alert, with their severity.
var Thresholds = []struct {
	Ratio    float64
	Severity string
}{{0.5, alert.SeverityInfo}, {0.75, alert.SeverityWarning}, {0.9, alert.SeverityCritical}, {1, alert.SeverityExceeded}}

// MaxAlertRunIDs bounds an alert's run ids (a "*" budget covers thousands).
const MaxAlertRunIDs = 50

// Budget is a spending limit for the runs a scope matches.
type Budget struct {
	// ID changes whenever the budget is set again: a new amount gets its own alerts.
	ID       string    `json:"id"`
	Scope    string    `json:"scope"`
	Period   string    `json:"period"`
	LimitUSD float64   `json:"limit_usd"`
	Policy   string    `json:"policy,omitempty"`
	Created  time.Time `json:"created"`
}

// MaxScopeLen bounds a scope's length (as budget_scope in run_start).
const MaxScopeLen = 1024

// Normalize fills defaults and checks the budget.
func (b *Budget) Normalize() error {
	b.Scope = strings.TrimSpace(b.Scope)
	b.Period = cmp.Or(b.Period, PeriodTotal)
	if b.Policy == "alert" {
		b.Policy = PolicyAlert
	}
	var errs []error
	switch {
	case b.Scope == "":
		errs = append(errs, errors.New("budget scope is empty"))
	case len(b.Scope) > MaxScopeLen || strings.ContainsRune(b.Scope, 0):
		errs = append(errs, fmt.Errorf("budget scope: at most %d bytes, no NUL", MaxScopeLen))
	default:
		errs = append(errs, checkScope(b.Scope))
	}
	if b.Period != PeriodTotal && b.Period != PeriodMonth {
		errs = append(errs, fmt.Errorf("budget period %q: want total or month", b.Period))
	}
	if !(b.LimitUSD > 0) || math.IsInf(b.LimitUSD, 0) {
		errs = append(errs, fmt.Errorf("budget amount must be a finite number of USD > 0, got %v", b.LimitUSD))
	}
	if b.Policy != PolicyAlert && b.Policy != PolicyStop {
		errs = append(errs, fmt.Errorf("budget policy %q: want alert or stop", b.Policy))
	}
	return errors.Join(errs...)
}

func checkScope(s string) error {
	if v, ok := strings.CutPrefix(s, "label:"); ok {
		if k, _, ok := strings.Cut(v, "="); !ok || k == "" {
			return fmt.Errorf("budget scope %q: want label:KEY=VALUE", s)
		}
	}
	for _, p := range []string{"model:", "team:"} {
		if v, ok := strings.CutPrefix(s, p); ok && v == "" {
			return fmt.Errorf("budget scope %q: want %sNAME", s, p)
		}
	}
	return nil
}

func budgetKey(period, scope string) string { return period + "/" + scope }

// Matches reports whether the scope covers the run: "*" all runs,
// model:NAME the runs of that model, team:X those labelled team=X,
// label:KEY=VALUE those with that label, anything else those whose run_start
// budget_scope is exactly that. Comparisons are case-sensitive.
func Matches(scope string, r *trainmeterv1.RunReport) bool {
	switch {
	case scope == "*":
		return true
	case strings.HasPrefix(scope, "model:"):
		return r.GetMetadata().GetModel() == scope[len("model:"):]
	case strings.HasPrefix(scope, "team:"):
		v, ok := r.GetLabels()["team"]
		return ok && v == scope[len("team:"):]
	case strings.HasPrefix(scope, "label:"):
		k, v, _ := strings.Cut(scope[len("label:"):], "=")
		got, ok := r.GetLabels()[k]
		return ok && got == v
	}
	return r.GetBudgetScope() == scope
}

// PeriodKey is the period a run counts in: "total", or for monthly budgets
// the calendar month (in loc) in which the run started, e.g. "2026-11". A
// run that spans two months counts wholly in the first.
func PeriodKey(period string, start time.Time, loc *time.Location) string {
	if period != PeriodMonth {
		return PeriodTotal
	}
	return start.In(loc).Format("2006-01")
}

// Advisor sends an advisory down to a node's agent (ingest.Server).
type Advisor interface {
	Advise(node string, adv *trainmeterv1.Advisory) bool
}

// Config configures the manager.
type Config struct {
	// EvalInterval is how often budgets are evaluated when runs changed; 0: 1 s.
	EvalInterval time.Duration
	Location     *time.Location // of monthly budgets' calendar months; nil: UTC
	Clock        clock.Clock    // nil: the wall clock
	// Leader, when set, says whether this collector leads a fleet sharing
	// its store (package leader): only the leader fires budget alerts, and
	// it evaluates every FleetReload besides, reading every run, since the
	// batches other collectors apply do not mark it dirty. Every collector
	// evaluates after the batches it applied, for the stop advisories to
	// the agents whose streams it holds. nil: the one collector.
	Leader func() bool
}

// FleetReload is how often a fleet's leader evaluates every run.
const FleetReload = 10 * time.Second

// Validate checks the config.
func (c Config) Validate() error {
	if c.EvalInterval < 0 {
		return fmt.Errorf("budget evaluation interval must be >= 0, got %v", c.EvalInterval)
	}
	return nil
}

// Manager owns the budgets.
type Manager struct {
	cfg    Config
	store  storage.Store
	report func(*aggregate.State) *trainmeterv1.RunReport
	advise Advisor
	rec    *alert.Recorder
	log    *slog.Logger

	dirty chan struct{} // capacity 1: "something changed"

	mu      sync.Mutex
	use     []Use
	stopped map[string]bool // run\x00node already told to stop
	// Runs capped by --max-cost: nodes told to stop (run\x00node), and
	// runs that ended (not read again).
	capStopped, capDone map[string]bool
	// capTouched holds the runs batches touched since their caps were last
	// checked; capNow (capacity 1) wakes the loop to check them.
	capTouched map[string]struct{}
	capNow     chan struct{}
	// planStarts are the run starts with a plan key since plans were last
	// bound (bindPlans).
	planStarts []planStart
	pricing    cost.Config
	changed    map[string]struct{} // runs touched by batches since the last load

	// The runs as last loaded (guarded by evalMu): only the runs batches
	// touched are reloaded, and everything every FullReload (which also
	// catches deleted runs).
	evalMu sync.Mutex
	// evaluations counts the evaluations ended (Evaluations).
	evaluations atomic.Uint64
	cache       map[string]run
	lastFull    time.Time
	// planned holds the runs with a plan as the last full check of the
	// caps listed them (evaluateCaps), with the plans this collector bound
	// since; nil: not listed yet. The check of the runs each batch touched
	// (evaluateCapsOf) reads a plan only for a run in it: a run without a
	// plan, nearly every run, costs no read of the store. A plan another
	// collector on the same database bound is in it from this collector's
	// next full check, which checks every plan's cap itself (at most one
	// EvalInterval after the batch marked the evaluation due).
	planned map[string]bool

	stop chan struct{}
	done chan struct{}
}

// New returns a manager. report turns a run's state into its report (the
// collector's pricing); advise (stop advisories) and sink may be nil.
func New(cfg Config, st storage.Store, report func(*aggregate.State) *trainmeterv1.RunReport, advise Advisor, sink alert.Sink, log *slog.Logger) *Manager {
	cfg.EvalInterval = cmp.Or(cfg.EvalInterval, time.Second)
	cfg.Location = cmp.Or(cfg.Location, time.UTC)
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, clock.Real{})
	log = cmp.Or(log, slog.New(slog.DiscardHandler))
	m := &Manager{cfg: cfg, store: st, report: report, advise: advise, rec: &alert.Recorder{Store: st, Sink: sink}, log: log,
		dirty: make(chan struct{}, 1), stopped: map[string]bool{}, changed: map[string]struct{}{},
		capStopped: map[string]bool{}, capDone: map[string]bool{}, capTouched: map[string]struct{}{}, capNow: make(chan struct{}, 1)}
	m.MarkDirty()
	return m
}

// Recorder returns the alert recorder (shared with price alerts).
func (m *Manager) Recorder() *alert.Recorder { return m.rec }

// MarkDirty asks for an evaluation at the next tick. It never blocks.
func (m *Manager) MarkDirty() {
	select {
	case m.dirty <- struct{}{}:
	default:
	}
}

// OnApplied is the ingest observer: a batch's runs may have spent more.
func (m *Manager) OnApplied(_ string, b *trainmeterv1.Batch) {
	m.mu.Lock()
	for _, w := range b.GetRunWindows() {
		m.changed[w.GetRunId()] = struct{}{}
		m.capTouched[w.GetRunId()] = struct{}{}
	}
	for _, e := range b.GetRunEvents() {
		switch ev := e.GetEvent().(type) {
		case *trainmeterv1.RunEvent_RunStart:
			m.changed[ev.RunStart.GetRunId()] = struct{}{}
			if k := ev.RunStart.GetPlanKey(); k != "" && len(m.planStarts) < maxPlanStarts {
				m.planStarts = append(m.planStarts, planStart{run: ev.RunStart.GetRunId(), key: k})
				m.capTouched[ev.RunStart.GetRunId()] = struct{}{}
			}
		case *trainmeterv1.RunEvent_RunEnd:
			m.changed[ev.RunEnd.GetRunId()] = struct{}{}
		case *trainmeterv1.RunEvent_Eval:
			m.changed[ev.Eval.GetRunId()] = struct{}{}
		}
	}
	for _, l := range b.GetLosses() {
		m.changed[l.GetRunId()] = struct{}{}
	}
	m.mu.Unlock()
	m.MarkDirty()
	select {
	case m.capNow <- struct{}{}:
	default:
	}
}

// FullReload is how often evaluation reads every run, not only those touched.
const FullReload = 5 * time.Minute

// Start evaluates on a ticker until Shutdown, and checks the --max-cost
// caps of the runs in each applied batch as soon as it is applied.
func (m *Manager) Start(context.Context) error {
	stop, done := make(chan struct{}), make(chan struct{})
	m.stop, m.done = stop, done
	t := m.cfg.Clock.NewTicker(m.cfg.EvalInterval)
	go func() {
		defer close(done)
		defer t.Stop()
		var fleetAt time.Time // the leader's last evaluation of every run
		for {
			select {
			case <-stop:
				return
			case <-m.capNow:
				m.evalMu.Lock()
				err := m.evaluateCapsOf(context.Background())
				m.evalMu.Unlock()
				if err != nil {
					m.log.Warn("max-cost check failed", "err", err)
				}
			case <-t.C():
				due := false
				if now := m.cfg.Clock.Now(); m.leads() && m.cfg.Leader != nil && !now.Before(fleetAt.Add(FleetReload)) {
					fleetAt, due = now, true
					m.evalMu.Lock()
					m.cache = nil // read every run
					m.evalMu.Unlock()
				}
				select {
				case <-m.dirty:
					due = true
				default:
				}
				if !due {
					continue
				}
				if err := m.Evaluate(context.Background()); err != nil {
					m.log.Warn("budget evaluation failed", "err", err)
					m.MarkDirty()
				}
			}
		}
	}()
	return nil
}

// Shutdown stops the evaluation loop, waiting for one in progress until ctx ends.
func (m *Manager) Shutdown(ctx context.Context) error {
	if m.stop == nil {
		return nil
	}
	close(m.stop)
	m.stop = nil
	return lifecycle.Wait(ctx, m.done, "budget evaluation")
}

// Set creates or replaces the budget of (scope, period), keeping b.ID when
// set (a pair's collectors get the same id from the CLI), else picking one.
func (m *Manager) Set(b Budget) (Budget, error) {
	if err := b.Normalize(); err != nil {
		return Budget{}, err
	}
	if b.ID == "" {
		b.ID = NewBudgetID()
	} else if !validBudgetID(b.ID) {
		return Budget{}, fmt.Errorf("budget id %q: want 16 lowercase hex digits", b.ID)
	}
	b.Created = m.cfg.Clock.Now().UTC()
	v, err := json.Marshal(b)
	if err != nil {
		return Budget{}, err
	}
	if err := m.store.PutRecord(NSBudgets, budgetKey(b.Period, b.Scope), v); err != nil {
		return Budget{}, err
	}
	m.MarkDirty()
	return b, nil
}

// ErrNoBudget: no budget for that scope and period.
var ErrNoBudget = errors.New("no such budget")

// Delete removes the budget of (scope, period).
func (m *Manager) Delete(scope, period string) error {
	period = cmp.Or(period, PeriodTotal)
	k := budgetKey(period, strings.TrimSpace(scope))
	if _, err := m.store.GetRecord(NSBudgets, k); errors.Is(err, storage.ErrNotFound) {
		return fmt.Errorf("%w: %s (%s)", ErrNoBudget, scope, period)
	} else if err != nil {
		return err
	}
	if err := m.store.DeleteRecord(NSBudgets, k); err != nil {
		return err
	}
	m.MarkDirty()
	return nil
}

// Budgets lists the budgets by period then scope.
func (m *Manager) Budgets() ([]Budget, error) { return records[Budget](m.store, NSBudgets) }

// records decodes the records of ns, skipping those that are not a T.
func records[T any](st storage.Records, ns string) ([]T, error) {
	var out []T
	err := st.ScanRecords(ns, "", func(_ string, v []byte) (bool, error) {
		var x T
		if json.Unmarshal(v, &x) == nil {
			out = append(out, x)
		}
		return true, nil
	})
	return out, err
}

// run is what evaluation needs of one run.
type run struct {
	r     *trainmeterv1.RunReport
	nodes []string
	start time.Time
}

// runs returns every run, from the cache refreshed with the runs that changed.
// Call with evalMu held.
func (m *Manager) runs() ([]run, error) {
	now := m.cfg.Clock.Now()
	m.mu.Lock()
	changed := m.changed
	m.changed = map[string]struct{}{}
	m.mu.Unlock()
	full := m.cache == nil || now.Sub(m.lastFull) >= FullReload || now.Before(m.lastFull)
	if !full && len(changed) > 0 {
		delete(changed, "")
		loaded, err := m.load(slices.Collect(maps.Keys(changed)), now)
		if err != nil {
			full = true // a run deleted meanwhile, or a read error: read everything
		}
		for _, x := range loaded {
			m.cache[x.r.GetRunId()] = x
		}
	}
	if full {
		loaded, err := m.load(nil, now)
		if err != nil {
			m.mu.Lock() // try those again next time
			for id := range changed {
				m.changed[id] = struct{}{}
			}
			m.mu.Unlock()
			return nil, err
		}
		m.cache = make(map[string]run, len(loaded))
		for _, x := range loaded {
			m.cache[x.r.GetRunId()] = x
		}
		m.lastFull = now
	}
	return slices.SortedFunc(maps.Values(m.cache), func(a, b run) int { return strings.Compare(a.r.GetRunId(), b.r.GetRunId()) }), nil
}

// load reads runs (all if ids is empty) and reports them.
func (m *Manager) load(ids []string, now time.Time) ([]run, error) {
	states, err := m.store.ListRuns(ids)
	if err != nil {
		return nil, err
	}
	out := make([]run, 0, len(states))
	for _, s := range states {
		r := m.report(s)
		x := run{r: r, start: now, nodes: slices.Sorted(maps.Keys(s.Nodes))}
		if r.GetStart() != nil {
			x.start = r.GetStart().AsTime()
		}
		out = append(out, x)
	}
	return out, nil
}

// Status is a budget's use in one period.
type Status struct {
	Budget
	PeriodKey              string
	SpentUSD, ProjectedUSD float64
	Runs, Live             int
	live                   []run
	runIDs                 []string
}

// Ratio is spent / limit; ProjectedRatio projected / limit.
func (s Status) Ratio() float64          { return s.SpentUSD / s.LimitUSD }
func (s Status) ProjectedRatio() float64 { return s.ProjectedUSD / s.LimitUSD }

// periods is one budget's use in each period of its runs, by period key,
// and in the current period (always present).
type periods struct {
	all []*Status
	cur *Status
}

// statuses computes each budget's periods (out[i] is budgets[i]'s).
func (m *Manager) statuses(budgets []Budget, runs []run) []periods {
	now := m.cfg.Clock.Now()
	out := make([]periods, len(budgets))
	for i, b := range budgets {
		cur := PeriodKey(b.Period, now, m.cfg.Location)
		out[i].cur = &Status{Budget: b, PeriodKey: cur}
		byKey := map[string]*Status{cur: out[i].cur}
		for _, x := range runs {
			if !Matches(b.Scope, x.r) {
				continue
			}
			pk := PeriodKey(b.Period, x.start, m.cfg.Location)
			s := byKey[pk]
			if s == nil {
				s = &Status{Budget: b, PeriodKey: pk}
				byKey[pk] = s
			}
			s.SpentUSD += x.r.GetTotalCostUsd()
			s.ProjectedUSD += max(x.r.GetProjectedCostUsd(), x.r.GetTotalCostUsd())
			s.Runs++
			s.runIDs = append(s.runIDs, x.r.GetRunId())
			if !x.r.GetEnded() {
				s.Live++
				s.live = append(s.live, x)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(byKey)) {
			out[i].all = append(out[i].all, byKey[k])
		}
	}
	return out
}

// Evaluations is how many evaluations (failed ones too) have ended.
func (m *Manager) Evaluations() uint64 { return m.evaluations.Load() }

// Evaluate fires the alerts now due and sends stop advisories; the loop
// calls it when runs or budgets changed.
func (m *Manager) Evaluate(ctx context.Context) error {
	m.evalMu.Lock()
	defer m.evalMu.Unlock()
	defer m.evaluations.Add(1)
	capErr := m.evaluateCaps(ctx)
	budgets, err := m.Budgets()
	if err != nil || len(budgets) == 0 {
		// Nothing to watch: forget the runs (a later budget reads them all).
		m.mu.Lock()
		m.changed = map[string]struct{}{}
		m.mu.Unlock()
		m.cache = nil
		m.setUse(nil)
		return errors.Join(capErr, err)
	}
	runs, err := m.runs()
	if err != nil {
		return err
	}
	st := m.statuses(budgets, runs)
	m.forgetStopped(runs)
	now := m.cfg.Clock.Now().UTC()
	var errs []error
	for i, b := range budgets {
		for _, s := range st[i].all {
			for i, v := range []float64{s.SpentUSD, s.ProjectedUSD} {
				for _, th := range Thresholds {
					if v/b.LimitUSD < th.Ratio {
						break
					}
					errs = append(errs, m.fire(ctx, s, th.Ratio, th.Severity, i == 1, v, now))
				}
			}
			if b.Policy == PolicyStop && s.Ratio() >= 1 {
				m.stopRuns(b, s)
			}
		}
	}
	m.setUse(st)
	return errors.Join(append(errs, capErr)...)
}

// leads says whether this collector fires budget alerts (Config.Leader).
func (m *Manager) leads() bool { return m.cfg.Leader == nil || m.cfg.Leader() }

func (m *Manager) fire(ctx context.Context, s *Status, th float64, sev string, projected bool, v float64, now time.Time) error {
	if !m.leads() {
		return nil
	}
	kind, what := "actual", "spent"
	if projected {
		kind, what = "projected", "projected spend at completion"
	}
	key := fmt.Sprintf("%s/%s/%s/%s/%g", alert.KindBudget, s.ID, s.PeriodKey, kind, th)
	// `trainmeter budget` rounds the same way (internal/money).
	amounts := money.USDs(v, s.LimitUSD)
	a := alert.Alert{
		Kind: alert.KindBudget, Severity: sev, Scope: s.Scope, Period: s.Period, PeriodKey: s.PeriodKey, Threshold: th,
		SpentUSD: v, BudgetUSD: s.LimitUSD, Projected: projected, Time: now, BudgetID: s.ID, RunIDs: s.runIDs[:min(len(s.runIDs), MaxAlertRunIDs)],
		Message: fmt.Sprintf("budget %s (%s): %s %s of %s (%.0f%%) crossed %.0f%% [%s]",
			s.Scope, periodLabel(s.Period, s.PeriodKey), what, amounts[0], amounts[1], 100*v/s.LimitUSD, 100*th, sev),
	}
	fired, err := m.rec.Fire(ctx, key, a)
	if fired {
		m.log.Warn("budget alert", "scope", s.Scope, "period", s.PeriodKey, "threshold", th, "projected", projected, "spent", v, "budget", s.LimitUSD)
	}
	return err
}

func periodLabel(period, key string) string {
	if period == PeriodMonth {
		return "month " + key
	}
	return period
}

// stopRuns tells the agents of the live runs of an exceeded stop budget to stop.
func (m *Manager) stopRuns(b Budget, s *Status) {
	if m.advise == nil {
		return
	}
	reason := fmt.Sprintf("budget %s exceeded (%.0f%%)", b.Scope, 100*s.Ratio())
	for _, x := range s.live {
		m.tellStop(m.stopped, x.r.GetRunId(), x.nodes, reason)
	}
}

// tellStop advises each node of run not marked in told to stop it, and
// marks those that took the advisory; a node that did not (disconnected,
// queue full) is asked again at the next evaluation.
func (m *Manager) tellStop(told map[string]bool, run string, nodes []string, reason string) {
	for _, n := range nodes {
		k := run + "\x00" + n
		m.mu.Lock()
		done := told[k]
		m.mu.Unlock()
		if done || !m.advise.Advise(n, &trainmeterv1.Advisory{RunId: run, Advice: &trainmeterv1.Advisory_Stop{Stop: &trainmeterv1.Stop{Reason: reason}}}) {
			continue
		}
		m.mu.Lock()
		told[k] = true
		m.mu.Unlock()
		m.log.Warn("stop advisory sent", "run", run, "node", n, "reason", reason)
	}
}

// forgetStopped drops the stop marks of runs that ended or are gone.
func (m *Manager) forgetStopped(runs []run) {
	live := map[string]bool{}
	for _, x := range runs {
		if !x.r.GetEnded() {
			live[x.r.GetRunId()] = true
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.stopped {
		id, _, _ := strings.Cut(k, "\x00")
		if !live[id] {
			delete(m.stopped, k)
		}
	}
}

// Use is a budget's use in the current period (trainmeter.budget.use_ratio).
type Use struct {
	Scope, Period    string
	Ratio, Projected float64
}

func (m *Manager) setUse(st []periods) {
	var use []Use
	for _, p := range st {
		use = append(use, Use{Scope: p.cur.Scope, Period: p.cur.Period, Ratio: p.cur.Ratio(), Projected: p.cur.ProjectedRatio()})
	}
	m.mu.Lock()
	m.use = use
	m.mu.Unlock()
}

// BudgetUse returns the use of every budget as of the last evaluation.
func (m *Manager) BudgetUse() []Use {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Use(nil), m.use...)
}

// Statuses returns each budget's use in the current period.
func (m *Manager) Statuses() ([]Status, error) {
	m.evalMu.Lock()
	defer m.evalMu.Unlock()
	budgets, err := m.Budgets()
	if err != nil || len(budgets) == 0 {
		return nil, err
	}
	runs, err := m.runs()
	if err != nil {
		return nil, err
	}
	var out []Status
	for _, p := range m.statuses(budgets, runs) {
		out = append(out, *p.cur)
	}
	return out, nil
}

func (b Budget) Proto() *trainmeterv1.Budget {
	return &trainmeterv1.Budget{Id: b.ID, Scope: b.Scope, Period: b.Period, LimitUsd: b.LimitUSD, Policy: b.Policy, Created: timestamppb.New(b.Created)}
}

// NewBudgetID is a random budget id: 16 lowercase hex digits.
func NewBudgetID() string { return randomHex(8) }

// randomHex is n random bytes in hex (crypto/rand.Read never fails).
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func validBudgetID(id string) bool {
	return len(id) == 16 && strings.Trim(id, "0123456789abcdef") == ""
}

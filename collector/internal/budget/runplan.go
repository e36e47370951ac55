package budget

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/internal/money"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// NSRunPlans is the store namespace of what runs were started with: their
// cost cap and estimate (key: run id). A plan is here only once a start of
// its run presented its key.
const NSRunPlans = "runplans"

// NSPendingPlans holds the plans PlanRun made that no start of their run
// presented yet (key: run id, NUL, the SHA-256 of the plan key, in hex).
// Anyone with the read token may add one for any run id; only the one whose
// key the run's start presents is ever applied.
const NSPendingPlans = "runplans-pending"

// PendingPlanTTL is how long a plan waits for its run's start (trainmeter
// run plans right before it starts the command).
const PendingPlanTTL = 24 * time.Hour

// KindMaxCost is the alert of a run that reached its --max-cost cap.
const KindMaxCost = "max-cost"

// MaxCostReasonPrefix starts a capped run's stop reason ("stopped: max-cost").
const MaxCostReasonPrefix = "max-cost"

// RunPlan is what `trainmeter run` asked for before the run started.
type RunPlan struct {
	RunID         string    `json:"run_id"`
	MaxCostUSD    float64   `json:"max_cost_usd,omitempty"`
	Estimate      []byte    `json:"estimate,omitempty"` // a trainmeterv1.RunEstimate, protobuf
	EstimateError string    `json:"estimate_error,omitempty"`
	Created       time.Time `json:"created"`
	KeyHash       string    `json:"key_hash,omitempty"` // SHA-256 (hex) of the plan key
}

// maxPlanStarts bounds the starts with a plan key waiting for bindPlans.
const maxPlanStarts = 10000

// planStart is a run's start that presented a plan key.
type planStart struct{ run, key string }

func keyHash(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

// MinPlanKeyLen and MaxPlanKeyLen bound a plan key (the collector's own
// are 32 hex digits): short keys could be guessed.
const (
	MinPlanKeyLen = 16
	MaxPlanKeyLen = 128
)

func validPlanKey(k string) bool {
	return len(k) >= MinPlanKeyLen && len(k) <= MaxPlanKeyLen && !strings.ContainsFunc(k, func(r rune) bool { return r <= ' ' || r > '~' })
}

// ErrRunStarted: a plan was asked for a run the collector already has.
var ErrRunStarted = errors.New("run already started")

// MaxRunIDLen bounds a planned run's id (the agent's own bound).
const MaxRunIDLen = 256

// SetPricing gives the manager the collector's pricing, for estimates (runs
// are priced through the report function).
func (m *Manager) SetPricing(p cost.Config) {
	m.mu.Lock()
	m.pricing = p
	m.mu.Unlock()
}

func (m *Manager) pricingNow() cost.Config {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pricing
}

// Estimate estimates a run of a model from its past runs (cost.Estimate).
func (m *Manager) Estimate(req cost.EstimateRequest) (*trainmeterv1.RunEstimate, error) {
	if strings.TrimSpace(req.Model) == "" || req.Tokens == 0 {
		return nil, errors.New("an estimate needs --model and --tokens > 0")
	}
	runs, err := m.load(nil, m.cfg.Clock.Now())
	if err != nil {
		return nil, err
	}
	reports := make([]*trainmeterv1.RunReport, 0, len(runs))
	for _, x := range runs {
		reports = append(reports, x.r)
	}
	est, err := m.pricingNow().Estimate(reports, req)
	if err != nil {
		return nil, err
	}
	est.Made = timestamppb.New(m.cfg.Clock.Now())
	return est, nil
}

// PlanRun keeps a run's cap and, when est is set, the estimate made now,
// under key (the caller's secret; "": a new random one, returned): the plan
// applies only when a start of the run presents that key (RunStart.plan_key),
// so whoever plans a run id they do not start caps nothing. A failed
// estimate does not fail the plan: its error is returned as estErr and kept.
func (m *Manager) PlanRun(runID, key string, maxCostUSD float64, est *cost.EstimateRequest) (_ string, e *trainmeterv1.RunEstimate, estErr string, err error) {
	switch {
	case runID == "" || len(runID) > MaxRunIDLen || strings.ContainsRune(runID, 0):
		return "", nil, "", fmt.Errorf("run id: want 1 to %d bytes, no NUL", MaxRunIDLen)
	case math.IsNaN(maxCostUSD) || math.IsInf(maxCostUSD, 0) || maxCostUSD < 0:
		return "", nil, "", fmt.Errorf("max cost must be a finite number of USD >= 0, got %v", maxCostUSD)
	case maxCostUSD == 0 && est == nil:
		return "", nil, "", errors.New("nothing to plan: give a max cost, an estimate request, or both")
	case key != "" && !validPlanKey(key):
		return "", nil, "", fmt.Errorf("plan key: want %d to %d bytes of printable ASCII (a random secret; empty: the collector makes one)", MinPlanKeyLen, MaxPlanKeyLen)
	}
	// Only a run not started yet: a cap is set by whoever starts the run, and
	// the read token that PlanRun needs must not stop other people's runs.
	if states, err := m.store.ListRuns([]string{runID}); err == nil && len(states) > 0 {
		return "", nil, "", fmt.Errorf("%w: run %q has already started (a cap and an estimate are set before the run starts; use a new run id)", ErrRunStarted, runID)
	}
	key = cmp.Or(key, randomHex(16))
	p := RunPlan{RunID: runID, MaxCostUSD: maxCostUSD, Created: m.cfg.Clock.Now().UTC(), KeyHash: keyHash(key)}
	if est != nil {
		e, err = m.Estimate(*est)
		if err != nil {
			p.EstimateError = err.Error()
		} else if p.Estimate, err = proto.Marshal(e); err != nil {
			return "", nil, "", err
		}
	}
	v, err := json.Marshal(p)
	if err != nil {
		return "", nil, "", err
	}
	if err := m.store.PutRecord(NSPendingPlans, runID+"\x00"+p.KeyHash, v); err != nil {
		return "", nil, "", err
	}
	return key, e, p.EstimateError, nil
}

// bindPlans makes each pending plan whose key a run start presented its
// run's plan, unless the run has one already (its first start's). The
// caller holds evalMu (m.planned).
func (m *Manager) bindPlans() error {
	m.mu.Lock()
	starts := m.planStarts
	m.planStarts = nil
	m.mu.Unlock()
	var errs []error
	for _, ps := range starts {
		if !validPlanKey(ps.key) {
			continue
		}
		pk := ps.run + "\x00" + keyHash(ps.key)
		v, err := m.store.GetRecord(NSPendingPlans, pk)
		if errors.Is(err, storage.ErrNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if _, ok, err := m.Plan(ps.run); err != nil || ok {
			errs = append(errs, err)
			continue
		}
		if err := m.store.PutRecord(NSRunPlans, ps.run, v); err != nil {
			errs = append(errs, err)
			continue
		}
		if m.planned != nil {
			m.planned[ps.run] = true
		}
		errs = append(errs, m.store.DeleteRecord(NSPendingPlans, pk))
		m.mu.Lock()
		delete(m.capDone, ps.run)
		m.capTouched[ps.run] = struct{}{}
		m.mu.Unlock()
		m.MarkDirty()
	}
	return errors.Join(errs...)
}

// sweepPendingPlans deletes the pending plans older than PendingPlanTTL.
func (m *Manager) sweepPendingPlans() error {
	cutoff := m.cfg.Clock.Now().Add(-PendingPlanTTL)
	var old []string
	err := m.store.ScanRecords(NSPendingPlans, "", func(k string, v []byte) (bool, error) {
		var p RunPlan
		if json.Unmarshal(v, &p) != nil || p.Created.Before(cutoff) {
			old = append(old, k)
		}
		return true, nil
	})
	errs := []error{err}
	for _, k := range old {
		errs = append(errs, m.store.DeleteRecord(NSPendingPlans, k))
	}
	return errors.Join(errs...)
}

// Plan returns the plan of a run, if it has one.
func (m *Manager) Plan(runID string) (RunPlan, bool, error) {
	v, err := m.store.GetRecord(NSRunPlans, runID)
	if errors.Is(err, storage.ErrNotFound) {
		return RunPlan{}, false, nil
	}
	if err != nil {
		return RunPlan{}, false, err
	}
	var p RunPlan
	if err := json.Unmarshal(v, &p); err != nil {
		return RunPlan{}, false, fmt.Errorf("run plan %s: %w", runID, err)
	}
	return p, true, nil
}

// AttachPlan sets the report's max_cost_usd and estimate from its run's
// plan (the query service shows them in reports). A plan that cannot be
// read leaves the report as it is.
func (m *Manager) AttachPlan(r *trainmeterv1.RunReport) {
	p, ok, err := m.Plan(r.GetRunId())
	if err != nil || !ok {
		return
	}
	if p.MaxCostUSD > 0 {
		r.MaxCostUsd = &p.MaxCostUSD
	}
	r.EstimateError = p.EstimateError
	if len(p.Estimate) > 0 {
		e := &trainmeterv1.RunEstimate{}
		if proto.Unmarshal(p.Estimate, e) == nil {
			r.Estimate = e
		}
	}
}

// evaluateCaps binds and sweeps the plans and checks every run's cap; it
// lists the runs with a plan anew (m.planned). The caller holds evalMu.
func (m *Manager) evaluateCaps(ctx context.Context) error {
	bindErr := errors.Join(m.bindPlans(), m.sweepPendingPlans())
	plans, err := records[RunPlan](m.store, NSRunPlans)
	if err != nil {
		m.planned = nil
		return err
	}
	m.planned = make(map[string]bool, len(plans))
	errs := []error{bindErr}
	for _, p := range plans {
		m.planned[p.RunID] = true
		errs = append(errs, m.checkCap(ctx, p))
	}
	return errors.Join(errs...)
}

// evaluateCapsOf checks the caps of the runs batches touched since the last
// call, as soon as a batch is applied: a run is told to stop at the first
// batch that takes it to its cap, not at the next evaluation tick.
func (m *Manager) evaluateCapsOf(ctx context.Context) error {
	errs := []error{m.bindPlans()}
	m.mu.Lock()
	runs := m.capTouched
	m.capTouched = map[string]struct{}{}
	m.mu.Unlock()
	for id := range runs {
		if m.planned != nil && !m.planned[id] {
			continue
		}
		p, ok, err := m.Plan(id)
		if ok {
			err = m.checkCap(ctx, p)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkCap fires the max-cost alert of live run p and tells its nodes to
// stop once its total cost reached its cap; an ended run is not read again.
func (m *Manager) checkCap(ctx context.Context, p RunPlan) error {
	m.mu.Lock()
	done := m.capDone[p.RunID]
	m.mu.Unlock()
	if done || p.MaxCostUSD <= 0 {
		return nil
	}
	states, err := m.store.ListRuns([]string{p.RunID})
	if errors.Is(err, storage.ErrNotFound) || len(states) == 0 {
		return nil // not started yet
	}
	if err != nil {
		return err
	}
	s := states[0]
	r := m.report(s)
	if r.GetEnded() {
		m.mu.Lock()
		m.capDone[p.RunID] = true
		for n := range s.Nodes {
			delete(m.capStopped, p.RunID+"\x00"+n)
		}
		m.mu.Unlock()
		return nil
	}
	spent := r.GetTotalCostUsd()
	if spent < p.MaxCostUSD {
		return nil
	}
	now := m.cfg.Clock.Now().UTC()
	amounts := money.USDs(p.MaxCostUSD, spent) // as `budget` and its alerts round
	a := alert.Alert{
		Kind: KindMaxCost, Severity: alert.SeverityExceeded, Scope: "run:" + p.RunID, Threshold: 1,
		SpentUSD: spent, BudgetUSD: p.MaxCostUSD, Time: now, RunIDs: []string{p.RunID},
		Message: fmt.Sprintf("run %s reached its max-cost %s (%s spent): its ranks are told to stop", p.RunID, amounts[0], amounts[1]),
	}
	fired, err := m.rec.Fire(ctx, KindMaxCost+"/"+p.RunID, a)
	if fired {
		m.log.Warn("max-cost reached", "run", p.RunID, "spent", spent, "max_cost", p.MaxCostUSD)
	}
	if m.advise == nil {
		return err
	}
	reason := fmt.Sprintf("%s %s reached (%s spent)", MaxCostReasonPrefix, amounts[0], amounts[1])
	m.tellStop(m.capStopped, p.RunID, slices.Sorted(maps.Keys(s.Nodes)), reason)
	return err
}

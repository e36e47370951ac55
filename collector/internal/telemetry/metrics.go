package telemetry

import (
	"cmp"
	"context"
	"maps"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/trainmeter/trainmeter/pkg/otelexport"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Metric names (OTel); docs/otel.md gives their Prometheus renderings.
const (
	MetricRunTokens           = "trainmeter.run.tokens"
	MetricRunEnergy           = "trainmeter.run.energy"
	MetricRunEnergyPerToken   = "trainmeter.run.energy_per_token"
	MetricRunThroughput       = "trainmeter.run.throughput"
	MetricRunPower            = "trainmeter.run.power"
	MetricRunCost             = "trainmeter.run.cost_usd"
	MetricRunProjectedCost    = "trainmeter.run.projected_cost_usd"
	MetricRunDataWaitRatio    = "trainmeter.run.data_wait_ratio"
	MetricRunActive           = "trainmeter.run.active"
	MetricBudgetUseRatio      = "trainmeter.budget.use_ratio"
	MetricRecommendations     = "trainmeter.recommendations"
	MetricAgentConnected      = "trainmeter.agent.connected"
	MetricAgentLastSeenAge    = "trainmeter.agent.last_seen_age"
	EventAlert                = "trainmeter.alert"
	AttrRunID                 = "trainmeter.run.id"
	AttrRunModel              = "trainmeter.run.model"
	AttrRunBackend            = "trainmeter.run.backend"
	AttrRunBudgetScope        = "trainmeter.run.budget_scope"
	AttrRunGPUModel           = "trainmeter.run.gpu_model"
	AttrRunAttribution        = "trainmeter.run.attribution"
	AttrBudgetScope           = "trainmeter.budget.scope"
	AttrBudgetPeriod          = "trainmeter.budget.period"
	AttrRecommendationKind    = "trainmeter.recommendation.kind"
	AttrAlertKind             = "trainmeter.alert.kind"
	AttrAlertScope            = "trainmeter.alert.scope"
	AttrNode                  = otelexport.AttrNode
	unitTokens                = "{token}"
	unitUSD                   = "{USD}"
	unitRecommendations       = "{recommendation}"
	descriptionRunWindowBound = " (recently active runs only: docs/otel.md)"
)

// PrivateAttributes are the attributes that say whose work a series is
// about: a run's id, model, backend, budget scope and GPU model, and a
// budget's scope and period. /metrics serves the series carrying any of
// them only to scrapes with the read or admin token, unless the collector
// opts in (docs/otel.md, docs/security.md); OTLP push is not affected (it
// goes where the operator configured it, with its headers).
var PrivateAttributes = []string{AttrRunID, AttrRunModel, AttrRunBackend, AttrRunBudgetScope, AttrRunGPUModel, AttrBudgetScope, AttrBudgetPeriod}

// register creates every instrument and its callback.
func (t *Telemetry) register(m metric.Meter) error {
	inventory := func() map[string][]*trainmeterv1.GpuInfo {
		out := map[string][]*trainmeterv1.GpuInfo{}
		for _, n := range t.o.Nodes.Nodes() {
			out[n.GetNode()] = n.GetGpus()
		}
		return out
	}
	gpus, err := otelexport.NewGPUMetrics(m, otelexport.GPUOptions{Clock: t.o.Clock, Inventory: inventory})
	if err != nil {
		return err
	}
	t.gpus = gpus
	if err := t.registerRuns(m); err != nil {
		return err
	}
	if err := t.registerAgents(m); err != nil {
		return err
	}
	return t.registerSources(m)
}

func (t *Telemetry) registerRuns(m metric.Meter) error {
	var (
		errs                                   [9]error
		tokens                                 metric.Int64ObservableCounter
		active                                 metric.Int64ObservableGauge
		energy                                 metric.Float64ObservableCounter
		jpt, tps, power, cost, projected, wait metric.Float64ObservableGauge
	)
	tokens, errs[0] = m.Int64ObservableCounter(MetricRunTokens, metric.WithUnit(unitTokens),
		metric.WithDescription("Tokens the run has processed"+descriptionRunWindowBound))
	energy, errs[1] = m.Float64ObservableCounter(MetricRunEnergy, metric.WithUnit("J"),
		metric.WithDescription("Energy of the run's GPUs, warmup included"))
	jpt, errs[2] = m.Float64ObservableGauge(MetricRunEnergyPerToken, metric.WithUnit("J/{token}"),
		metric.WithDescription("Energy per token after warmup (J/token)"))
	tps, errs[3] = m.Float64ObservableGauge(MetricRunThroughput, metric.WithUnit("{token}/s"),
		metric.WithDescription("Tokens per second after warmup"))
	power, errs[4] = m.Float64ObservableGauge(MetricRunPower, metric.WithUnit("W"),
		metric.WithDescription("Average power of the run's GPUs after warmup"))
	cost, errs[5] = m.Float64ObservableGauge(MetricRunCost, metric.WithUnit(unitUSD),
		metric.WithDescription("Cost so far (GPU-hours and energy), USD; only for priced runs"))
	projected, errs[6] = m.Float64ObservableGauge(MetricRunProjectedCost, metric.WithUnit(unitUSD),
		metric.WithDescription("Projected total cost of the run, USD; only for priced runs"))
	wait, errs[7] = m.Float64ObservableGauge(MetricRunDataWaitRatio, metric.WithUnit("1"),
		metric.WithDescription("Share of step time spent waiting for the dataloader (0..1)"))
	active, errs[8] = m.Int64ObservableGauge(MetricRunActive,
		metric.WithDescription("1 while the run is going, 0 once it ended"))
	if err := cmp.Or(errs[:]...); err != nil {
		return err
	}
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		reports, err := t.reports()
		if err != nil {
			t.o.Logger.Warn("otel export: reading runs", "err", err)
			return err
		}
		for _, r := range reports {
			opt := metric.WithAttributeSet(runAttrs(r))
			o.ObserveInt64(tokens, int64(r.GetTokensProcessed()), opt)
			o.ObserveFloat64(energy, r.GetEnergyTotalJ(), opt)
			// A rate the collector does not know (rates_unavailable) is
			// not observed: no point, never a 0.
			if r.JPerToken != nil {
				o.ObserveFloat64(jpt, r.GetJPerToken(), opt)
			}
			if r.TokPerS != nil {
				o.ObserveFloat64(tps, r.GetTokPerS(), opt)
			}
			if r.AvgPowerW != nil {
				o.ObserveFloat64(power, r.GetAvgPowerW(), opt)
			}
			if r.TotalCostUsd != nil {
				o.ObserveFloat64(cost, r.GetTotalCostUsd(), opt)
				o.ObserveFloat64(projected, r.GetProjectedCostUsd(), opt)
			}
			if step := r.GetDataWaitS() + r.GetComputeS(); step > 0 {
				o.ObserveFloat64(wait, r.GetDataWaitS()/step, opt)
			}
			var a int64
			if !r.GetEnded() {
				a = 1
			}
			o.ObserveInt64(active, a, opt)
		}
		return nil
	}, tokens, energy, jpt, tps, power, cost, projected, wait, active)
	return err
}

func (t *Telemetry) registerAgents(m metric.Meter) error {
	connected, err := m.Int64ObservableGauge(MetricAgentConnected,
		metric.WithDescription("1 while the node's agent has a stream open to the collector, else 0"))
	if err != nil {
		return err
	}
	age, err := m.Float64ObservableGauge(MetricAgentLastSeenAge, metric.WithUnit("s"),
		metric.WithDescription("Seconds since the node's agent last sent anything (nodes seen since the collector started)"))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		now := t.o.Clock.Now()
		for _, n := range t.o.Nodes.Nodes() {
			opt := metric.WithAttributeSet(attribute.NewSet(attribute.String(AttrNode, n.GetNode())))
			var c int64
			if n.GetConnected() {
				c = 1
			}
			o.ObserveInt64(connected, c, opt)
			if n.GetLastSeen() != nil {
				o.ObserveFloat64(age, max(0, now.Sub(n.GetLastSeen().AsTime()).Seconds()), opt)
			}
		}
		return nil
	}, connected, age)
	return err
}

func (t *Telemetry) registerSources(m metric.Meter) error {
	use, err := m.Float64ObservableGauge(MetricBudgetUseRatio, metric.WithUnit("1"),
		metric.WithDescription("Budget spent / budget limit (1 = used up)"))
	if err != nil {
		return err
	}
	recs, err := m.Int64ObservableCounter(MetricRecommendations, metric.WithUnit(unitRecommendations),
		metric.WithDescription("Recommendations issued since the collector started, by kind"))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if t.o.Budgets != nil {
			for _, b := range t.o.Budgets.BudgetUse() {
				o.ObserveFloat64(use, b.Ratio, metric.WithAttributeSet(attribute.NewSet(
					attribute.String(AttrBudgetScope, b.Scope), attribute.String(AttrBudgetPeriod, b.Period))))
			}
		}
		if t.o.Recommendations != nil {
			counts := t.o.Recommendations.Counts()
			for _, k := range slices.Sorted(maps.Keys(counts)) {
				o.ObserveInt64(recs, int64(counts[k]), metric.WithAttributeSet(attribute.NewSet(attribute.String(AttrRecommendationKind, k))))
			}
		}
		return nil
	}, use, recs)
	return err
}

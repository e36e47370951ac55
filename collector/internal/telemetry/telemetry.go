// Package telemetry exports the collector's figures through OpenTelemetry
// (package otelexport does the SDK plumbing): the agents' GPUs as the OTel
// hardware conventions (hw.*), per-run trainmeter.run.* metrics read from the
// run aggregates, per-node agent liveness, budget use and recommendation
// counts from pluggable sources, and alerts as OTel log records.
// docs/otel.md lists every metric.
package telemetry

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otellog "go.opentelemetry.io/otel/log"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/pkg/otelexport"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

// Bounds on the runs exported (the cardinality of trainmeter.run.*): runs
// that got data within DefaultRunWindow, at most DefaultMaxRuns of them
// (the most recently active first).
const (
	DefaultRunWindow = 15 * time.Minute
	DefaultMaxRuns   = 200
)

// Nodes reports the connected agents and their GPUs (the ingest server).
type Nodes interface {
	Nodes() []*trainmeterv1.NodeStatus
}

// BudgetUse is one budget's consumption.
type BudgetUse struct {
	Scope, Period string
	// Ratio is spent / limit (1 = the budget is used up; may exceed 1).
	Ratio float64
}

// BudgetSource supplies budget use; it is read on every collection and must
// be quick and safe for concurrent use.
type BudgetSource interface {
	BudgetUse() []BudgetUse
}

// RecommendationSource supplies how many recommendations of each kind the
// collector has issued since it started (monotonic per kind); read on every
// collection, it must be quick and safe for concurrent use.
type RecommendationSource interface {
	Counts() map[string]int
}

// Alert is a budget or price alert sent out as an OTel log record.
type Alert struct {
	Kind string // "budget", "price", ...
	// Severity: info, warn(ing), error, critical or exceeded (else info).
	Severity string
	Scope    string // what the alert is about (a budget scope, a run id...)
	Message  string
	// Attributes are extra record attributes, prefixed "trainmeter.alert.".
	Attributes map[string]string
	Time       time.Time // of the event; the emit time when zero
}

// Options configure New.
type Options struct {
	// Exporter is the started OTel export the figures go out through, owned
	// by the Telemetry from New on; it is started first so that AlertLog can
	// use it while the components feeding Budgets and Recommendations are built.
	Exporter *otelexport.Exporter
	Runs     storage.Runs
	Nodes    Nodes
	Pricing  aggregate.Pricing
	Clock    clock.Clock // the collector's; the wall clock if nil
	// RunWindow and MaxRuns override the defaults above.
	RunWindow time.Duration
	MaxRuns   int
	Logger    *slog.Logger
	// Budgets and Recommendations feed trainmeter.budget.use_ratio and
	// trainmeter.recommendations; nil: those series are not exported.
	Budgets         BudgetSource
	Recommendations RecommendationSource
	// Fleet, for collectors sharing one store (replicas on PostgreSQL):
	// the run series are the fleet's, one per run, exported by its leader
	// alone. nil: this collector exports the runs it applied data of.
	Fleet *Fleet
}

// Fleet makes the run series one per run across collectors sharing a
// store: while Leading, a collection exports the runs the store says got
// data within RunWindow (whichever collector applied it), at most MaxRuns,
// the most recent first; otherwise it exports no run series.
type Fleet struct {
	Leading func() bool
	Runs    RecentRuns
}

// RecentRuns is the shared store's record of which runs got data when
// (pgstore.Store).
type RecentRuns interface {
	RunsWithDataSince(since time.Time, limit int) ([]string, error)
}

// Telemetry is the collector's OTel export. A nil *Telemetry does nothing.
type Telemetry struct {
	o    Options
	gpus *otelexport.GPUMetrics

	mu     sync.Mutex
	recent map[string]time.Time // run id → when a batch last touched it
}

// New registers the collector's metrics on o.Exporter. On error the
// exporter is left to the caller.
func New(o Options) (*Telemetry, error) {
	if o.Exporter == nil || o.Runs == nil || o.Nodes == nil {
		return nil, errors.New("telemetry: exporter, runs and nodes are required")
	}
	o.Clock = cmp.Or[clock.Clock](o.Clock, clock.Real{})
	if o.RunWindow <= 0 {
		o.RunWindow = DefaultRunWindow
	}
	if o.MaxRuns <= 0 {
		o.MaxRuns = DefaultMaxRuns
	}
	o.Logger = cmp.Or(o.Logger, slog.New(slog.DiscardHandler))
	t := &Telemetry{o: o, recent: map[string]time.Time{}}
	if err := t.register(o.Exporter.Meter()); err != nil {
		return nil, err
	}
	return t, nil
}

// PrometheusAddr is the bound /metrics address (nil when off).
func (t *Telemetry) PrometheusAddr() net.Addr {
	if t == nil {
		return nil
	}
	return t.o.Exporter.PrometheusAddr()
}

// Flush pushes pending metrics and log records now (OTLP).
func (t *Telemetry) Flush(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.o.Exporter.Flush(ctx)
}

// Shutdown pushes a last export and stops. Call it before the store closes:
// the last collection reads the run aggregates.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.o.Exporter.Shutdown(ctx)
}

// OnApplied is the ingest hook (ingest.Server.OnApplied): it folds the GPU
// windows and notes the runs the batch touched. It does not block.
func (t *Telemetry) OnApplied(node string, b *trainmeterv1.Batch) {
	if t == nil {
		return
	}
	t.gpus.Batch(node, b)
	if t.o.Fleet != nil {
		return // the store knows the fleet's runs
	}
	now := t.o.Clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	note := func(id string) {
		if id != "" {
			t.recent[id] = now
		}
	}
	for _, w := range b.GetRunWindows() {
		note(w.GetRunId())
	}
	for _, e := range b.GetRunEvents() {
		note(aggregate.EventRunID(e))
	}
	for _, l := range b.GetLosses() {
		note(l.GetRunId())
	}
}

// exportedRuns returns the ids of the runs to export (active within
// RunWindow, the MaxRuns most recent), forgetting older ones.
func (t *Telemetry) exportedRuns() []string {
	now := t.o.Clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	type seen struct {
		id string
		at time.Time
	}
	all := make([]seen, 0, len(t.recent))
	for id, at := range t.recent {
		if now.Sub(at) > t.o.RunWindow {
			delete(t.recent, id)
			continue
		}
		all = append(all, seen{id, at})
	}
	slices.SortFunc(all, func(a, b seen) int { return cmp.Or(b.at.Compare(a.at), cmp.Compare(a.id, b.id)) })
	if len(all) > t.o.MaxRuns {
		for _, s := range all[t.o.MaxRuns:] {
			delete(t.recent, s.id)
		}
		all = all[:t.o.MaxRuns]
	}
	ids := make([]string, len(all))
	for i, s := range all {
		ids[i] = s.id
	}
	slices.Sort(ids)
	return ids
}

// forget drops runs the store no longer has (deleted).
func (t *Telemetry) forget(ids []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range ids {
		delete(t.recent, id)
	}
}

// fleetRuns is exportedRuns for a Fleet.
func (t *Telemetry) fleetRuns() ([]string, error) {
	if !t.o.Fleet.Leading() {
		return nil, nil
	}
	ids, err := t.o.Fleet.Runs.RunsWithDataSince(t.o.Clock.Now().Add(-t.o.RunWindow), t.o.MaxRuns)
	slices.Sort(ids)
	return ids, err
}

// reports reads the exported runs' reports.
func (t *Telemetry) reports() ([]*trainmeterv1.RunReport, error) {
	if t.o.Fleet != nil {
		ids, err := t.fleetRuns()
		if err != nil || len(ids) == 0 {
			return nil, err
		}
		sts, err := t.o.Runs.ListRuns(ids)
		var nf *storage.NotFoundError
		if errors.As(err, &nf) { // deleted since
			ids = slices.DeleteFunc(ids, func(id string) bool { return slices.Contains(nf.IDs, id) })
			if len(ids) == 0 {
				return nil, nil
			}
			sts, err = t.o.Runs.ListRuns(ids)
		}
		if err != nil {
			return nil, err
		}
		return t.reportsOf(sts), nil
	}
	ids := t.exportedRuns()
	if len(ids) == 0 {
		return nil, nil
	}
	sts, err := t.o.Runs.ListRuns(ids)
	var nf *storage.NotFoundError
	if errors.As(err, &nf) {
		t.forget(nf.IDs)
		if ids = t.exportedRuns(); len(ids) == 0 {
			return nil, nil
		}
		sts, err = t.o.Runs.ListRuns(ids)
	}
	if err != nil {
		return nil, err
	}
	return t.reportsOf(sts), nil
}

func (t *Telemetry) reportsOf(sts []*aggregate.State) []*trainmeterv1.RunReport {
	out := make([]*trainmeterv1.RunReport, 0, len(sts))
	for _, st := range sts {
		out = append(out, st.Report(t.o.Pricing))
	}
	return out
}

// runAttrs are the attributes of a run's metrics: bounded per run (no free
// form labels), see docs/otel.md.
func runAttrs(r *trainmeterv1.RunReport) attribute.Set {
	return attribute.NewSet(
		attribute.String(AttrRunID, r.GetRunId()),
		attribute.String(AttrRunModel, r.GetMetadata().GetModel()),
		attribute.String(AttrRunBackend, r.GetMetadata().GetBackend()),
		attribute.String(AttrRunBudgetScope, r.GetBudgetScope()),
		attribute.String(AttrRunGPUModel, r.GetGpuName()),
		attribute.String(AttrRunAttribution, r.GetAttribution()),
	)
}

// AlertLog sends alerts out as OTel log records through an exporter. It
// needs only the exporter, so alerts can be wired before the Telemetry that
// reads the budget and recommendation sources exists.
type AlertLog struct {
	logger otellog.Logger
	clock  clock.Clock
}

// NewAlertLog returns the alert log of exp; clk nil: the wall clock. A nil
// exp gives a nil *AlertLog, which does nothing.
func NewAlertLog(exp *otelexport.Exporter, clk clock.Clock) *AlertLog {
	if exp == nil {
		return nil
	}
	return &AlertLog{logger: exp.Logger(), clock: cmp.Or[clock.Clock](clk, clock.Real{})}
}

// EmitAlert sends a as an OTel log record (nothing without OTLP).
func (l *AlertLog) EmitAlert(ctx context.Context, a Alert) {
	if l == nil {
		return
	}
	now := l.clock.Now()
	var r otellog.Record
	r.SetEventName(EventAlert)
	if a.Time.IsZero() {
		r.SetTimestamp(now)
	} else {
		r.SetTimestamp(a.Time)
	}
	r.SetObservedTimestamp(now)
	sev, text := severity(a.Severity)
	r.SetSeverity(sev)
	r.SetSeverityText(text)
	r.SetBody(attribute.StringValue(a.Message))
	r.AddAttributes(attribute.String(AttrAlertKind, a.Kind), attribute.String(AttrAlertScope, a.Scope))
	for _, k := range slices.Sorted(maps.Keys(a.Attributes)) {
		r.AddAttributes(attribute.String("trainmeter.alert."+k, a.Attributes[k]))
	}
	l.logger.Emit(ctx, r)
}

func severity(s string) (otellog.Severity, string) {
	switch s {
	case "warn", "warning":
		return otellog.SeverityWarn, "WARN"
	case "error":
		return otellog.SeverityError, "ERROR"
	case "critical": // budget alerts at 90 %
		return otellog.SeverityError, "CRITICAL"
	case "exceeded": // budget alerts at 100 %
		return otellog.SeverityError2, "EXCEEDED"
	}
	return otellog.SeverityInfo, "INFO"
}

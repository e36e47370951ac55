// Package alert is the collector's alert record: what budgets, run cost caps
// and price watching fire. A Recorder stores each alert once (by its dedup
// key) and tells the sinks of new ones; Webhooks is the sink that POSTs them,
// with retries that survive a restart (docs/budgets.md).
package alert

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sort"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/storage"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// NSAlerts is the store namespace of fired alerts, keyed by what makes an
// alert unique; stored with PutRecordIfAbsent, an alert fires once, also
// across restarts and concurrent evaluations.
const NSAlerts = "alerts"

// Alert kinds and severities.
const (
	KindBudget = "budget"
	KindPrice  = "price"

	SeverityInfo     = "info"
	SeverityWarning  = "warning"
	SeverityCritical = "critical"
	SeverityExceeded = "exceeded"
)

// Alert is what is stored, listed, and POSTed to webhooks (as this JSON).
type Alert struct {
	ID        string `json:"id"`
	Kind      string `json:"kind"`
	Severity  string `json:"severity"`
	Scope     string `json:"scope,omitempty"`
	Period    string `json:"period,omitempty"`
	PeriodKey string `json:"period_key,omitempty"` // "total" or the month, e.g. "2026-11"
	// Threshold: the budget share crossed (0.5, 0.75, 0.9, 1); for a price
	// alert, the change that alerted (e.g. -0.12).
	Threshold float64   `json:"threshold"`
	SpentUSD  float64   `json:"spent_usd,omitempty"`
	BudgetUSD float64   `json:"budget_usd,omitempty"`
	Projected bool      `json:"projected"` // on projected spend at run completion
	Message   string    `json:"message"`
	Time      time.Time `json:"time"`
	BudgetID  string    `json:"budget_id,omitempty"`

	GPUName             string  `json:"gpu_name,omitempty"`
	PriceUSDPerHour     float64 `json:"price_usd_per_hour,omitempty"`
	ReferenceUSDPerHour float64 `json:"reference_usd_per_hour,omitempty"`
	Change              float64 `json:"change,omitempty"`
	// RunIDs are runs the budget covers in the period (budget.MaxAlertRunIDs at most).
	RunIDs []string `json:"run_ids,omitempty"`
}

// alertID is a stable id derived from the alert's dedup key: a receiver that
// gets an alert twice (a retried POST whose answer was lost) can tell.
func alertID(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:8])
}

// Sink is told of each alert once, after it is stored. It must not block.
type Sink interface {
	Alert(ctx context.Context, a Alert)
}

// Sinks fans an alert out to several sinks.
type Sinks []Sink

func (s Sinks) Alert(ctx context.Context, a Alert) {
	for _, k := range s {
		if k != nil {
			k.Alert(ctx, a)
		}
	}
}

// Recorder stores alerts once and tells the sinks of new ones.
type Recorder struct {
	Store storage.Records
	Sink  Sink
}

// Fire stores a under key unless an alert is stored there already; it
// reports whether a fired (was new), and then tells the sink.
func (r *Recorder) Fire(ctx context.Context, key string, a Alert) (bool, error) {
	a.ID = alertID(key)
	b, err := json.Marshal(a)
	if err != nil {
		return false, err
	}
	won, err := r.Store.PutRecordIfAbsent(NSAlerts, key, b)
	if err != nil || !won {
		return false, err
	}
	if r.Sink != nil {
		r.Sink.Alert(ctx, a)
	}
	return true, nil
}

// List returns the stored alerts of kind ("" = all), oldest first.
func (r *Recorder) List(kind string) ([]Alert, error) {
	var out []Alert
	err := r.Store.ScanRecords(NSAlerts, kind, func(_ string, v []byte) (bool, error) {
		var a Alert
		if err := json.Unmarshal(v, &a); err != nil {
			return true, nil // a record we cannot read is skipped, not fatal
		}
		out = append(out, a)
		return true, nil
	})
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out, err
}

func (a Alert) Proto() *trainmeterv1.Alert {
	return &trainmeterv1.Alert{
		Id: a.ID, Kind: a.Kind, Severity: a.Severity, Scope: a.Scope, Period: a.Period, PeriodKey: a.PeriodKey,
		Threshold: a.Threshold, SpentUsd: a.SpentUSD, BudgetUsd: a.BudgetUSD, Projected: a.Projected,
		Message: a.Message, Time: timestamppb.New(a.Time), BudgetId: a.BudgetID, GpuName: a.GPUName,
		PriceUsdPerHour: a.PriceUSDPerHour, ReferenceUsdPerHour: a.ReferenceUSDPerHour, Change: a.Change,
		RunIds: a.RunIDs,
	}
}

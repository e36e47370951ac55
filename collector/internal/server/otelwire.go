package server

import (
	"context"
	"strconv"

	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/budget"
	"github.com/trainmeter/trainmeter/collector/internal/telemetry"
)

// otelAlerts sends budget and price alerts out as OTel log records.
type otelAlerts struct{ t *telemetry.AlertLog }

func (o otelAlerts) Alert(ctx context.Context, a alert.Alert) {
	o.t.EmitAlert(ctx, telemetry.Alert{Kind: a.Kind, Severity: a.Severity, Scope: a.Scope, Message: a.Message, Time: a.Time, Attributes: alertAttributes(a)})
}

// alertAttributes are an alert's details, sent as trainmeter.alert.<key>
// record attributes (docs/otel.md lists the keys); empty ones are left out.
func alertAttributes(a alert.Alert) map[string]string {
	attrs := map[string]string{"id": a.ID, "severity": a.Severity}
	set := func(k, v string) {
		if v != "" {
			attrs[k] = v
		}
	}
	num := func(k string, v float64) {
		if v != 0 {
			attrs[k] = strconv.FormatFloat(v, 'g', -1, 64)
		}
	}
	set("period", a.Period)
	set("period_key", a.PeriodKey)
	set("budget_id", a.BudgetID)
	set("gpu_name", a.GPUName)
	num("threshold", a.Threshold)
	num("spent_usd", a.SpentUSD)
	num("budget_usd", a.BudgetUSD)
	num("price_usd_per_hour", a.PriceUSDPerHour)
	num("reference_usd_per_hour", a.ReferenceUSDPerHour)
	num("change", a.Change)
	if a.Kind == alert.KindBudget {
		attrs["projected"] = strconv.FormatBool(a.Projected)
	}
	return attrs
}

// budgetUse feeds the budget manager's use ratios to the
// trainmeter.budget.use_ratio gauge.
type budgetUse struct{ m *budget.Manager }

func (b budgetUse) BudgetUse() []telemetry.BudgetUse {
	var out []telemetry.BudgetUse
	for _, u := range b.m.BudgetUse() {
		out = append(out, telemetry.BudgetUse{Scope: u.Scope, Period: u.Period, Ratio: u.Ratio})
	}
	return out
}

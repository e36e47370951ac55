package budget

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/query/compare"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
	"google.golang.org/protobuf/proto"
)

// DefaultForecastHistory is how many ended runs a forecast learns from.
const DefaultForecastHistory = 5

// ErrNoHistory: the model has no ended run with a cost.
var ErrNoHistory = errors.New("no ended runs with a cost")

// Forecast estimates the cost of n more runs like the model's last k ended
// runs (k = 0: DefaultForecastHistory), against the tightest budget that
// covers the model (see below). Failed runs (cost.Failed) are left out: a
// crashed run's cost says nothing about what a run costs. The n runs are
// taken as independent: their sum is normal(n·mean, √n·stddev).
func (m *Manager) Forecast(model string, n, k int) (*trainmeterv1.ForecastResponse, error) {
	model = strings.TrimSpace(model)
	if model == "" || n <= 0 {
		return nil, fmt.Errorf("forecast needs a model and a number of runs > 0")
	}
	if k <= 0 {
		k = DefaultForecastHistory
	}
	m.evalMu.Lock()
	defer m.evalMu.Unlock()
	runs, err := m.runs()
	if err != nil {
		return nil, err
	}
	var hist []run
	failed := 0
	for _, x := range runs {
		// A run priced by energy only has a total cost too.
		if x.r.GetEnded() && x.r.GetMetadata().GetModel() == model && x.r.TotalCostUsd != nil {
			if cost.Failed(x.r) {
				failed++
				continue
			}
			hist = append(hist, x)
		}
	}
	if len(hist) == 0 {
		if failed > 0 {
			return nil, fmt.Errorf("model %q: %w (%d failed run(s) left out)", model, ErrNoHistory, failed)
		}
		return nil, fmt.Errorf("model %q: %w", model, ErrNoHistory)
	}
	sort.Slice(hist, func(i, j int) bool { return hist[i].r.GetEnd().AsTime().After(hist[j].r.GetEnd().AsTime()) })
	hist = hist[:min(k, len(hist))]
	f := &trainmeterv1.ForecastResponse{Model: model, Runs: uint32(n), FailedLeftOut: uint32(failed)}
	var costs []float64
	for _, x := range hist {
		f.BasedOn = append(f.BasedOn, x.r.GetRunId())
		costs = append(costs, x.r.GetTotalCostUsd())
	}
	sum := compare.Summarize(costs)
	f.MeanRunUsd, f.StddevRunUsd = sum.Mean, sum.SD
	f.ExpectedUsd = float64(n) * f.MeanRunUsd
	f.StddevUsd = math.Sqrt(float64(n)) * f.StddevRunUsd

	budgets, err := m.Budgets()
	if err != nil {
		return nil, err
	}
	// Of the budgets covering the model (model:NAME, or any scope matching
	// its latest run), the forecast is against the tightest: the one with
	// the least left in its current period.
	st := m.statuses(budgets, runs)
	for i, b := range budgets {
		if b.Scope != "model:"+model && !Matches(b.Scope, hist[0].r) {
			continue
		}
		if left := b.LimitUSD - st[i].cur.ProjectedUSD; f.BudgetUsd == nil || left < f.GetRemainingUsd() {
			f.BudgetScope, f.BudgetPeriod, f.BudgetUsd, f.RemainingUsd = b.Scope, b.Period, &budgets[i].LimitUSD, &left
		}
	}
	if f.BudgetUsd != nil {
		f.OverageProbability = proto.Float64(overage(f.ExpectedUsd, f.StddevUsd, f.GetRemainingUsd()))
	}
	return f, nil
}

// overage is P(X > remaining) for X ~ normal(mean, sd).
func overage(mean, sd, remaining float64) float64 {
	if sd <= 0 {
		if mean > remaining {
			return 1
		}
		return 0
	}
	return 0.5 * math.Erfc((remaining-mean)/(sd*math.Sqrt2))
}

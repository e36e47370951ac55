package budget

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/page"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Service is the BudgetService gRPC implementation.
type Service struct {
	trainmeterv1.UnimplementedBudgetServiceServer
	m *Manager
}

// NewService serves m.
func NewService(m *Manager) *Service { return &Service{m: m} }

func (s *Service) SetBudget(_ context.Context, req *trainmeterv1.SetBudgetRequest) (*trainmeterv1.SetBudgetResponse, error) {
	b, err := s.m.Set(Budget{ID: req.GetBudgetId(), Scope: req.GetScope(), Period: req.GetPeriod(), LimitUSD: req.GetLimitUsd(), Policy: req.GetPolicy()})
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &trainmeterv1.SetBudgetResponse{Budget: b.Proto()}, nil
}

func (s *Service) DeleteBudget(_ context.Context, req *trainmeterv1.DeleteBudgetRequest) (*trainmeterv1.DeleteBudgetResponse, error) {
	err := s.m.Delete(req.GetScope(), req.GetPeriod())
	if errors.Is(err, ErrNoBudget) {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &trainmeterv1.DeleteBudgetResponse{}, nil
}

func (s *Service) ListBudgets(context.Context, *trainmeterv1.ListBudgetsRequest) (*trainmeterv1.ListBudgetsResponse, error) {
	sts, err := s.m.Statuses()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	resp := &trainmeterv1.ListBudgetsResponse{}
	for _, st := range sts {
		resp.Budgets = append(resp.Budgets, &trainmeterv1.BudgetStatus{
			Budget: st.Budget.Proto(), PeriodKey: st.PeriodKey, SpentUsd: st.SpentUSD, ProjectedUsd: st.ProjectedUSD,
			Ratio: st.Ratio(), ProjectedRatio: st.ProjectedRatio(), Runs: uint32(st.Runs), LiveRuns: uint32(st.Live),
		})
	}
	return resp, nil
}

func (s *Service) ListAlerts(_ context.Context, req *trainmeterv1.ListAlertsRequest) (*trainmeterv1.ListAlertsResponse, error) {
	switch req.GetKind() {
	case "", alert.KindBudget, alert.KindPrice, KindMaxCost:
	default:
		return nil, status.Errorf(codes.InvalidArgument, "alert kind %q: want budget, price or max-cost", req.GetKind())
	}
	size, err := page.Size(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	fp := page.Request("ListAlerts", req.GetKind())
	tok, err := page.Decode(req.GetPageToken(), fp)
	if err != nil {
		return nil, err
	}
	alerts, err := s.m.Recorder().List(req.GetKind())
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	// Pages go by (time, id), which an alert recorded later does not move
	// ahead of a page already read unless it is back-dated.
	slices.SortStableFunc(alerts, func(a, b alert.Alert) int { return strings.Compare(alertKey(a), alertKey(b)) })
	i := 0
	if req.GetPageToken() != "" {
		i = sort.Search(len(alerts), func(i int) bool { return alertKey(alerts[i]) > tok.After })
	}
	resp := &trainmeterv1.ListAlertsResponse{}
	var b page.Budget
	last := ""
	for ; i < len(alerts); i++ {
		a := alerts[i].Proto()
		if len(resp.Alerts) >= size || !b.Fits(a) {
			break
		}
		resp.Alerts, last = append(resp.Alerts, a), alertKey(alerts[i])
	}
	if i < len(alerts) {
		resp.NextPageToken = page.Encode(page.Token{Req: fp, After: last})
	}
	return resp, nil
}

// alertKey orders alerts by time (Unix ns, zero-padded to sort), then id.
func alertKey(a alert.Alert) string {
	return fmt.Sprintf("%020d\x00%s", max(0, a.Time.UnixNano()), a.ID)
}

func (s *Service) Forecast(_ context.Context, req *trainmeterv1.ForecastRequest) (*trainmeterv1.ForecastResponse, error) {
	if req.GetRuns() == 0 || req.GetRuns() > 1_000_000 || req.GetModel() == "" {
		return nil, status.Error(codes.InvalidArgument, "forecast needs a model and 1..1000000 runs")
	}
	f, err := s.m.Forecast(req.GetModel(), int(req.GetRuns()), int(min(req.GetHistory(), 1000)))
	if errors.Is(err, ErrNoHistory) {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return f, nil
}

func estimateRequest(req *trainmeterv1.EstimateRequest) cost.EstimateRequest {
	return cost.EstimateRequest{Model: req.GetModel(), Tokens: req.GetTokens(), GPU: req.GetGpu(), GPUs: req.GetGpus()}
}

func (s *Service) Estimate(_ context.Context, req *trainmeterv1.EstimateRequest) (*trainmeterv1.EstimateResponse, error) {
	e, err := s.m.Estimate(estimateRequest(req))
	switch {
	case errors.Is(err, cost.ErrNoEstimateHistory):
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	case err != nil && strings.Contains(err.Error(), "needs"):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &trainmeterv1.EstimateResponse{Estimate: e}, nil
}

func (s *Service) PlanRun(_ context.Context, req *trainmeterv1.PlanRunRequest) (*trainmeterv1.PlanRunResponse, error) {
	var er *cost.EstimateRequest
	if req.GetEstimate() != nil {
		x := estimateRequest(req.GetEstimate())
		er = &x
	}
	key, e, estErr, err := s.m.PlanRun(req.GetRunId(), req.GetPlanKey(), req.GetMaxCostUsd(), er)
	if errors.Is(err, ErrRunStarted) {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &trainmeterv1.PlanRunResponse{Estimate: e, EstimateError: estErr, PlanKey: key}, nil
}

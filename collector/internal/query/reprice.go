package query

import (
	"context"
	"log/slog"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// MaxRepriceReason bounds the reason kept on each repriced run (bytes).
const MaxRepriceReason = 512

// SetLogger sets where repricing is logged; call before serving.
func (s *Server) SetLogger(l *slog.Logger) { s.log = l }

// Reprice implements QueryService.Reprice (an admin RPC): the only way a
// booked GPU cost changes (docs/costs.md, "Locked prices"). Each run
// repriced is logged and keeps when, its cost before and why.
func (s *Server) Reprice(_ context.Context, req *trainmeterv1.RepriceRequest) (*trainmeterv1.RepriceResponse, error) {
	price, reason := req.GetUsdPerGpuHour(), strings.TrimSpace(req.GetReason())
	hasRun, hasSince := req.GetRunId() != "", req.GetSince() != nil
	switch {
	case hasRun == hasSince:
		return nil, status.Error(codes.InvalidArgument, "give either a run (--run) or a time (--since), not both or neither")
	case math.IsNaN(price) || math.IsInf(price, 0) || price <= 0:
		return nil, status.Errorf(codes.InvalidArgument, "the price must be a finite number of USD per GPU-hour > 0, got %v", price)
	case reason == "":
		return nil, status.Error(codes.InvalidArgument, "a reason is required: it is kept on each run repriced")
	case len(reason) > MaxRepriceReason || !utf8.ValidString(reason):
		return nil, status.Errorf(codes.InvalidArgument, "the reason must be valid UTF-8 of at most %d bytes", MaxRepriceReason)
	}
	var since time.Time
	ids := []string{req.GetRunId()}
	if hasSince {
		if err := req.GetSince().CheckValid(); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "since: %v", err)
		}
		since = req.GetSince().AsTime()
		runs, err := s.store.ListRuns(nil)
		if err != nil {
			return nil, s.storeErr(err)
		}
		ids = ids[:0]
		for _, st := range runs {
			if st.HasWindow && st.WindowEnd > since.UnixNano() {
				ids = append(ids, st.RunId)
			}
		}
	}
	report := func(st *aggregate.State) *trainmeterv1.RunReport { return st.Report(s.pricing) }
	resp := &trainmeterv1.RepriceResponse{}
	for _, id := range ids {
		before, after, ch, err := s.store.Reprice(id, since, price, reason, report)
		if err != nil {
			return nil, s.runErr(id, err)
		}
		if after == nil {
			continue // no GPU time of the run since then
		}
		s.log.Warn("run repriced", "run", id, "usd_per_gpu_hour", price, "gpu_seconds", ch.GPUSeconds,
			"cost_usd_before", before.GetCostUsd(), "cost_usd", after.GetCostUsd(), "reason", reason)
		resp.Runs = append(resp.Runs, &trainmeterv1.RepricedRun{RunId: id, PreviousCostUsd: before.GetCostUsd(),
			CostUsd: after.GetCostUsd(), GpuSeconds: ch.GPUSeconds})
	}
	return resp, nil
}

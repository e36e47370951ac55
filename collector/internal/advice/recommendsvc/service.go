// Package recommendsvc is the collector's RecommendService: cost
// recommendations across finished runs (right-sizing, spot, scheduling, and
// the dataloader settings the live advisor found for a run's next start).
// The live dataloader advice itself, sent down the stream while a run
// trains, is package dataloadersvc; this package only reads its history.
package recommendsvc

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trainmeter/trainmeter/collector/internal/advice/dataloadersvc"
	"github.com/trainmeter/trainmeter/collector/internal/advice/recommend"
	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/parallel"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/internal/plural"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Service implements RecommendService.
type Service struct {
	trainmeterv1.UnimplementedRecommendServiceServer
	st      storage.Store
	pricing aggregate.Pricing
	catalog recommend.PriceCatalog
}

// NewService returns the recommendation service. catalog may be nil.
func NewService(st storage.Store, p aggregate.Pricing, catalog recommend.PriceCatalog) *Service {
	return &Service{st: st, pricing: p, catalog: catalog}
}

func storeErr(err error) error {
	var nf *storage.NotFoundError
	if errors.As(err, &nf) {
		return status.Errorf(codes.NotFound, "unknown %s: %q", plural.Noun(int64(len(nf.IDs)), "run"), nf.IDs)
	}
	if errors.Is(err, storage.ErrNotFound) {
		return status.Error(codes.NotFound, "run not found")
	}
	return status.Errorf(codes.Internal, "store: %v", err)
}

// Recommend implements RecommendService.Recommend.
func (s *Service) Recommend(_ context.Context, req *trainmeterv1.RecommendRequest) (*trainmeterv1.RecommendResponse, error) {
	mc := req.GetMinConfidence()
	if math.IsNaN(mc) || mc < 0 || mc > 1 {
		return nil, status.Errorf(codes.InvalidArgument, "min_confidence %v: want 0..1", mc)
	}
	for _, id := range req.GetRunIds() {
		if id == "" {
			return nil, status.Error(codes.InvalidArgument, "empty run id")
		}
	}
	if len(req.GetRunIds()) > 0 { // unknown ids are an error, not an empty answer
		if _, err := s.st.ListRuns(req.GetRunIds()); err != nil {
			return nil, storeErr(err)
		}
	}
	all, err := s.st.ListRuns(nil)
	if err != nil {
		return nil, storeErr(err)
	}
	nodes, err := s.st.Nodes()
	if err != nil {
		return nil, storeErr(err)
	}
	gpuInfo := map[string]map[uint32]*trainmeterv1.GpuInfo{}
	for _, n := range nodes {
		m := map[uint32]*trainmeterv1.GpuInfo{}
		for _, g := range n.GetGpus() {
			m[g.GetIndex()] = g
		}
		gpuInfo[n.GetNode()] = m
	}
	reports := s.reports(all)
	runs := make([]recommend.Run, 0, len(all))
	for i, st := range all {
		r := recommend.Run{Report: reports[i], PlannedEpochs: st.GetRunStart().GetPlannedEpochs(), DatasetSize: st.GetRunStart().GetDatasetSize()}
		if cost.Failed(r.Report) {
			// A run that failed (error, non-zero exit, signal, lost) stopped
			// part-way for reasons of its own: neither a baseline for others
			// nor worth advice on how to finish.
			continue
		}
		for node, ns := range st.Nodes {
			for _, i := range ns.Gpus {
				if g := gpuInfo[node][i]; g != nil {
					if m := float64(g.GetMemoryTotalMib()); m > 0 && (r.GPUMemoryMiB == 0 || m < r.GPUMemoryMiB) {
						r.GPUMemoryMiB = m
					}
					if p := g.GetPowerLimitW(); p > 0 && (r.GPUPowerLimitW == 0 || p < r.GPUPowerLimitW) {
						r.GPUPowerLimitW = p
					}
				}
			}
		}
		runs = append(runs, r)
	}
	recs := recommend.Recommend(runs, recommend.Options{Catalog: s.catalog, Targets: req.GetRunIds(),
		Schedule: recommend.ScheduleInputs{Carbon: s.pricing.CarbonFile, Tariff: s.pricing.Tariff, PUE: s.pricing.EffectivePUE()}})
	// Every run's advice history in one read, unless only a few runs are
	// asked about.
	var hs map[string]*trainmeterv1.DataloaderHistoryResponse
	if len(req.GetRunIds()) == 0 {
		if hs, err = dataloadersvc.Histories(s.st); err != nil {
			return nil, storeErr(err)
		}
	}
	for _, r := range runs {
		id := r.Report.GetRunId()
		if len(req.GetRunIds()) > 0 && !slices.Contains(req.GetRunIds(), id) {
			continue
		}
		h := hs[id]
		if hs == nil || strings.ContainsRune(id, 0) {
			if h, err = dataloadersvc.History(s.st, id); err != nil {
				return nil, storeErr(err)
			}
		}
		if h == nil {
			continue // no history: no advice
		}
		if rec := dataloadersvc.DataloaderRecommendation(r.Report, h); rec != nil {
			recs = append(recs, rec)
		}
	}
	recommend.Sort(recs)
	kept, usd, j := recommend.Filter(recs, mc, runs)
	return &trainmeterv1.RecommendResponse{Recommendations: kept, TotalSavingsUsd: usd, TotalSavingsJ: j}, nil
}

// reports is the reports of sts, computed on all cores: every run's report
// is most of a recommendation's work, and each is independent of the others.
func (s *Service) reports(sts []*aggregate.State) []*trainmeterv1.RunReport {
	out := make([]*trainmeterv1.RunReport, len(sts))
	parallel.Each(len(sts), 64, func(i int) { out[i] = sts[i].Report(s.pricing) })
	return out
}

// DataloaderHistory implements RecommendService.DataloaderHistory.
func (s *Service) DataloaderHistory(_ context.Context, req *trainmeterv1.DataloaderHistoryRequest) (*trainmeterv1.DataloaderHistoryResponse, error) {
	if req.GetRunId() == "" {
		return nil, status.Error(codes.InvalidArgument, "run_id is empty")
	}
	if _, err := s.st.GetRun(req.GetRunId()); err != nil {
		if errors.Is(err, storage.ErrNotFound) {
			return nil, status.Errorf(codes.NotFound, "run %q not found", req.GetRunId())
		}
		return nil, storeErr(err)
	}
	h, err := dataloadersvc.History(s.st, req.GetRunId())
	if err != nil {
		return nil, storeErr(err)
	}
	return h, nil
}

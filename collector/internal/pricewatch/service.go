package pricewatch

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/pkg/prices"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Service is the PriceService gRPC implementation.
type Service struct {
	trainmeterv1.UnimplementedPriceServiceServer
	w *Watcher
}

// NewService serves w.
func NewService(w *Watcher) *Service { return &Service{w: w} }

func offerProto(o prices.Offer, score float64) *trainmeterv1.PriceOffer {
	return &trainmeterv1.PriceOffer{
		Id: o.ID, Provider: o.Provider, GpuName: o.GPUName, NumGpus: uint32(o.NumGPUs), GpuRamGb: o.GPURAMGB,
		UsdPerHour: o.USDPerHour, UsdPerGpuHour: o.PerGPUHour(), Reliability: o.Reliability, DlperfPerUsd: o.DLPerfPerUSD,
		Location: o.Location, InetDownMbps: o.InetDownMbps, Score: score,
	}
}

// ListPrices implements PriceService.
func (s *Service) ListPrices(_ context.Context, req *trainmeterv1.ListPricesRequest) (*trainmeterv1.ListPricesResponse, error) {
	views, err := s.w.View(req.GetGpu(), 5)
	if err != nil {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	resp := &trainmeterv1.ListPricesResponse{Provider: s.w.Provider()}
	for _, v := range views {
		g := &trainmeterv1.GpuPrice{
			GpuName: v.GPUName, CheapestUsdPerGpuHour: v.Cheapest, MedianUsdPerGpuHour: v.Median, Offers: uint32(v.Offers),
			Fetched: timestamppb.New(v.Fetched), Cheapest: offerProto(v.CheapestOffer, 0),
		}
		for _, win := range Windows {
			t := v.Trends[win.Name]
			g.Trends = append(g.Trends, &trainmeterv1.PriceTrend{Window: win.Name, Change: t.Change, MinUsd: t.Min, MaxUsd: t.Max, MeanUsd: t.Mean, Points: uint32(t.Points)})
		}
		for _, r := range v.Recommended {
			g.Recommended = append(g.Recommended, offerProto(r.Offer, r.Score))
		}
		resp.Gpus = append(resp.Gpus, g)
	}
	return resp, nil
}

// FetchPrices implements PriceService.
func (s *Service) FetchPrices(ctx context.Context, _ *trainmeterv1.FetchPricesRequest) (*trainmeterv1.FetchPricesResponse, error) {
	res, err := s.w.Fetch(ctx)
	if errors.Is(err, ErrNoProvider) {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "price fetch from %s: %v", s.w.Provider(), err)
	}
	return &trainmeterv1.FetchPricesResponse{Offers: uint32(res.Offers), GpuModels: uint32(res.Models), Alerts: uint32(res.Alerts)}, nil
}

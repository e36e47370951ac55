package pricewatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/prices"
	"github.com/trainmeter/trainmeter/collector/internal/rpcerr"
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
		Location: o.Location, InetDownMbps: o.InetDownMbps, Score: score, Spot: o.Spot,
	}
}

func statusProto(p ProviderResult) *trainmeterv1.PriceProviderStatus {
	s := &trainmeterv1.PriceProviderStatus{Provider: p.Provider, Offers: uint32(p.Offers), Skipped: uint32(p.Skipped), Error: p.Err, Imported: p.Imported,
		Stale: p.Stale, AgeS: p.Age.Seconds()}
	if !p.Fetched.IsZero() {
		s.Fetched = timestamppb.New(p.Fetched)
	}
	if !p.ErrTime.IsZero() {
		s.ErrorTime = timestamppb.New(p.ErrTime)
	}
	return s
}

func (s *Service) ListPrices(_ context.Context, req *trainmeterv1.ListPricesRequest) (*trainmeterv1.ListPricesResponse, error) {
	views, err := s.w.View(req.GetGpu(), req.GetProvider(), 5)
	if err != nil {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	resp := &trainmeterv1.ListPricesResponse{Provider: s.w.Provider(),
		MaxOfferAgeS: s.w.MaxOfferAge().Seconds(), Warning: s.w.StaleWarning()}
	for _, st := range s.w.Status() {
		resp.Providers = append(resp.Providers, statusProto(st))
	}
	for _, v := range views {
		g := &trainmeterv1.GpuPrice{
			GpuName: v.GPUName, CheapestUsdPerGpuHour: v.Cheapest, MedianUsdPerGpuHour: v.Median, Offers: uint32(v.Offers),
			Fetched:                   timestamppb.New(v.Fetched),
			CheapestSpotUsdPerGpuHour: v.CheapestSpot, MedianSpotUsdPerGpuHour: v.MedianSpot, SpotOffers: uint32(v.SpotOffers),
		}
		if v.Offers > 0 {
			g.Cheapest = offerProto(v.CheapestOffer, 0)
		}
		if v.SpotOffers > 0 {
			g.CheapestSpot = offerProto(v.CheapestSpotOffer, 0)
		}
		g.Providers = slices.Sorted(maps.Keys(v.Providers))
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

func (s *Service) FetchPrices(ctx context.Context, _ *trainmeterv1.FetchPricesRequest) (*trainmeterv1.FetchPricesResponse, error) {
	res, err := s.w.Fetch(ctx)
	if errors.Is(err, ErrNoProvider) {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	if err != nil {
		// Marked: the CLI must not say it cannot reach the collector.
		return nil, rpcerr.UpstreamUnavailable(fmt.Sprintf("price fetch from %s: %v", s.w.Provider(), err))
	}
	resp := &trainmeterv1.FetchPricesResponse{Offers: uint32(res.Offers), GpuModels: uint32(res.Models), Alerts: uint32(res.Alerts)}
	for _, p := range res.Providers {
		p.Imported, p.ErrTime = false, time.Time{} // ListPrices's status says these
		resp.Providers = append(resp.Providers, statusProto(p))
	}
	return resp, nil
}

// MaxImportOffers bounds one import.
const MaxImportOffers = 100_000

func (s *Service) ImportPrices(ctx context.Context, req *trainmeterv1.ImportPricesRequest) (*trainmeterv1.ImportPricesResponse, error) {
	if len(req.GetOffers()) == 0 || len(req.GetOffers()) > MaxImportOffers {
		return nil, status.Errorf(codes.InvalidArgument, "import 1..%d offers, got %d", MaxImportOffers, len(req.GetOffers()))
	}
	offers := make([]prices.Offer, 0, len(req.GetOffers()))
	for i, o := range req.GetOffers() {
		off := prices.Offer{
			ID: o.GetId(), Provider: o.GetProvider(), GPUName: o.GetGpuName(), NumGPUs: int(o.GetNumGpus()), GPURAMGB: o.GetGpuRamGb(),
			USDPerHour: o.GetUsdPerHour(), Reliability: o.Reliability, DLPerfPerUSD: o.GetDlperfPerUsd(),
			Location: o.GetLocation(), InetDownMbps: o.GetInetDownMbps(), Spot: o.GetSpot(),
		}
		off.Provider = cmp.Or(off.Provider, "import")
		if err := off.Validate(); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "offer %d: %v", i+1, err)
		}
		offers = append(offers, off)
	}
	res, err := s.w.Import(ctx, offers)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &trainmeterv1.ImportPricesResponse{Offers: uint32(res.Offers), GpuModels: uint32(res.Models), Alerts: uint32(res.Alerts)}, nil
}

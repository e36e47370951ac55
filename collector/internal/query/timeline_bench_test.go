package query_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/loadgen"
	"github.com/trainmeter/trainmeter/collector/internal/query"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// BenchmarkTimeline24h answers the timeline of a 24 h run of 8 GPUs on one
// node: 86,400 run windows and 86,400 GPU windows of 8 GPUs stored in a
// real BadgerDB, as an agent sends them (one batch a second), downsampled
// to 2,000 points per series. docs/benchmarks.md has the figures.
func BenchmarkTimeline24h(b *testing.B) {
	const windows = 24 * 3600
	st, err := store.Open(b.TempDir(), store.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	t0 := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	if err := loadgen.StoreRun(st, "day", t0, windows, 8, 24); err != nil {
		b.Fatal(err)
	}
	srv := query.New(st, nil, aggregate.Pricing{})
	req := &trainmeterv1.TimelineRequest{RunId: "day"}
	b.ResetTimer()
	var resp *trainmeterv1.TimelineResponse
	for b.Loop() {
		if resp, err = srv.Timeline(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	points := 0
	for _, s := range resp.GetSeries() {
		if s.GetSourcePoints() != windows || len(s.GetValues()) > query.DefaultTimelinePoints {
			b.Fatalf("series %s: %d points from %d, want ≤ %d from %d", s.GetName(), len(s.GetValues()), s.GetSourcePoints(), query.DefaultTimelinePoints, windows)
		}
		points += len(s.GetValues())
	}
	b.ReportMetric(float64(len(resp.GetSeries())), "series")
	b.ReportMetric(float64(points), "points")
}

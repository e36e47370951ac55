package console_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/loadgen"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

// seedStore fills a BadgerDB in dir as agents would have (store.ApplyBatch
// is what ingest calls), from several goroutines at once so that the setup
// takes seconds; each goroutine is one node with its own sequence. The
// windows are booked at the pricing serve's collector has, as that
// collector's ingest would have booked them.
func seedStore(b *testing.B, dir string, workers, perWorker int, batch func(w, i int) *trainmeterv1.Batch) {
	b.Helper()
	st, err := store.Open(dir, store.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	st.SetPricer(benchConfig.Pricing())
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := range perWorker {
				if _, err := st.ApplyBatch(fmt.Sprintf("node-%02d", w), "boot", batch(w, i)); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		b.Fatal(err)
	}
}

// benchConfig is the benchmarks' collector: $2 per GPU-hour.
var benchConfig = server.Config{GPUPricePerHour: 2}

// serve starts a real collector on dir with its console and returns the
// console's base URL.
func serve(b *testing.B, dir string, clk clock.Clock) string {
	b.Helper()
	return "http://" + start(b, dir, clk).ConsoleAddr().String()
}

// start starts a real collector on dir with its console.
func start(b *testing.B, dir string, clk clock.Clock) *server.Server {
	b.Helper()
	cfg := benchConfig
	cfg.Listen, cfg.UIListen, cfg.DataDir, cfg.Clock = "127.0.0.1:0", "127.0.0.1:0", dir, clk
	srv := server.New(cfg, slog.New(slog.DiscardHandler))
	if err := srv.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return srv
}

// cpuTime is the CPU time (user + system) of this process: the collector
// and the client together. On a shared machine the wall time of a request
// grows with the neighbours' load; its CPU time much less.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func fetch(b *testing.B, url string) int {
	resp, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	return int(n)
}

// benchPage is a page a benchmark asks for: its metrics are named by name.
type benchPage struct{ name, path string }

// measurePages asks for every page in turn each iteration, as a browser
// does, and reports each one's size (NAME-bytes) and wall time (NAME-ms),
// and the CPU time of all of them (cpu-ms/op, the collector's and the
// client's: the figure a busy neighbour moves least).
func measurePages(b *testing.B, base string, pages ...benchPage) {
	size := make([]int, len(pages))
	took := make([]time.Duration, len(pages))
	cpu0 := cpuTime(b)
	for b.Loop() {
		for i, p := range pages {
			t0 := time.Now()
			size[i] = fetch(b, base+p.path)
			took[i] += time.Since(t0)
		}
	}
	for i, p := range pages {
		b.ReportMetric(float64(size[i]), p.name+"-bytes")
		b.ReportMetric(float64(took[i].Milliseconds())/float64(b.N), p.name+"-ms")
	}
	b.ReportMetric(float64((cpuTime(b)-cpu0).Milliseconds())/float64(b.N), "cpu-ms/op")
}

// BenchmarkRunsPage: the Runs page of a collector with 10,000 runs (8 GPUs
// each; 9,980 ended, 20 live with a power sparkline each), over HTTP on
// loopback as a browser asks for it: the page, and the table body its
// script fetches every second (ns/op is both; page-ms and rows-ms each).
// docs/benchmarks.md has the figures.
func BenchmarkRunsPage(b *testing.B) {
	const runs, live, workers = 10000, 20, 10
	dir := b.TempDir()
	now := time.Now().Truncate(time.Second)
	seedStore(b, dir, workers, runs/workers, func(w, i int) *trainmeterv1.Batch {
		n := w*runs/workers + i
		end := now.Add(-time.Duration(runs-n) * time.Second)
		batch := loadgen.MakeBatch(uint64(i+1), end, time.Second, fmt.Sprintf("run-%05d", n), 8, true)
		if n < runs-live {
			batch.RunEvents = append(batch.RunEvents, &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunEnd{RunEnd: &trainmeterv1.RunEnd{
				RunId: batch.RunWindows[0].RunId, Time: timestamppb.New(end), EndStatus: "ok"}}})
		}
		return batch
	})
	measurePages(b, serve(b, dir, clock.NewFake(now)), benchPage{"page", "/runs"}, benchPage{"rows", "/runs/rows"})
}

// BenchmarkRunPage24h: the Run page of a 24 h run of 8 GPUs on one node
// (86,400 run windows and 86,400 GPU windows of 8 GPUs, one batch a
// second), over HTTP on loopback: the page and the timeline JSON its
// charts draw (every series, at most 2,000 points each); ns/op is both,
// page-ms and timeline-ms each.
func BenchmarkRunPage24h(b *testing.B) {
	dir := b.TempDir()
	st, err := store.Open(dir, store.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	if err := loadgen.StoreRun(st, "day", time.Now().Add(-25*time.Hour).Truncate(time.Second), 24*3600, 8, 24); err != nil {
		b.Fatal(err)
	}
	if err := st.Close(); err != nil {
		b.Fatal(err)
	}
	measurePages(b, serve(b, dir, nil), benchPage{"page", "/runs/day"}, benchPage{"timeline", "/api/runs/day/timeline"})
}

// BenchmarkFleetPages: every page but the Runs page (BenchmarkRunsPage)
// of a collector with 10,000 runs (8 GPUs each, 4 teams; 9,980 ended, 20
// live) spread over the last 30 days, with a monthly budget per team, over
// HTTP on loopback. Sub-benchmarks, each page on its own (its own CPU
// time):
//
//   - home: `/` (the nodes now, the month's and the last 24 h's spend by
//     team, budgets, live and costliest runs, alerts);
//   - usage: `/usage?by=label:team&since=30d` (the rows, node totals and
//     the per-day chart: one Usage call, the days in one per_day call);
//   - run, run-summary, run-timeline: an ended run's page, the figures its
//     script fetches while a run is live, and its charts' data;
//   - compare: the empty form; compare-runs: 8 runs named, grouped by
//     team; compare-model: a model's ended runs grouped by team (every
//     run of the store is of that model: the most a model can have);
//   - budgets, prices, recommendations, nodes.
//
// docs/benchmarks.md has the figures.
func BenchmarkFleetPages(b *testing.B) {
	const runs, live, workers = 10000, 20, 10
	dir := b.TempDir()
	now := time.Now().Truncate(time.Second)
	spread := 30 * 24 * time.Hour / runs
	seedStore(b, dir, workers, runs/workers, func(w, i int) *trainmeterv1.Batch {
		n := w*runs/workers + i
		end := now.Add(-time.Duration(runs-n) * spread)
		batch := loadgen.MakeBatch(uint64(i+1), end, time.Second, fmt.Sprintf("run-%05d", n), 8, true)
		for _, ev := range batch.RunEvents {
			if rs := ev.GetRunStart(); rs != nil {
				rs.Labels = map[string]string{"team": fmt.Sprintf("team-%d", n%4)}
			}
		}
		if n < runs-live {
			batch.RunEvents = append(batch.RunEvents, &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunEnd{RunEnd: &trainmeterv1.RunEnd{
				RunId: batch.RunWindows[0].RunId, Time: timestamppb.New(end), EndStatus: "ok"}}})
		}
		return batch
	})
	srv := start(b, dir, clock.NewFake(now))
	base := "http://" + srv.ConsoleAddr().String()
	// A monthly budget per team, one of them spent: each team's runs cost
	// about $11 a month ($2 per GPU-hour, 8 GPU-seconds a run).
	budgets := trainmeterv1.NewBudgetServiceClient(tu.Dial(b, srv.Addr().String()))
	for t, limit := range []float64{5, 20, 50, 100} {
		if _, err := budgets.SetBudget(context.Background(), &trainmeterv1.SetBudgetRequest{Scope: fmt.Sprintf("team:team-%d", t), LimitUsd: limit}); err != nil {
			b.Fatal(err)
		}
	}
	// Runs of each team, ended, spread over the month.
	var named []string
	for _, n := range []int{1000, 1001, 1002, 1003, 5000, 5001, 5002, 5003} {
		named = append(named, fmt.Sprintf("run-%05d", n))
	}
	for _, p := range []benchPage{
		{"home", "/"},
		{"usage", "/usage?by=label:team&since=30d"},
		{"run", "/runs/run-05000"},
		{"run-summary", "/runs/run-05000/summary"},
		{"run-timeline", "/api/runs/run-05000/timeline"},
		{"compare", "/compare"},
		{"compare-runs", "/compare?" + url.Values{"runs": {strings.Join(named, " ")}, "by": {"label:team"}}.Encode()},
		{"compare-model", "/compare?model=llama-8b&by=label:team"},
		{"budgets", "/budgets"},
		{"prices", "/prices"},
		{"recommendations", "/recommendations"},
		{"nodes", "/nodes"},
	} {
		b.Run(p.name, func(b *testing.B) { measurePages(b, base, p) })
	}
}

package console_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/loadgen"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// seedStore fills a BadgerDB in dir as agents would have (store.ApplyBatch
// is what ingest calls), from several goroutines at once so that the setup
// takes seconds; each goroutine is one node with its own sequence.
func seedStore(b *testing.B, dir string, workers, perWorker int, batch func(w, i int) *trainmeterv1.Batch) {
	b.Helper()
	st, err := store.Open(dir, store.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
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

// serve starts a real collector on dir with its console and returns the
// console's base URL.
func serve(b *testing.B, dir string, now func() time.Time) string {
	b.Helper()
	srv := server.New(server.Config{Listen: "127.0.0.1:0", UIListen: "127.0.0.1:0", DataDir: dir, GPUPricePerHour: 2, Now: now}, slog.New(slog.DiscardHandler))
	if err := srv.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return "http://" + srv.ConsoleAddr().String()
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
	base := serve(b, dir, func() time.Time { return now })
	var page, rows int
	var pageT, rowsT time.Duration
	cpu0 := cpuTime(b)
	for b.Loop() {
		t0 := time.Now()
		page = fetch(b, base+"/runs")
		t1 := time.Now()
		rows = fetch(b, base+"/runs/rows")
		pageT, rowsT = pageT+t1.Sub(t0), rowsT+time.Since(t1)
	}
	b.ReportMetric(float64(page), "page-bytes")
	b.ReportMetric(float64(rows), "rows-bytes")
	b.ReportMetric(float64(pageT.Milliseconds())/float64(b.N), "page-ms")
	b.ReportMetric(float64(rowsT.Milliseconds())/float64(b.N), "rows-ms")
	b.ReportMetric(float64((cpuTime(b)-cpu0).Milliseconds())/float64(b.N), "cpu-ms/op")
}

// BenchmarkRunPage24h: the Run page of a 24 h run of 8 GPUs on one node
// (86,400 run windows and 86,400 GPU windows of 8 GPUs, one batch a
// second), over HTTP on loopback: the page and the timeline JSON its
// charts draw (every series, at most 2,000 points each); ns/op is both,
// page-ms and timeline-ms each.
func BenchmarkRunPage24h(b *testing.B) {
	const windows, workers = 24 * 3600, 24
	dir := b.TempDir()
	t0 := time.Now().Add(-25 * time.Hour).Truncate(time.Second)
	st, err := store.Open(dir, store.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	// One node, one sequence: batches of the same node from several
	// goroutines, each its own hours (as BenchmarkTimeline24h).
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for s := w * windows / workers; s < (w+1)*windows/workers; s++ {
				batch := loadgen.MakeBatch(uint64(s+1), t0.Add(time.Duration(s+1)*time.Second), time.Second, "day", 8, s == 0)
				if _, err := st.ApplyBatch("node-1", "boot", batch); err != nil {
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
	base := serve(b, dir, nil)
	var page, data int
	var pageT, dataT time.Duration
	cpu0 := cpuTime(b)
	for b.Loop() {
		t0 := time.Now()
		page = fetch(b, base+"/runs/day")
		t1 := time.Now()
		data = fetch(b, base+"/api/runs/day/timeline")
		pageT, dataT = pageT+t1.Sub(t0), dataT+time.Since(t1)
	}
	b.ReportMetric(float64(page), "page-bytes")
	b.ReportMetric(float64(data), "timeline-bytes")
	b.ReportMetric(float64(pageT.Milliseconds())/float64(b.N), "page-ms")
	b.ReportMetric(float64(dataT.Milliseconds())/float64(b.N), "timeline-ms")
	b.ReportMetric(float64((cpuTime(b)-cpu0).Milliseconds())/float64(b.N), "cpu-ms/op")
}

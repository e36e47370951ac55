package cli

import (
	"bytes"
	"context"
	"encoding/csv"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/trainmeter/trainmeter/collector/internal/report"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/testkit"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.GoleakOptions()...)
}

// liveCollector starts an in-process collector with one finished run.
func liveCollector(t *testing.T) string {
	t.Helper()
	return liveCollectorWith(t, server.Config{Clock: tu.Clock()})
}

// liveCollectorWith is liveCollector with cfg's clock (which must stand
// within ingest's time bounds of tu.T0) and budget settings.
func liveCollectorWith(t *testing.T, cfg server.Config) string {
	t.Helper()
	cfg.Listen, cfg.DataDir, cfg.GPUPricePerHour = "127.0.0.1:0", t.TempDir(), 2
	srv := server.New(cfg,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	addr := srv.Addr().String()
	a := tu.Connect(t, tu.Dial(t, addr), "gpu-box-1", "boot")
	a.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("run-a", 0, 2048, 400)}, tu.Start("run-a", 0, "llama-3-8b")))
	a.MustAck(tu.Batch(2, 1, []*trainmeterv1.RunWindow{tu.Window("run-a", 1, 2048, 400)}, tu.End("run-a", 2)))
	a.MustAck(tu.Batch(3, 3, []*trainmeterv1.RunWindow{tu.Window("run-b", 3, 10, 1)}, tu.Start("run-b", 3, "tiny")))
	return addr
}

func run(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	cmd := NewRootCommand(func(k string) string { return env[k] })
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(t.Context())
	return out.String(), err
}

func TestExportCSV(t *testing.T) {
	addr := liveCollector(t)
	out, err := run(t, nil, "export", "csv", "--collector", addr, "--run", "run-a")
	if err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("want header + 1 row, got %d rows:\n%s", len(recs), out)
	}
	if strings.Join(recs[0], ",") != strings.Join(report.Header(), ",") {
		t.Fatalf("header = %v", recs[0])
	}
	row := map[string]string{}
	for i, c := range recs[0] {
		row[c] = recs[1][i]
	}
	for col, want := range map[string]string{
		"run_id": "run-a", "tokens_processed": "4096", "wall_s": "2", "warmup_s": "0", "energy_J": "800",
		"avg_power_W": "400", "peak_power_W": "480", "tok_per_s": "2048", "J_per_token": "0.1953125",
		"E10k_J": "1953.125", "vram_peak_MB": "40000", "vram_avg_MB": "39000", "model": "llama-3-8b",
		"batch_size": "8", "seed": "", "gpus": "1", "nodes": "1", "gpu_name": "Sim GPU",
		"energy_method": "counter", "cost_usd": "0.001111", "energy_cost_usd": "", "co2_kg": "", "status": "ended",
		"start_time": "2025-03-01T12:00:00Z", "end_time": "2025-03-01T12:00:02Z",
	} {
		if row[col] != want {
			t.Errorf("%s = %q, want %q", col, row[col], want)
		}
	}

	// The address from the environment, all runs, into a file.
	file := filepath.Join(t.TempDir(), "runs.csv")
	if _, err := run(t, map[string]string{EnvCollector: addr}, "export", "csv", "--out", file); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n != 3 {
		t.Fatalf("file has %d lines:\n%s", n, b)
	}

	if _, err := run(t, nil, "export", "csv", "--collector", addr, "--run", "nope"); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("unknown --run: %v", err)
	}
}

func TestRunsReportNodes(t *testing.T) {
	addr := liveCollector(t)
	out, err := run(t, nil, "runs", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "RUN ") || !strings.Contains(out, "run-a") || !strings.Contains(out, "run-b") || !strings.Contains(out, "running") {
		t.Fatalf("runs:\n%s", out)
	}

	out, err = run(t, nil, "report", "run-a", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"run run-a (ended)", "llama-3-8b", "800.0 J (counter)", "0.195312 J"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}

	_, err = run(t, nil, "report", "no-such-run", "--collector", addr)
	if err == nil || !strings.Contains(err.Error(), `run "no-such-run" not found`) {
		t.Fatalf("unknown run: %v", err)
	}

	out, err = run(t, nil, "nodes", "--collector", addr)
	if err != nil || !strings.Contains(out, "gpu-box-1") || !strings.Contains(out, "connected") {
		t.Fatalf("nodes: %v\n%s", err, out)
	}
}

func TestUnreachableCollector(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there now
	_, err = run(t, nil, "runs", "--collector", addr, "--timeout", "2s")
	if err == nil || !strings.Contains(err.Error(), "cannot reach the collector") && !strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("unreachable: %v", err)
	}
}

func TestServeFlags(t *testing.T) {
	_, err := run(t, nil, "serve", "--log-level", "loud")
	if err == nil || !strings.Contains(err.Error(), "log level") {
		t.Fatalf("bad log level: %v", err)
	}
	_, err = run(t, nil, "serve", "--gpu-price-per-hour", "-1", "--data", t.TempDir())
	if err == nil {
		t.Fatal("negative price accepted")
	}
}

func TestServeUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cmd := NewRootCommand(func(string) string { return "" })
	var out testkit.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"serve", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--log-level", "info"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "listening on 127.0.0.1:") {
		if time.Now().After(deadline) {
			t.Fatalf("no 'listening on' log:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel() // what SIGINT/SIGTERM do in Main
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "collector stopped") {
		t.Fatalf("no clean stop:\n%s", out.String())
	}
}

package server_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

type sinkFunc func(alert.Alert)

func (f sinkFunc) Alert(_ context.Context, a alert.Alert) { f(a) }

// TestBudgetServiceWired: the collector serves BudgetService over gRPC, its
// budget manager sees the batches ingest applies, and alerts reach the
// configured sinks.
func TestBudgetServiceWired(t *testing.T) {
	var mu sync.Mutex
	var got []alert.Alert
	clk := tu.Clock() // the budget loop ticks as the test advances it
	srv := start(t, server.Config{Clock: clk, GPUPricePerHour: 3600, Budget: server.BudgetConfig{EvalInterval: 10 * time.Millisecond},
		Alerts: server.AlertConfig{Sinks: []alert.Sink{sinkFunc(func(a alert.Alert) { mu.Lock(); got = append(got, a); mu.Unlock() })}},
	})
	conn := tu.Dial(t, srv.Addr().String())
	bs := trainmeterv1.NewBudgetServiceClient(conn)
	if _, err := bs.SetBudget(t.Context(), &trainmeterv1.SetBudgetRequest{Scope: "model:llama", LimitUsd: 1.5}); err != nil {
		t.Fatal(err)
	}
	if _, err := bs.SetBudget(t.Context(), &trainmeterv1.SetBudgetRequest{Scope: "", LimitUsd: 1}); err == nil {
		t.Error("empty scope accepted")
	}
	a := tu.Connect(t, conn, "node-1", "boot")
	a.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 10, 1)}, tu.Start("r", 0, "llama")))
	a.MustAck(tu.Batch(2, 1, []*trainmeterv1.RunWindow{tu.Window("r", 1, 10, 1)}))
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n == 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d alerts reached the sink, want 8 ($2 of $1.50)", n)
		}
		clk.Advance(10 * time.Millisecond)
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := bs.ListBudgets(t.Context(), &trainmeterv1.ListBudgetsRequest{})
	if err != nil || len(resp.GetBudgets()) != 1 || resp.GetBudgets()[0].GetSpentUsd() != 2 {
		t.Fatalf("budgets %v %v", resp, err)
	}
	if u := srv.Budgets().BudgetUse(); len(u) != 1 || u[0].Ratio != 2.0/1.5 {
		t.Errorf("budget use %+v", u)
	}
	if _, ok := srv.Prices().CurrentPrice("any"); ok {
		t.Error("a price without any fetch")
	}
}

func TestBudgetConfigValidate(t *testing.T) {
	for _, ok := range []string{"", "vastai", "vastai,lambda,runpod,azure", " azure , vastai "} {
		c := server.Config{Listen: "127.0.0.1:0", DataDir: "d", Prices: server.PriceConfig{Provider: ok, LambdaKey: "k", RunPodKey: "k"}}
		if err := c.Validate(); err != nil {
			t.Errorf("--price-provider %q: %v", ok, err)
		}
	}
	if err := (server.PriceConfig{FetchInterval: time.Hour, MaxOfferAge: 2 * time.Hour}).Validate(); err != nil {
		t.Errorf("a max offer age of two fetch intervals: %v", err)
	}
	for _, c := range []server.Config{
		{Prices: server.PriceConfig{Provider: "aws"}}, {Prices: server.PriceConfig{Provider: "file"}},
		{Prices: server.PriceConfig{Provider: "vastai,aws"}}, {Prices: server.PriceConfig{Provider: "vastai,vastai"}},
		{Prices: server.PriceConfig{Provider: "vastai,lambda"}}, {Prices: server.PriceConfig{Provider: "runpod"}},
		{Budget: server.BudgetConfig{Timezone: "Nowhere/Land"}},
		{Budget: server.BudgetConfig{EvalInterval: -time.Second}}, {Prices: server.PriceConfig{FetchInterval: -time.Second}},
		{Prices: server.PriceConfig{MaxOfferAge: -time.Second}}, {Prices: server.PriceConfig{FetchInterval: time.Hour, MaxOfferAge: time.Hour}},
		{Alerts: server.AlertConfig{Webhook: alert.WebhookConfig{URLs: []string{"not a url"}}}},
	} {
		c.Listen, c.DataDir = "127.0.0.1:0", "d"
		if err := c.Validate(); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}

// TestMissingPriceFileStopsStart: a --price-file that cannot be read stops
// the collector at start, not at the first fetch.
func TestMissingPriceFileStopsStart(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "prices.csv")
	for _, path := range []string{missing, t.TempDir()} {
		srv := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Prices: server.PriceConfig{
			Provider: "file", File: path, FetchInterval: time.Hour,
		}}, nil)
		err := srv.Start(t.Context())
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = srv.Shutdown(ctx)
			cancel()
		}
		if err == nil || !strings.Contains(err.Error(), "--price-file") || !strings.Contains(err.Error(), path) {
			t.Errorf("start with --price-file %s: %v, want an error naming the flag and the file", path, err)
		}
	}
}

// TestCatalogPricesNVMLNamedRuns: a run on "NVIDIA H100 80GB HBM3" (NVML's
// name) is priced from the collector's price catalog, which names the GPU
// "H100 SXM" (vast.ai's); a run on a GPU the catalog lacks is not priced by
// another GPU's offers.
func TestCatalogPricesNVMLNamedRuns(t *testing.T) {
	srv := start(t, server.Config{})
	conn := tu.Dial(t, srv.Addr().String())
	if _, err := trainmeterv1.NewPriceServiceClient(conn).ImportPrices(t.Context(), &trainmeterv1.ImportPricesRequest{Offers: []*trainmeterv1.PriceOffer{
		{GpuName: "H100 SXM", NumGpus: 8, UsdPerHour: 28.8},
		{GpuName: "H100 PCIE", NumGpus: 1, UsdPerHour: 1.9},
		{GpuName: "A100 SXM4", NumGpus: 1, UsdPerHour: 1.1},
	}}); err != nil {
		t.Fatal(err)
	}
	a := tu.Connect(t, conn, "node-1", "boot")
	for i, gpu := range []string{"NVIDIA H100 80GB HBM3", "NVIDIA A10G"} {
		run := []string{"h100", "a10g"}[i]
		ev := tu.Start(run, 0, "m")
		ev.GetRunStart().GpuName = gpu
		a.MustAck(tu.Batch(uint64(i+1), 0, []*trainmeterv1.RunWindow{tu.Window(run, 0, 10, 1)}, ev))
	}
	q := trainmeterv1.NewQueryServiceClient(conn)
	r, err := q.GetRun(t.Context(), &trainmeterv1.GetRunRequest{RunId: "h100"})
	if err != nil {
		t.Fatal(err)
	}
	if rep := r.GetRun(); rep.GetPriceSource() != "catalog" || rep.GetGpuPricePerHour() != 3.6 {
		t.Errorf("run on %s: price %v from %q, want $3.60 (H100 SXM) from the catalog", rep.GetGpuName(), rep.GetGpuPricePerHour(), rep.GetPriceSource())
	}
	r, err = q.GetRun(t.Context(), &trainmeterv1.GetRunRequest{RunId: "a10g"})
	if err != nil {
		t.Fatal(err)
	}
	if rep := r.GetRun(); rep.CostUsd != nil || rep.GetPriceSource() != "" {
		t.Errorf("run on %s priced at %v from %q, want no price", rep.GetGpuName(), rep.GetGpuPricePerHour(), rep.GetPriceSource())
	}
}

package cli

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func evalEvent(run string, sec, acc float64) *trainmeterv1.RunEvent {
	return &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_Eval{Eval: &trainmeterv1.Eval{
		RunId: run, Time: tu.TS(sec), Epoch: proto.Int64(1), Accuracy: proto.Float64(acc),
	}}}
}

// costCollector has four ended runs on 1 GPU at $3600/GPU-hour ($1 per
// GPU-second, energy included in the price): bert-0 (2 s, 70 %), bert-1
// (4 s, 80 %), bert-2 (1 s, no eval), gpt-0 (3 s, 50 %).
func costCollector(t *testing.T) string {
	t.Helper()
	srv := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), GPUPricePerHour: 3600, EnergyIncluded: true, Clock: tu.Clock()},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	a := tu.Connect(t, tu.Dial(t, srv.Addr().String()), "gpu-box-1", "boot")
	seq := uint64(0)
	at := 0.0
	for _, r := range []struct {
		id, model string
		secs      int
		acc       float64
	}{{"bert-0", "bert", 2, 0.70}, {"bert-1", "bert", 4, 0.80}, {"bert-2", "bert", 1, 0}, {"gpt-0", "gpt", 3, 0.5}} {
		start := at
		for i := 0; i < r.secs; i++ {
			seq++
			evs := []*trainmeterv1.RunEvent{}
			if i == 0 {
				evs = append(evs, tu.Start(r.id, start, r.model))
			}
			a.MustAck(tu.Batch(seq, at, []*trainmeterv1.RunWindow{tu.Window(r.id, at, 1000, 300)}, evs...))
			at++
		}
		seq++
		evs := []*trainmeterv1.RunEvent{tu.End(r.id, at)}
		if r.acc > 0 {
			evs = append(evs, evalEvent(r.id, at-0.5, r.acc))
		}
		a.MustAck(tu.Batch(seq, at, nil, evs...))
		at++
	}
	return srv.Addr().String()
}

func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
		t.Errorf("%s = %.12g, want %.12g", what, got, want)
	}
}

func TestSummary(t *testing.T) {
	addr := costCollector(t)
	out, err := run(t, nil, "summary", "--json", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	var s Summary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if s.Runs != 4 || s.Running != 0 || len(s.Models) != 2 {
		t.Fatalf("summary %+v", s)
	}
	near(t, "gpu_hours", s.GPUHours, 10.0/3600)
	near(t, "total", s.TotalCostUSD, 10)
	near(t, "projected", s.ProjectedCostUSD, 10)
	bert := s.Models[0]
	if bert.Model != "bert" || bert.Runs != 3 || bert.Baseline != "bert-0" || bert.Best != "bert-1" || bert.ROI == nil {
		t.Fatalf("bert %+v", bert)
	}
	near(t, "bert total", bert.TotalCostUSD, 7)
	near(t, "bert ROI", *bert.ROI, (80.0-70)/(4+1))

	out, err = run(t, nil, "summary", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"runs: 4 (0 running)", "total cost: $10.00", "bert", "gpt", "ROI"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary table lacks %q:\n%s", want, out)
		}
	}
}

func TestModel(t *testing.T) {
	addr := costCollector(t)
	out, err := run(t, nil, "model", "bert", "--json", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	var v ModelView
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(v.Runs) != 3 || v.Runs[0].RunID != "bert-0" || v.Runs[2].RunID != "bert-2" || len(v.Comparison) != 2 {
		t.Fatalf("model view %+v", v)
	}
	b1 := v.Runs[1]
	if b1.EfficiencyScore == nil || b1.ROI == nil || b1.USDPerAccuracyPoint == nil {
		t.Fatalf("bert-1 %+v", b1)
	}
	near(t, "bert-1 total", b1.TotalCostUSD, 4)
	near(t, "bert-1 efficiency", *b1.EfficiencyScore, (80.0/4)/(70.0/2))
	near(t, "bert-1 ROI", *b1.ROI, 10.0/4)
	near(t, "bert-1 $/point", *b1.USDPerAccuracyPoint, 4.0/80)
	near(t, "bert-0 efficiency", *v.Runs[0].EfficiencyScore, 1)
	if v.Runs[2].AccuracyPoints != nil || v.Runs[2].ROI != nil {
		t.Errorf("bert-2 has no eval: %+v", v.Runs[2])
	}

	out, err = run(t, nil, "model", "bert", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"model bert: 3 runs", "baseline bert-0 (70.00 points), best bert-1 (80.00 points", "bert-1", "compared with all models", "gpt"} {
		if !strings.Contains(out, want) {
			t.Errorf("model table lacks %q:\n%s", want, out)
		}
	}
	if _, err := run(t, nil, "model", "llama", "--collector", addr); err == nil || !strings.Contains(err.Error(), `no runs of model "llama"`) || !strings.Contains(err.Error(), `"bert"`) {
		t.Errorf("unknown model: %v", err)
	}
}

func TestReportJSON(t *testing.T) {
	addr := costCollector(t)
	out, err := run(t, nil, "report", "bert-1", "--json", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	var r map[string]any
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for k, want := range map[string]any{
		"run_id": "bert-1", "total_cost_usd": 4.0, "energy_included": true, "price_source": "flag",
		"accuracy_points": 80.0, "usd_per_accuracy_point": 0.05, "efficiency_score": (80.0 / 4) / (70.0 / 2),
		"energy_cost_usd": 0.0, "ended": true, "usd_per_epoch": 4.0, "epochs_done": 1.0,
	} {
		if got, ok := r[k]; !ok || (got != want && !(isFloat(got) && isFloat(want) && math.Abs(got.(float64)-want.(float64)) < 1e-9)) {
			t.Errorf("%s = %v, want %v", k, got, want)
		}
	}
	// Unknown figures are null, not 0, and present: every report has the
	// same keys.
	for _, k := range []string{"mfu", "flops_total", "usd_per_sample"} {
		if v, ok := r[k]; !ok || v != nil {
			t.Errorf("%s = %v (present %v), want null", k, v, ok)
		}
	}
	if _, err := run(t, nil, "report", "nope", "--json", "--collector", addr); err == nil {
		t.Error("report of an unknown run: no error")
	}
}

func isFloat(v any) bool { _, ok := v.(float64); return ok }

func TestServeCostFlagsAreValidated(t *testing.T) {
	badOwned := filepath.Join(t.TempDir(), "owned.yaml")
	if err := os.WriteFile(badOwned, []byte("gpus: [{model: H100, purchase_usd: 100, lifetime_years: 3, residual_usd: 200}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tariff", "/nonexistent.yaml"}, "tariff"},
		{[]string{"--priority-multiplier", "high"}, "--priority-multiplier"},
		{[]string{"--node-gpu-price", "n1=-2"}, "--node-gpu-price"},
		{[]string{"--energy-included", "--energy-price-kwh", "0.2"}, "included"},
		{[]string{"--owned-hardware", "/nonexistent.yaml"}, "--owned-hardware"},
		{[]string{"--owned-hardware", badOwned}, "residual_usd 200 must be below purchase_usd 100"},
		{[]string{"--pue", "0.7"}, "pue must be a finite number >= 1"},
	} {
		_, err := run(t, nil, append([]string{"serve", "--listen", "127.0.0.1:0", "--data", t.TempDir()}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("serve %v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}

// fixedCatalog is a one-model price catalog, as the price store provides.
type fixedCatalog struct {
	model string
	usd   float64
}

func (c fixedCatalog) CurrentPrice(gpu string) (float64, bool) {
	return c.usd, strings.Contains(gpu, c.model)
}

func TestCatalogPriceReachesTheReport(t *testing.T) {
	srv := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), GPUPricePerHour: 1, Clock: tu.Clock(),
		PriceCatalog: fixedCatalog{"Sim GPU", 7200}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	a := tu.Connect(t, tu.Dial(t, srv.Addr().String()), "gpu-box-1", "boot")
	a.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 100, 10)}, tu.Start("r", 0, "m")))
	out, err := run(t, nil, "report", "r", "--json", "--collector", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Source  string  `json:"price_source"`
		Price   float64 `json:"gpu_price_per_hour"`
		CostUSD float64 `json:"cost_usd"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.Source != "catalog" || r.Price != 7200 {
		t.Errorf("source %q price %v, want the catalog's 7200", r.Source, r.Price)
	}
	near(t, "cost_usd (1 GPU-second at $7200/h)", r.CostUSD, 2)
}

// Without a configured catalog the collector prices GPUs from its own price
// history: a price list imported through the real CLI prices a run whose
// run_start and node have no price.
func TestImportedPriceListIsTheCatalog(t *testing.T) {
	srv := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Clock: tu.Clock()},
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
	list := filepath.Join(t.TempDir(), "prices.csv")
	if err := os.WriteFile(list, []byte("gpu_name,num_gpus,dph_total,reliability\nSim GPU,2,7200,0.99\nSim GPU,1,9000,0.9\nOther GPU,1,1,1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, nil, "prices", "import", list, "--collector", addr); err != nil {
		t.Fatalf("prices import: %v\n%s", err, out)
	}
	a := tu.Connect(t, tu.Dial(t, addr), "gpu-box-1", "boot")
	a.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 100, 10)}, tu.Start("r", 0, "m")))
	out, err := run(t, nil, "report", "r", "--json", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Source  string  `json:"price_source"`
		Price   float64 `json:"gpu_price_per_hour"`
		CostUSD float64 `json:"cost_usd"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	// The cheapest offer per GPU: 7200/2 = $3600 per GPU-hour.
	if r.Source != "catalog" || r.Price != 3600 {
		t.Fatalf("source %q price %v, want the imported list's cheapest, 3600\n%s", r.Source, r.Price, out)
	}
	near(t, "cost_usd (1 GPU-second at $3600/h)", r.CostUSD, 1)
}

// TestPricesWithoutProviderSuggestsImport: `prices` on a collector with no
// price provider points at what works there (`prices import`, or serve
// --price-provider), not at `prices fetch`, which fails without one.
func TestPricesWithoutProviderSuggestsImport(t *testing.T) {
	srv := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Clock: tu.Clock()},
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
	out, err := run(t, nil, "prices", "--collector", addr)
	if err != nil {
		t.Fatalf("prices: %v\n%s", err, out)
	}
	if strings.Contains(out, "prices fetch") || !strings.Contains(out, "trainmeter prices import FILE") || !strings.Contains(out, "--price-provider") {
		t.Errorf("prices without a provider says:\n%s\nwant a pointer to prices import and --price-provider, not prices fetch", out)
	}
	if _, err := run(t, nil, "prices", "fetch", "--collector", addr); err == nil {
		t.Error("prices fetch without a provider succeeded; the hint above relies on it failing")
	}
}

// TestImportedOfferWithoutReliability: an imported offer with no
// reliability has none (null in --json, "-" in the table) and is not
// ranked as an unreliable one: cheaper than an offer of reliability 0.5, it
// is recommended first.
func TestImportedOfferWithoutReliability(t *testing.T) {
	srv := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Clock: tu.Clock()},
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
	list := filepath.Join(t.TempDir(), "prices.csv")
	if err := os.WriteFile(list, []byte("id,gpu_name,num_gpus,dph_total,reliability\nnorel,Sim GPU,1,1.00,\nhalf,Sim GPU,1,1.20,0.5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, nil, "prices", "import", list, "--collector", addr); err != nil {
		t.Fatalf("prices import: %v\n%s", err, out)
	}
	out, err := run(t, nil, "prices", "--gpu", "Sim GPU", "--json", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	var resp struct {
		Gpus []struct {
			Recommended []map[string]any `json:"recommended"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatal(err)
	}
	if len(resp.Gpus) != 1 || len(resp.Gpus[0].Recommended) != 2 {
		t.Fatalf("prices --json: %s", out)
	}
	first, second := resp.Gpus[0].Recommended[0], resp.Gpus[0].Recommended[1]
	if first["id"] != "norel" || second["id"] != "half" {
		t.Errorf("recommended %v then %v, want norel (cheaper, reliability unknown) then half", first["id"], second["id"])
	}
	if v := first["reliability"]; v != nil {
		t.Errorf("norel's reliability is %v in --json, want null", v)
	}
	if second["reliability"] != 0.5 {
		t.Errorf("half's reliability %v, want 0.5", second["reliability"])
	}
	text, err := run(t, nil, "prices", "--gpu", "Sim GPU", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) > 7 && f[1] == "norel" && f[7] != "-" {
			t.Errorf("norel's RELIABILITY column shows %q, want -:\n%s", f[7], text)
		}
	}
}

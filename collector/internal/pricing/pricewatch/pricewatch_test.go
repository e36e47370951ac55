package pricewatch

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/prices"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/clock"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.GoleakOptions()...)
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func openStore(t *testing.T, dir string) *store.Store {
	t.Helper()
	st, err := store.Open(dir, store.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func fixture(t *testing.T) []prices.Offer {
	t.Helper()
	f, err := os.Open("../prices/testdata/vastai_offers.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	offers, _, err := prices.ParseVastAIOffers(f, "vastai")
	if err != nil {
		t.Fatal(err)
	}
	return offers
}

// scaled returns the offers with RTX 4090 prices times f.
func scaled(offers []prices.Offer, f float64) []prices.Offer {
	out := append([]prices.Offer(nil), offers...)
	for i := range out {
		if out[i].GPUName == "RTX 4090" {
			out[i].USDPerHour *= f
		}
	}
	return out
}

// TestRecordAlertsAndRestart: a series of hourly fetches with a 5 % move,
// a 12 % drop and a 25 % surge gives exactly the drop and surge alerts; a
// new watcher over the same store keeps the prices, the alert state (no
// second surge alert while the price stays high) and the history.
func TestRecordAlertsAndRestart(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	base := fixture(t)
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	rec := &alert.Recorder{Store: st}
	w := New(Config{Clock: clk}, nil, st, rec, quiet())
	ctx := context.Background()
	var alerts []int
	for i, f := range []float64{1, 1, 1, 1.05, 1, 0.88, 1, 1.25} {
		res, err := record(ctx, w, t0.Add(time.Duration(i)*time.Hour), scaled(base, f))
		if err != nil {
			t.Fatal(err)
		}
		alerts = append(alerts, res.Alerts)
	}
	if want := []int{0, 0, 0, 0, 0, 1, 0, 1}; len(alerts) != len(want) || alerts[5] != 1 || alerts[7] != 1 || alerts[3] != 0 || alerts[6] != 0 {
		t.Fatalf("alerts per fetch %v, want %v", alerts, want)
	}
	listed, err := rec.List(alert.KindPrice)
	if err != nil || len(listed) != 2 {
		t.Fatalf("%d price alerts (%v)", len(listed), err)
	}
	if a := listed[0]; a.GPUName != "RTX 4090" || a.Severity != alert.SeverityInfo || a.Change > -0.12 || a.ReferenceUSDPerHour <= a.PriceUSDPerHour ||
		!strings.Contains(a.Message, "RTX 4090 price dropped -12.9%: median $0.352/GPU-h vs $0.404 trailing 24 h average (on-demand, 3 offers of 1 provider; cheapest $0.308 from vastai)") {
		t.Errorf("drop alert %+v", a)
	}
	if a := listed[1]; a.Severity != alert.SeverityWarning || a.Change < 0.25 {
		t.Errorf("surge alert %+v", a)
	}
	if p, ok := w.CurrentPrice("rtx-4090"); !ok || math.Abs(p-0.35*1.25) > 1e-9 {
		t.Errorf("current price %v %v", p, ok)
	}
	st.Close()

	st = openStore(t, dir)
	defer st.Close()
	rec = &alert.Recorder{Store: st}
	w = New(Config{Clock: clk}, nil, st, rec, quiet())
	if p, ok := w.CurrentPrice("H100 SXM"); !ok || p != 18.12/8 {
		t.Errorf("after restart: H100 price %v %v", p, ok)
	}
	res, err := record(ctx, w, t0.Add(8*time.Hour), scaled(base, 1.24))
	if err != nil || res.Alerts != 0 {
		t.Errorf("still high after a restart: %d alerts (%v), want none", res.Alerts, err)
	}
	clk.Advance(8 * time.Hour)
	views, err := w.View("RTX 4090", "", 2)
	if err != nil || len(views) != 1 {
		t.Fatal(views, err)
	}
	tr := views[0].Trends["24h"]
	if tr.Points != 9 || math.Abs(tr.Change-0.24) > 1e-9 || len(views[0].Recommended) != 2 {
		t.Errorf("view %+v", views[0])
	}
	if _, err := w.View("B200", "", 0); err == nil {
		t.Error("view of a GPU without offers")
	}
	if _, err := w.Fetch(ctx); !errors.Is(err, ErrNoProvider) {
		t.Errorf("fetch without a provider: %v", err)
	}
}

// TestCurrentPriceOfNVMLNames: runs report their GPU by NVML's name; the
// catalog prices it by vast.ai's model name, and `prices --gpu` finds it
// too; a GPU the catalog does not have gets no price, not another's.
func TestCurrentPriceOfNVMLNames(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	w := New(Config{Clock: clock.NewFake(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))}, nil, st, nil, quiet())
	if _, ok := w.CurrentPrice("NVIDIA H100 80GB HBM3"); ok {
		t.Fatal("a price before any fetch")
	}
	if _, err := record(context.Background(), w, time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), fixture(t)); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{
		"NVIDIA H100 80GB HBM3":   18.12 / 8,
		"NVIDIA A100-SXM4-40GB":   4.12 / 4,
		"NVIDIA GeForce RTX 4090": 0.35,
		"NVIDIA H100 PCIe":        0, // the fixture has only H100 SXM offers
		"NVIDIA A100 80GB PCIe":   0,
		"NVIDIA A10G":             0,
	} {
		p, ok := w.CurrentPrice(name)
		if ok != (want > 0) || math.Abs(p-want) > 1e-9 {
			t.Errorf("CurrentPrice(%q) = %v %v, want %v", name, p, ok, want)
		}
	}
	v, err := w.View("NVIDIA GeForce RTX 4090", "", 5)
	if err != nil || len(v) != 1 || v[0].GPUName != "RTX 4090" || len(v[0].Recommended) != 3 {
		t.Errorf("view of NVML's RTX 4090: %+v %v", v, err)
	}
}

// TestHistoryOfModelsWithSlashes: a model's history is not mixed with
// the points of a longer model whose key starts with its key and a slash
// (keys are escaped), and those points expire. (A slash in an offer's name
// only separates words: "L40/48GB" is the L40.)
func TestHistoryOfModelsWithSlashes(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	rec := &alert.Recorder{Store: st}
	w := New(Config{}, nil, st, rec, quiet())
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	offers := []prices.Offer{
		{ID: "1", GPUName: "L40", NumGPUs: 1, USDPerHour: 1},
		{ID: "2", GPUName: "L40/48GB", NumGPUs: 1, USDPerHour: 1},
	}
	for i := range 5 {
		res, err := record(context.Background(), w, t0.Add(time.Duration(i)*time.Hour), offers)
		if err != nil || res.Alerts != 0 || res.Models != 1 {
			t.Fatalf("fetch %d: %d models, %d alerts (%v), want one model and no alert: the prices did not move", i, res.Models, res.Alerts, err)
		}
	}
	check := func(k string, n int, usd float64) {
		t.Helper()
		h, err := w.history(k, time.Time{})
		if err != nil || len(h) != n {
			t.Fatalf("history of %q: %d points (%v), want %d", k, len(h), err, n)
		}
		for _, p := range h {
			if p.Median != usd {
				t.Errorf("history of %q holds a point of $%v: %+v", k, p.Median, p)
			}
		}
	}
	check("l40", 5, 1)

	// A point of the model "l40/48gb" (stored under its escaped key).
	older := t0.Add(-time.Hour)
	b, _ := json.Marshal(point{Time: older, ModelPrice: prices.ModelPrice{GPUName: "L40/48GB", Median: 2, Cheapest: 2, Offers: 1}})
	if err := st.PutRecord(NSPrices, histKey("l40/48gb", older), b); err != nil {
		t.Fatal(err)
	}
	check("l40", 5, 1)
	check("l40/48gb", 1, 2)
	w.prune("l40/48gb", t0)
	check("l40/48gb", 0, 2)
}

// TestScheduledFetch: with a file provider, the watcher fetches at start,
// then once per interval of its clock; an empty price list keeps the last
// prices.
func TestScheduledFetch(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	path := filepath.Join(t.TempDir(), "prices.csv")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("gpu_name,num_gpus,dph_total\nL40S,2,1.8\n")
	clk := clock.NewFake(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	w := New(Config{Clock: clk, Interval: time.Hour}, []prices.Provider{&prices.File{Path: path}}, st, nil, quiet())
	// fetched waits until the n-th fetch has completed: it recorded its
	// point and set the price (the last thing a fetch does), so the file
	// may be rewritten and the history read.
	fetched := func(n int, price float64) []point {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			hist, err := w.history(prices.Key("L40S"), time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			p, _ := w.CurrentPrice("L40S")
			if len(hist) == n && p == price {
				return hist
			}
			if len(hist) > n || time.Now().After(deadline) {
				t.Fatalf("waiting for fetch %d: %d points, price %v, want price %v", n, len(hist), p, price)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if _, ok := w.CurrentPrice("l40s"); ok {
		t.Fatal("a price before any fetch")
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := w.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	fetched(1, 0.9) // at start, without waiting an interval
	write("gpu_name,num_gpus,dph_total\nL40S,1,0.8\n")
	clk.Advance(time.Hour)
	hist := fetched(2, 0.8)
	if hist[0].Median != 0.9 || hist[1].Median != 0.8 || hist[1].Time.Sub(hist[0].Time) != time.Hour {
		t.Errorf("history %+v", hist)
	}
	write("gpu_name,dph_total\n")
	if _, err := w.Fetch(context.Background()); err == nil {
		t.Error("an empty price list was accepted")
	}
	if p, _ := w.CurrentPrice("L40S"); p != 0.8 {
		t.Errorf("an empty fetch changed the price to %v", p)
	}
}

// record stores offers taken at now as the whole catalog, one per provider
// they name.
func record(ctx context.Context, w *Watcher, now time.Time, offers []prices.Offer) (FetchResult, error) {
	return w.commit(ctx, snapshot{Time: now, Catalogs: groupByProvider(offers, now)})
}

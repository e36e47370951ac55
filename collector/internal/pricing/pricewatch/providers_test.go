package pricewatch

import (
	"context"
	"encoding/json"
	"google.golang.org/protobuf/proto"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/advice/recommend"
	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/prices"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Answer modes of a fake provider server.
const (
	answerOK        = iota
	answerDown      // 503, every time
	answerMalformed // 200 with a body that is not the API's
	answerBroken    // 500, every time (an API that changed or broke)
)

// fakeProvider serves a provider's documented answer from the fixture
// file, or fails as mode says.
type fakeProvider struct {
	srv  *httptest.Server
	mode atomic.Int32
}

func newFakeProvider(t *testing.T, fixture string, rewrite func(srvURL string, body []byte, r *http.Request) []byte) *fakeProvider {
	t.Helper()
	body, err := os.ReadFile("../prices/testdata/" + fixture)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeProvider{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch f.mode.Load() {
		case answerDown:
			http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
			return
		case answerMalformed:
			w.Write([]byte("<html><body>maintenance</body></html>"))
			return
		case answerBroken:
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		b := body
		if rewrite != nil {
			b = rewrite(f.srv.URL, body, r)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// noWait retries without sleeping, twice at most: a provider that is down
// fails its fetch at once.
var noWait = prices.HTTPOptions{MaxAttempts: 2, Sleep: func(context.Context, time.Duration) error { return nil }}

type fourProviders struct {
	vast, lambda, runpod, azure *fakeProvider
	list                        []prices.Provider
}

func newFourProviders(t *testing.T) fourProviders {
	var f fourProviders
	f.vast = newFakeProvider(t, "vastai_offers.json", nil)
	f.lambda = newFakeProvider(t, "lambda_instance_types.json", nil)
	f.runpod = newFakeProvider(t, "runpod_gpu_types.json", nil)
	page2, err := os.ReadFile("../prices/testdata/azure_page2.json")
	if err != nil {
		t.Fatal(err)
	}
	f.azure = newFakeProvider(t, "azure_page1.json", func(srvURL string, body []byte, r *http.Request) []byte {
		if r.URL.Query().Get("$skip") != "" {
			return page2
		}
		next, _ := json.Marshal(srvURL + "/api/retail/prices?$skip=100")
		return []byte(strings.Replace(string(body), `"{{NEXT}}"`, string(next), 1))
	})
	f.list = []prices.Provider{
		&prices.VastAI{BaseURL: f.vast.srv.URL, HTTPOptions: noWait},
		&prices.Lambda{BaseURL: f.lambda.srv.URL, APIKey: "k", HTTPOptions: noWait},
		&prices.RunPod{URL: f.runpod.srv.URL + "/graphql", APIKey: "k", HTTPOptions: noWait},
		&prices.Azure{BaseURL: f.azure.srv.URL, HTTPOptions: noWait},
	}
	return f
}

func providerResult(t *testing.T, res FetchResult, name string) ProviderResult {
	t.Helper()
	for _, p := range res.Providers {
		if p.Provider == name {
			return p
		}
	}
	t.Fatalf("no result for provider %s in %+v", name, res.Providers)
	return ProviderResult{}
}

// TestFetchSeveralProviders: one fetch asks vast.ai, Lambda, RunPod and
// Azure (fake servers answering their documented shapes); every offer
// keeps its provider, spot/on-demand and region; each provider's skipped
// entries are counted; a GPU model's price is over all providers: the
// cheapest on-demand offer wherever it is (RunPod's RTX 4090 beats
// vast.ai's; RunPod's cheaper spot price is not a run's price), and
// `prices --provider` narrows to one provider's offers and trends.
func TestFetchSeveralProviders(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	f := newFourProviders(t)
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	w := New(Config{Clock: clk}, f.list, st, nil, quiet())
	if w.Provider() != "vastai,lambda,runpod,azure" {
		t.Errorf("provider %q", w.Provider())
	}
	res, err := w.Fetch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][2]int{"vastai": {6, 1}, "lambda": {4, 2}, "runpod": {7, 1}, "azure": {4, 2}} {
		p := providerResult(t, res, name)
		if p.Offers != want[0] || p.Skipped != want[1] || p.Err != "" || !p.Fetched.Equal(t0) {
			t.Errorf("%s: %+v, want %d offers, %d skipped", name, p, want[0], want[1])
		}
	}
	if res.Offers != 21 {
		t.Errorf("%d offers in the catalog, want 21", res.Offers)
	}
	for name, want := range map[string]float64{
		"NVIDIA GeForce RTX 4090": 0.34,      // RunPod Community Cloud, below vast.ai's 0.35
		"NVIDIA H100 80GB HBM3":   18.12 / 8, // vast.ai, below RunPod 2.69, Lambda 2.99, Azure 12.29
		"NVIDIA A10":              0.75,      // Lambda only
		"NVIDIA A100 80GB PCIe":   3.67,      // Azure on-demand; its low-priority 1.47 is spot
	} {
		if p, ok := w.CurrentPrice(name); !ok || math.Abs(p-want) > 1e-9 {
			t.Errorf("CurrentPrice(%q) = %v %v, want %v", name, p, ok, want)
		}
	}
	v, err := w.View("NVIDIA H100 80GB HBM3", "", 10)
	if err != nil || len(v) != 1 {
		t.Fatal(v, err)
	}
	h := v[0]
	var provs []string
	for p := range h.Providers {
		provs = append(provs, p)
	}
	sort.Strings(provs)
	if h.GPUName != "H100 SXM" || strings.Join(provs, ",") != "azure,lambda,runpod,vastai" || h.SpotOffers != 2 ||
		h.CheapestSpot != 1.75 || h.CheapestSpotOffer.Provider != "runpod" || h.CheapestOffer.Provider != "vastai" {
		t.Errorf("H100 SXM over all providers: %+v", h)
	}
	mp, ok := prices.ByModel(w.all)[prices.ModelKey("RTX 4090")]
	c := mp.CheapestOffer
	if !ok || c.Provider != "runpod" || c.Spot {
		t.Errorf("cheapest RTX 4090 %+v", c)
	}
	lv, err := w.View("", "lambda", 0)
	if err != nil || len(lv) != 3 {
		t.Fatalf("lambda's models: %+v %v", lv, err)
	}
	for _, m := range lv {
		if m.CheapestOffer.Provider != "lambda" {
			t.Errorf("--provider lambda shows %+v", m.CheapestOffer)
		}
		if m.GPUName == "H100 SXM" && (m.Cheapest != 2.99 || m.CheapestOffer.Location == "") {
			t.Errorf("lambda's H100 SXM %+v", m)
		}
	}
	if _, err := w.View("", "coreweave", 0); err == nil || !strings.Contains(err.Error(), "azure, lambda, runpod, vastai") {
		t.Errorf("unknown provider: %v", err)
	}
	if _, err := w.View("NVIDIA GeForce RTX 4090", "lambda", 0); err == nil {
		t.Error("lambda has no RTX 4090, yet a view")
	}
}

// TestProviderDownOrMalformedKeepsItsCatalog: when one provider is down
// and another answers garbage, the others' fresh offers are recorded and
// the two keep their last good catalogs (prices, status with the error);
// when every provider fails, the fetch is an error and records nothing.
func TestProviderDownOrMalformedKeepsItsCatalog(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	f := newFourProviders(t)
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	w := New(Config{Clock: clk}, f.list, st, nil, quiet())
	if _, err := w.Fetch(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.lambda.mode.Store(answerDown)
	f.runpod.mode.Store(answerMalformed)
	clk.Advance(time.Hour)
	res, err := w.Fetch(context.Background())
	if err != nil {
		t.Fatalf("one provider down failed the whole fetch: %v", err)
	}
	l, r, v := providerResult(t, res, "lambda"), providerResult(t, res, "runpod"), providerResult(t, res, "vastai")
	if !strings.Contains(l.Err, "HTTP 503") || l.Offers != 4 || !l.Fetched.Equal(t0) {
		t.Errorf("lambda down: %+v, want its 4 offers of %v kept with the error", l, t0)
	}
	if !strings.Contains(r.Err, "RunPod GPU types") || r.Offers != 7 || !r.Fetched.Equal(t0) {
		t.Errorf("runpod malformed: %+v, want its 7 offers kept with the error", r)
	}
	if v.Err != "" || !v.Fetched.Equal(t0.Add(time.Hour)) {
		t.Errorf("vastai %+v", v)
	}
	if p, ok := w.CurrentPrice("NVIDIA A10"); !ok || p != 0.75 {
		t.Errorf("Lambda's A10 after Lambda went down: %v %v, want its last good 0.75", p, ok)
	}
	if p, ok := w.CurrentPrice("NVIDIA GeForce RTX 4090"); !ok || p != 0.34 {
		t.Errorf("RunPod's RTX 4090 after a malformed answer: %v %v", p, ok)
	}
	hist, _ := w.history("a10", time.Time{})
	if len(hist) != 2 {
		t.Errorf("A10 history %d points, want 2 (one per fetch)", len(hist))
	}
	// The status survives a restart.
	w2 := New(Config{Clock: clk}, f.list, st, nil, quiet())
	var down ProviderResult
	for _, s := range w2.Status() {
		if s.Provider == "lambda" {
			down = s
		}
	}
	if down.Offers != 4 || !strings.Contains(down.Err, "503") || !down.ErrTime.Equal(t0.Add(time.Hour)) {
		t.Errorf("lambda status after restart %+v", down)
	}
	// Everything down: an error, nothing recorded, prices unchanged.
	for _, p := range []*fakeProvider{f.vast, f.lambda, f.runpod, f.azure} {
		p.mode.Store(answerDown)
	}
	clk.Advance(time.Hour)
	if _, err := w.Fetch(context.Background()); err == nil {
		t.Error("a fetch with every provider down succeeded")
	}
	if hist, _ := w.history("a10", time.Time{}); len(hist) != 2 {
		t.Errorf("a failed fetch recorded a point: %d", len(hist))
	}
	if p, ok := w.CurrentPrice("NVIDIA H100 80GB HBM3"); !ok || p != 18.12/8 {
		t.Errorf("H100 after every provider failed: %v %v", p, ok)
	}
	for _, s := range w.Status() {
		if s.Err == "" || s.Offers == 0 {
			t.Errorf("status of %s after every provider failed: %+v", s.Provider, s)
		}
	}
}

// TestAlertsAndTrendsAcrossProviders: the alert series is the median of
// every provider's on-demand offers, so a drop on two providers alerts
// once; spot offers never move it; --provider's trend follows that
// provider's own median.
func TestAlertsAndTrendsAcrossProviders(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	rec := &alert.Recorder{Store: st}
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	w := New(Config{Clock: clk}, nil, st, rec, quiet())
	offers := func(vast, runpod, spot float64) []prices.Offer {
		return []prices.Offer{
			{ID: "v1", Provider: "vastai", GPUName: "RTX 4090", NumGPUs: 1, USDPerHour: vast},
			{ID: "v2", Provider: "vastai", GPUName: "RTX 4090", NumGPUs: 2, USDPerHour: 2 * vast},
			{ID: "r1", Provider: "runpod", GPUName: "RTX 4090", NumGPUs: 1, USDPerHour: runpod},
			{ID: "r2", Provider: "runpod", GPUName: "RTX 4090", NumGPUs: 1, USDPerHour: spot, Spot: true},
		}
	}
	var alerts []int
	for i, o := range [][]prices.Offer{offers(0.4, 0.4, 0.2), offers(0.4, 0.4, 0.1), offers(0.4, 0.4, 0.3), offers(0.4, 0.4, 0.05), offers(0.3, 0.3, 0.05), offers(0.3, 0.3, 0.05)} {
		res, err := record(context.Background(), w, t0.Add(time.Duration(i)*time.Hour), o)
		if err != nil {
			t.Fatal(err)
		}
		alerts = append(alerts, res.Alerts)
	}
	if got := alerts; got[1]+got[2]+got[3] != 0 || got[4] != 1 || got[5] != 0 {
		t.Errorf("alerts per fetch %v: want none for spot moves, one for the 25 %% on-demand drop", got)
	}
	clk.Advance(5 * time.Hour)
	all, err := w.View("RTX 4090", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if tr := all[0].Trends["24h"]; tr.Points != 6 || math.Abs(tr.Change-(-0.25)) > 1e-9 {
		t.Errorf("all providers' trend %+v", tr)
	}
	rp, err := w.View("RTX 4090", "runpod", 0)
	if err != nil {
		t.Fatal(err)
	}
	if m := rp[0]; m.Offers != 1 || m.Cheapest != 0.3 || m.SpotOffers != 1 || m.CheapestSpot != 0.05 || m.Trends["24h"].Points != 6 {
		t.Errorf("runpod's RTX 4090 %+v", m)
	}
}

// TestComputeTierAcrossProviders: the compute-tier recommendation prices
// each GPU at its cheapest on-demand offer of any provider: with RunPod's
// RTX 4090 at $0.34 (vast.ai's $0.35) and vast.ai's H100 at $2.265, the
// RTX 4090 is 50 % cheaper per unit of throughput (48 % at vast.ai's
// price alone), and the advice says where that price is.
func TestComputeTierAcrossProviders(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	f := newFourProviders(t)
	w := New(Config{Clock: clock.NewFake(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))}, f.list, st, nil, quiet())
	if _, err := w.Fetch(context.Background()); err != nil {
		t.Fatal(err)
	}
	run := func(id, gpu string, tokPerS, cost float64) recommend.Run {
		return recommend.Run{Report: &trainmeterv1.RunReport{RunId: id, Metadata: &trainmeterv1.RunMetadata{Model: "m"}, GpuName: gpu, Gpus: 1,
			TokPerS: proto.Float64(tokPerS), CostUsd: proto.Float64(cost), TotalCostUsd: proto.Float64(cost), GpuPricePerHour: proto.Float64(3)}}
	}
	recs := recommend.ComputeTier([]recommend.Run{run("h", "NVIDIA H100 80GB HBM3", 1000, 10), run("r", "NVIDIA GeForce RTX 4090", 300, 2)}, w)
	if len(recs) != 1 {
		t.Fatalf("%d recommendations: %v", len(recs), recs)
	}
	gap := 1 - (0.34/300)/(18.12/8/1000)
	if r := recs[0]; !strings.Contains(r.Title, "on NVIDIA GeForce RTX 4090 instead of NVIDIA H100 80GB HBM3: 50% cheaper") ||
		!strings.Contains(r.Evidence, "catalog's current prices") || math.Abs(r.GetSavingsUsd()-gap*10) > 1e-9 ||
		!strings.HasSuffix(r.Action, "; NVIDIA GeForce RTX 4090 at $0.34/GPU-h from runpod)") {
		t.Errorf("recommendation %q / %q / %q, savings %v want %v", r.Title, r.Action, r.Evidence, r.GetSavingsUsd(), gap*10)
	}
	if where, ok := w.CurrentOffer("NVIDIA A10"); !ok || where != "lambda, us-east-1" {
		t.Errorf("CurrentOffer(A10) = %q %v", where, ok)
	}
}

// TestSlowProviderFailsAloneAtTheDeadline: a provider that does not answer
// before the caller's deadline (`prices fetch --timeout`) fails alone; the
// others' answers are recorded within the deadline.
func TestSlowProviderFailsAloneAtTheDeadline(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	f := newFourProviders(t)
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	defer hang.Close()
	list := []prices.Provider{&prices.VastAI{BaseURL: hang.URL}, f.list[1]}
	w := New(Config{Clock: clock.NewFake(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))}, list, st, nil, quiet())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	res, err := w.Fetch(ctx)
	if err != nil || ctx.Err() != nil {
		t.Fatalf("fetch: %v (ctx %v), want Lambda's answer recorded before the deadline", err, ctx.Err())
	}
	if v := providerResult(t, res, "vastai"); !strings.Contains(v.Err, "deadline exceeded") || v.Offers != 0 {
		t.Errorf("vastai %+v", v)
	}
	if l := providerResult(t, res, "lambda"); l.Err != "" || l.Offers != 4 {
		t.Errorf("lambda %+v", l)
	}
}

// TestImportBesideFetchedProviders: an imported list joins the fetched
// providers' catalog and survives their next fetch; a provider dropped
// from the configuration loses its offers at the next fetch.
func TestImportBesideFetchedProviders(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	f := newFourProviders(t)
	clk := clock.NewFake(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	w := New(Config{Clock: clk}, f.list[:2], st, nil, quiet()) // vastai, lambda
	if _, err := w.Fetch(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Import(context.Background(), []prices.Offer{{ID: "cw-1", Provider: "coreweave", GPUName: "H100 SXM", NumGPUs: 8, USDPerHour: 8}}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	if _, err := w.Fetch(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p, ok := w.CurrentPrice("NVIDIA H100 80GB HBM3"); !ok || p != 1 {
		t.Errorf("H100 after the import and a fetch: %v %v, want coreweave's $1", p, ok)
	}
	var names []string
	for _, s := range w.Status() {
		names = append(names, s.Provider)
		if s.Provider == "coreweave" && (!s.Imported || s.Offers != 1) {
			t.Errorf("coreweave status %+v", s)
		}
	}
	if strings.Join(names, ",") != "vastai,lambda,coreweave" {
		t.Errorf("providers %v", names)
	}
	// Restarted with lambda only: vast.ai's offers go at the next fetch.
	w = New(Config{Clock: clk}, f.list[1:2], st, nil, quiet())
	clk.Advance(time.Hour)
	if _, err := w.Fetch(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := w.View("", "vastai", 0); err == nil {
		t.Error("offers of a provider no longer configured")
	}
	if _, err := w.View("", "coreweave", 0); err != nil {
		t.Errorf("the imported list after a restart and a fetch: %v", err)
	}
}

// statusOf is provider's entry of the watcher's status.
func statusOf(t *testing.T, w *Watcher, provider string) ProviderResult {
	t.Helper()
	for _, s := range w.Status() {
		if s.Provider == provider {
			return s
		}
	}
	t.Fatalf("no status for provider %s", provider)
	return ProviderResult{}
}

// TestStaleProviderStopsCountingAsCurrent: a provider whose API fails (HTTP
// 500) keeps its last good offers for a blip, but once they are older than
// the max offer age (the default: 24 h at an hourly fetch) they are no
// current price, cheapest offer, run cost or compute-tier price; they stay
// listed, marked stale with their age and the last error, their history
// as it was. A restarted watcher judges staleness from the stored answer's
// time, not its uptime; a provider that answers again is current again;
// with every catalog stale, the warning says so and the cost model prices
// runs as with no catalog.
func TestStaleProviderStopsCountingAsCurrent(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	f := newFourProviders(t)
	list := f.list[:3] // vastai, lambda, runpod
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	cfg := Config{Clock: clk, Interval: time.Hour}
	w := New(cfg, list, st, nil, quiet())
	if w.MaxOfferAge() != 24*time.Hour {
		t.Fatalf("default max offer age at an hourly fetch: %v, want 24h", w.MaxOfferAge())
	}
	ctx := context.Background()
	if _, err := w.Fetch(ctx); err != nil {
		t.Fatal(err)
	}
	market := cost.Config{Catalog: w, GPUPricePerHour: 1.5}
	if p, src, _ := market.GPUPrice(0, "", "NVIDIA A10"); p != 0.75 || src != cost.SourceCatalog {
		t.Fatalf("A10 run price %v from %s, want Lambda's 0.75 from the catalog", p, src)
	}
	f.lambda.mode.Store(answerBroken)
	f.runpod.mode.Store(answerBroken)

	// A blip: an hour later the last good offers still count.
	clk.Advance(time.Hour)
	if _, err := w.Fetch(ctx); err != nil {
		t.Fatal(err)
	}
	if p, ok := w.CurrentPrice("NVIDIA A10"); !ok || p != 0.75 {
		t.Errorf("A10 an hour into Lambda's outage: %v %v, want its last good 0.75", p, ok)
	}
	if s := statusOf(t, w, "lambda"); s.Stale || s.Age != time.Hour {
		t.Errorf("lambda an hour into its outage: %+v, want not stale, 1h old", s)
	}

	// Past the max age: Lambda's and RunPod's offers are no current price.
	clk.Advance(24 * time.Hour)
	res, err := w.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l := providerResult(t, res, "lambda"); !l.Stale || l.Age != 25*time.Hour || !strings.Contains(l.Err, "HTTP 500") {
		t.Errorf("lambda in the fetch result: %+v, want stale, 25h old, HTTP 500", l)
	}
	if res.Offers != 6 {
		t.Errorf("%d current offers after the fetch, want vast.ai's 6", res.Offers)
	}
	if p, ok := w.CurrentPrice("NVIDIA A10"); ok {
		t.Errorf("A10 priced at Lambda's 25 h old %v", p)
	}
	if p, src, _ := market.GPUPrice(0, "", "NVIDIA A10"); p != 1.5 || src != cost.SourceFlag {
		t.Errorf("A10 run price %v from %s, want --gpu-price-per-hour's 1.5", p, src)
	}
	if p, ok := w.CurrentPrice("NVIDIA GeForce RTX 4090"); !ok || p != 0.35 {
		t.Errorf("RTX 4090 %v %v, want vast.ai's 0.35, not RunPod's stale 0.34", p, ok)
	}
	if where, ok := w.CurrentOffer("NVIDIA GeForce RTX 4090"); !ok || !strings.HasPrefix(where, "vastai") {
		t.Errorf("RTX 4090's offer at %q", where)
	}
	if c := prices.ByModel(w.all)[prices.ModelKey("RTX 4090")].CheapestOffer; c.Provider != "vastai" {
		t.Errorf("cheapest RTX 4090 %+v", c)
	}
	run := func(id, gpu string, tokPerS, usd float64) recommend.Run {
		return recommend.Run{Report: &trainmeterv1.RunReport{RunId: id, Metadata: &trainmeterv1.RunMetadata{Model: "m"}, GpuName: gpu, Gpus: 1,
			TokPerS: proto.Float64(tokPerS), CostUsd: proto.Float64(usd), TotalCostUsd: proto.Float64(usd), GpuPricePerHour: proto.Float64(3)}}
	}
	recs := recommend.ComputeTier([]recommend.Run{run("h", "NVIDIA H100 80GB HBM3", 1000, 10), run("r", "NVIDIA GeForce RTX 4090", 300, 2)}, w)
	if len(recs) != 1 || !strings.Contains(recs[0].Action, "NVIDIA GeForce RTX 4090 at $0.35/GPU-h from vastai") {
		t.Errorf("compute-tier advice with RunPod stale: %v", recs)
	}
	lambda := statusOf(t, w, "lambda")
	if !lambda.Stale || lambda.Offers != 4 || lambda.Age != 25*time.Hour || !lambda.Fetched.Equal(t0) || !strings.Contains(lambda.Err, "HTTP 500") {
		t.Errorf("lambda listed as %+v, want its 4 offers of %v, stale, 25h old, with the error", lambda, t0)
	}
	if v := statusOf(t, w, "vastai"); v.Stale || v.Age != 0 {
		t.Errorf("vastai %+v", v)
	}
	if _, err := w.View("", "lambda", 0); err == nil || !strings.Contains(err.Error(), "stale") || !strings.Contains(err.Error(), "25h0m0s old") {
		t.Errorf("prices --provider lambda: %v, want its staleness", err)
	}
	if _, err := w.View("NVIDIA A10", "", 0); err == nil || !strings.Contains(err.Error(), "stale catalogs of lambda, runpod") {
		t.Errorf("prices --gpu A10: %v", err)
	}
	if hist, _ := w.history("a10", time.Time{}); len(hist) != 2 || !hist[1].Time.Equal(t0.Add(time.Hour)) {
		t.Errorf("A10 history %+v, want the 2 points seen while Lambda was current, no new one", hist)
	}
	svc := NewService(w)
	list1, err := svc.ListPrices(ctx, &trainmeterv1.ListPricesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if list1.GetMaxOfferAgeS() != 86400 || list1.GetWarning() != "" {
		t.Errorf("max offer age %v s, warning %q", list1.GetMaxOfferAgeS(), list1.GetWarning())
	}
	for _, p := range list1.GetProviders() {
		if want := p.GetProvider() != "vastai"; p.GetStale() != want || (want && p.GetAgeS() != 25*3600) {
			t.Errorf("PriceService lists %v", p)
		}
	}
	for _, g := range list1.GetGpus() {
		if g.GetGpuName() == "A10" {
			t.Errorf("PriceService lists Lambda's stale A10 as a current price: %v", g)
		}
	}

	// Restarted: the stored answer's time says stale, at once, and says so
	// in the log.
	var logged strings.Builder
	w = New(cfg, list, st, nil, slog.New(slog.NewTextHandler(&logged, nil)))
	if p, ok := w.CurrentPrice("NVIDIA A10"); ok {
		t.Errorf("A10 priced at %v after a restart", p)
	}
	if s := statusOf(t, w, "lambda"); !s.Stale || s.Age != 25*time.Hour {
		t.Errorf("lambda after a restart %+v", s)
	}
	if !strings.Contains(logged.String(), "price catalog is stale") || !strings.Contains(logged.String(), "provider=lambda") {
		t.Errorf("no stale warning logged at start:\n%s", logged.String())
	}

	// Lambda answers again: current again.
	f.lambda.mode.Store(answerOK)
	clk.Advance(time.Hour)
	if _, err := w.Fetch(ctx); err != nil {
		t.Fatal(err)
	}
	if p, ok := w.CurrentPrice("NVIDIA A10"); !ok || p != 0.75 {
		t.Errorf("A10 after Lambda came back: %v %v", p, ok)
	}
	if s := statusOf(t, w, "lambda"); s.Stale || s.Err != "" || s.Age != 0 {
		t.Errorf("lambda after it came back %+v", s)
	}

	// Every provider down past the max age: said, and priced as without
	// a catalog (the flag, or no price).
	for _, p := range []*fakeProvider{f.vast, f.lambda} {
		p.mode.Store(answerBroken)
	}
	clk.Advance(25 * time.Hour)
	if _, err := w.Fetch(ctx); err == nil {
		t.Error("a fetch with every provider down succeeded")
	}
	if !strings.Contains(logged.String(), "every price catalog is stale") {
		t.Errorf("no warning logged with every catalog stale:\n%s", logged.String())
	}
	list2, err := NewService(w).ListPrices(ctx, &trainmeterv1.ListPricesRequest{})
	if err != nil || len(list2.GetGpus()) != 0 || !strings.Contains(list2.GetWarning(), "every price catalog is stale") {
		t.Errorf("prices with every catalog stale: %v %v", list2, err)
	}
	none := cost.Config{GPUPricePerHour: 1.5}
	for _, gpu := range []string{"NVIDIA H100 80GB HBM3", "NVIDIA A10"} {
		p, src, ok := cost.Config{Catalog: w, GPUPricePerHour: 1.5}.GPUPrice(0, "", gpu)
		if wp, wsrc, wok := none.GPUPrice(0, "", gpu); p != wp || src != wsrc || ok != wok {
			t.Errorf("%s with every catalog stale: %v %s %v, want as without a catalog: %v %s %v", gpu, p, src, ok, wp, wsrc, wok)
		}
		if _, _, ok := (cost.Config{Catalog: w}).GPUPrice(0, "", gpu); ok {
			t.Errorf("%s priced with every catalog stale and no flag", gpu)
		}
	}
}

// TestImportedCatalogNeverStale: a price list imported by the user is
// their own data, not a fetch that failed: it counts as current however
// old, beside a fetched catalog that has gone stale.
func TestImportedCatalogNeverStale(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	f := newFourProviders(t)
	clk := clock.NewFake(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	w := New(Config{Clock: clk, MaxOfferAge: 2 * time.Hour}, f.list[1:2], st, nil, quiet()) // lambda
	ctx := context.Background()
	if _, err := w.Fetch(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Import(ctx, []prices.Offer{{ID: "cw-1", Provider: "coreweave", GPUName: "H100 SXM", NumGPUs: 8, USDPerHour: 16}}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(30 * 24 * time.Hour)
	if p, ok := w.CurrentPrice("NVIDIA H100 80GB HBM3"); !ok || p != 2 {
		t.Errorf("H100 %v %v, want the 30 days old import's $2, not Lambda's stale $2.99", p, ok)
	}
	if _, ok := w.CurrentPrice("NVIDIA A10"); ok {
		t.Error("Lambda's 30 days old A10 is a current price")
	}
	if s := statusOf(t, w, "coreweave"); s.Stale || !s.Imported || s.Age != 30*24*time.Hour {
		t.Errorf("imported coreweave %+v", s)
	}
	if w.StaleWarning() != "" {
		t.Errorf("warning %q with a current import", w.StaleWarning())
	}
}

package prices

import (
	"bufio"
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func loadSeries(t *testing.T, path string) []Point {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Point
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		ts, v, _ := strings.Cut(line, ",")
		tm, err := time.Parse(time.RFC3339, ts)
		if err != nil {
			t.Fatal(err)
		}
		usd, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, Point{Time: tm, USD: usd})
	}
	return out
}

// TestAlertsOnFixtureSeries: on the hand-written hourly series, the 12 %
// drop and the 25 % surge (against the trailing average) alert, each once;
// the 5 % move and the recovery do not.
func TestAlertsOnFixtureSeries(t *testing.T) {
	series := loadSeries(t, "testdata/rtx4090_series.csv")
	got := make([]Change, len(series))
	state := StateNormal
	for i, p := range series {
		got[i] = DefaultAlertRule.Check(series[:i], p, state)
		state = got[i].State
	}
	fired := map[int]Change{}
	for i, c := range got {
		if c.Fire {
			fired[i] = c
		}
	}
	if len(fired) != 2 {
		t.Fatalf("fired at %v, want exactly the drop (6) and the surge (9)", fired)
	}
	drop, surge := fired[6], fired[9]
	if drop.State != StateDrop || math.Abs(drop.Change-(-0.12)) > 0.005 {
		t.Errorf("point 6: %+v, want a drop of about 12 %%", drop)
	}
	if surge.State != StateSurge || math.Abs(surge.Change-0.25) > 0.005 {
		t.Errorf("point 9: %+v, want a surge of about 25 %%", surge)
	}
	if c := got[4]; c.State != StateNormal || math.Abs(c.Change-0.05) > 0.001 {
		t.Errorf("point 4 (5 %% move): %+v, want normal at +5 %%", c)
	}
	if c := got[10]; c.State != StateSurge || c.Fire {
		t.Errorf("point 10 (still high): %+v, want surge without a second alert", c)
	}
	// The first points have no trailing average of MinPoints points.
	for i := range DefaultAlertRule.MinPoints {
		if got[i].Reference != 0 {
			t.Errorf("point %d judged against %v with too little history", i, got[i].Reference)
		}
	}
}

func TestAlertThresholdsAreStrict(t *testing.T) {
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	hist := []Point{{base, 1}, {base.Add(time.Hour), 1}, {base.Add(2 * time.Hour), 1}}
	at := base.Add(3 * time.Hour)
	for _, tc := range []struct {
		usd   float64
		state string
	}{{0.90, StateNormal}, {0.899, StateDrop}, {1.20, StateNormal}, {1.201, StateSurge}, {0.95, StateNormal}, {1.05, StateNormal}} {
		if c := DefaultAlertRule.Check(hist, Point{at, tc.usd}, ""); c.State != tc.state {
			t.Errorf("%v against 1.0: %s, want %s", tc.usd, c.State, tc.state)
		}
	}
	// Points older than the window do not count.
	old := []Point{{at.Add(-48 * time.Hour), 5}, {at.Add(-47 * time.Hour), 5}, {at.Add(-46 * time.Hour), 5}}
	if c := DefaultAlertRule.Check(old, Point{at, 1}, ""); c.Reference != 0 || c.State != StateNormal {
		t.Errorf("judged against points outside the 24 h window: %+v", c)
	}
}

func TestTrend(t *testing.T) {
	series := loadSeries(t, "testdata/rtx4090_series.csv")
	now := series[len(series)-1].Time
	tr := TrendOver(series, now, 24*time.Hour)
	if tr.Points != len(series) || math.Abs(tr.Change-(0.495/0.400-1)) > 1e-9 || tr.Min != 0.3549 || tr.Max != 0.496 {
		t.Errorf("24h trend %+v", tr)
	}
	tr = TrendOver(series, now, 2*time.Hour) // (now-2h, now]: the last two points
	if tr.Points != 2 || math.Abs(tr.Change-(0.495/0.496-1)) > 1e-9 {
		t.Errorf("2h trend %+v", tr)
	}
	if tr := TrendOver(nil, now, time.Hour); tr.Points != 0 || tr.Change != 0 {
		t.Errorf("empty trend %+v", tr)
	}
}

func fixtureOffers(t *testing.T) []Offer {
	t.Helper()
	f, err := os.Open("testdata/vastai_offers.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	offers, skipped, err := ParseVastAIOffers(f, "vastai")
	if err != nil {
		t.Fatal(err)
	}
	if skipped != 1 {
		t.Errorf("skipped %d offers, want the RTX 3090 with num_gpus 0", skipped)
	}
	return offers
}

func TestParseVastAIFixture(t *testing.T) {
	offers := fixtureOffers(t)
	if len(offers) != 6 {
		t.Fatalf("%d offers", len(offers))
	}
	o := offers[1]
	if o.ID != "13011702" || o.GPUName != "RTX 4090" || o.NumGPUs != 2 || o.USDPerHour != 0.84 || o.PerGPUHour() != 0.42 ||
		o.Reliability == nil || *o.Reliability != 0.9962 || o.DLPerfPerUSD != 140.95 || o.Location != "Norway, NO" || o.InetDownMbps != 1422.9 || math.Abs(o.GPURAMGB-23.99) > 0.01 {
		t.Errorf("offer %+v", o)
	}
	if r := offers[5].Reliability; r == nil || *r != 0.9872 {
		t.Errorf("reliability without reliability2: %v", r)
	}
	by := ByModel(offers)
	mp := by["rtx 4090"]
	if mp.Offers != 3 || mp.Cheapest != 0.35 || mp.Median != 0.40 || mp.CheapestOffer.ID != "13254871" {
		t.Errorf("RTX 4090: %+v", mp)
	}
	if h := by["h100 sxm"]; h.Cheapest != 18.12/8 || h.Offers != 2 {
		t.Errorf("H100: %+v", h)
	}
	if c := by[ModelKey("h100-sxm")].CheapestOffer; c.ID != "13390116" {
		t.Errorf("cheapest h100-sxm: %+v", c)
	}
	if _, ok := by[ModelKey("B200")]; ok {
		t.Error("cheapest of a model without offers")
	}
}

func TestRecommend(t *testing.T) {
	offers := fixtureOffers(t)
	rec := Recommend(offers, "rtx 4090")
	if len(rec) != 3 {
		t.Fatalf("%d recommendations", len(rec))
	}
	// The cheapest offer also has the best dlperf/$ and good reliability.
	if rec[0].ID != "13254871" || rec[0].Score <= rec[1].Score || rec[0].Score > 1 {
		t.Errorf("ranking %+v", rec)
	}
}

func TestPriceListCSVAndJSON(t *testing.T) {
	b, err := os.ReadFile("testdata/price_list.csv")
	if err != nil {
		t.Fatal(err)
	}
	offers, err := ParsePriceList(b, "file")
	if err != nil {
		t.Fatal(err)
	}
	if len(offers) != 3 || offers[1].PerGPUHour() != 0.38 || offers[1].Provider != "lambda" || offers[0].Location != "Texas, US" {
		t.Errorf("csv offers %+v", offers)
	}
	f := &File{Path: "testdata/vastai_offers.json"}
	if _, _, err := f.FetchOffers(context.Background()); err == nil || !strings.Contains(err.Error(), "1 offer(s)") {
		t.Errorf("a hand-made list with an unpriceable offer: %v", err)
	}
	for _, bad := range []string{
		"gpu,price\nx,1\n",
		"gpu_name,dph_total\nRTX 4090,abc\n",
		"gpu_name,dph_total\nRTX 4090,-1\n",
		"gpu_name,usd_per_gpu_hour,reliability\nRTX 4090,1,1.5\n",
		"{\"offers\": 3}",
		"",
	} {
		if _, err := ParsePriceList([]byte(bad), "file"); err == nil {
			t.Errorf("price list %q accepted", bad)
		}
	}
	for list, want := range map[string]string{
		"gpu_name,num_gpus,dph_total\nL40S,1,0.9\nL40S,1.9,1.8\n":                `line 3: num_gpus "1.9" is not a whole number`,
		"gpu_name,num_gpus,dph_total\nL40S,0.5,0.9\n":                            `line 2: num_gpus "0.5" is not a whole number`,
		"gpu_name,num_gpus,dph_total\nL40S,0,0.9\n":                              `line 2: num_gpus "0" is not a whole number`,
		`{"offers":[{"gpu_name":"L40S","num_gpus":1.5,"dph_total":1.2,"id":7}]}`: "1 offer(s) without a gpu_name, a whole num_gpus",
	} {
		if _, err := ParsePriceList([]byte(list), "file"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("price list %q: error %v, want %q", list, err, want)
		}
	}
	spot, err := ParsePriceList([]byte("gpu_name,usd_per_gpu_hour,spot,region\nL40S,0.5,true,eastus\nL40S,0.9,on-demand,\n"), "file")
	if err != nil || !spot[0].Spot || spot[0].Location != "eastus" || spot[1].Spot {
		t.Errorf("spot and region columns: %+v %v", spot, err)
	}
	if _, err := ParsePriceList([]byte("gpu_name,usd_per_gpu_hour,spot\nL40S,0.5,maybe\n"), "file"); err == nil || !strings.Contains(err.Error(), `line 2: spot "maybe"`) {
		t.Errorf("spot maybe: %v", err)
	}
	per, err := ParsePriceList([]byte("gpu_name,num_gpus,usd_per_gpu_hour\nL40S,4,0.9\n"), "file")
	if err != nil || per[0].USDPerHour != 3.6 || per[0].PerGPUHour() != 0.9 {
		t.Errorf("per-GPU column: %+v %v", per, err)
	}
}

// TestVastAIClient: the client sends the bearer key and the query to the
// bundles endpoint, retries 429 (waiting at least Retry-After) and 5xx, and
// gives up on 4xx at once.
func TestVastAIClient(t *testing.T) {
	fixture, err := os.ReadFile("testdata/vastai_offers.json")
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	var fail atomic.Int32 // how many calls to answer 429 first
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.URL.Path != "/api/v0/bundles/" || !strings.Contains(r.URL.Query().Get("q"), `"rentable"`) {
			http.Error(w, "bad path "+r.URL.String(), http.StatusNotFound)
			return
		}
		if r.Header.Get("Authorization") != "Bearer k3y" {
			http.Error(w, `{"error":"invalid_api_key"}`, http.StatusUnauthorized)
			return
		}
		if fail.Add(-1) >= 0 {
			w.Header().Set("Retry-After", "7")
			http.Error(w, `{"error":"rate limited"}`, http.StatusTooManyRequests)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(fixture)
	}))
	defer srv.Close()
	var waits []time.Duration
	c := &VastAI{BaseURL: srv.URL + "/", APIKey: "k3y", HTTPOptions: HTTPOptions{Sleep: func(_ context.Context, d time.Duration) error {
		waits = append(waits, d)
		return nil
	}}}
	fail.Store(2)
	offers, _, err := c.FetchOffers(context.Background())
	if err != nil || len(offers) != 6 {
		t.Fatalf("offers %d, err %v", len(offers), err)
	}
	if calls.Load() != 3 || len(waits) != 2 || waits[0] < 7*time.Second || waits[1] < 7*time.Second {
		t.Errorf("calls %d waits %v: want 2 retries of at least Retry-After 7s", calls.Load(), waits)
	}
	// Always 429: gives up after MaxAttempts with the last error.
	calls.Store(0)
	fail.Store(100)
	c.MaxAttempts = 3
	_, _, err = c.FetchOffers(context.Background())
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != 429 || calls.Load() != 3 {
		t.Errorf("err %v after %d calls", err, calls.Load())
	}
	// A wrong key is not retried.
	calls.Store(0)
	fail.Store(0)
	c.APIKey = "wrong"
	if _, _, err := c.FetchOffers(context.Background()); !errors.As(err, &he) || he.Status != 401 || calls.Load() != 1 {
		t.Errorf("401: err %v after %d calls", err, calls.Load())
	}
}

// TestVastAIRetryAfterBeyondBackoff: a Retry-After longer than the backoff
// cap (a rate limit of minutes) is honoured, up to MaxRetryAfter.
func TestVastAIRetryAfterBeyondBackoff(t *testing.T) {
	fixture, err := os.ReadFile("testdata/vastai_offers.json")
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) {
		case 1:
			w.Header().Set("Retry-After", "300")
			http.Error(w, "slow down", http.StatusTooManyRequests)
		case 2:
			w.Header().Set("Retry-After", "86400")
			http.Error(w, "come back tomorrow", http.StatusServiceUnavailable)
		default:
			w.Write(fixture)
		}
	}))
	defer srv.Close()
	var waits []time.Duration
	c := &VastAI{BaseURL: srv.URL, HTTPOptions: HTTPOptions{Sleep: func(_ context.Context, d time.Duration) error {
		waits = append(waits, d)
		return nil
	}}}
	if _, _, err := c.FetchOffers(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(waits) != 2 || waits[0] != 300*time.Second || waits[1] != DefaultMaxRetryAfter {
		t.Errorf("waits %v, want [5m0s 10m0s] (Retry-After, capped at %v)", waits, DefaultMaxRetryAfter)
	}
}

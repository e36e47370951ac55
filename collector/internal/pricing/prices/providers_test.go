package prices

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// recordSleeps is an HTTPOptions whose waits are recorded, not slept.
func recordSleeps(waits *[]time.Duration) HTTPOptions {
	return HTTPOptions{Sleep: func(_ context.Context, d time.Duration) error {
		*waits = append(*waits, d)
		return nil
	}}
}

func offerByID(offers []Offer, id string) (Offer, bool) {
	for _, o := range offers {
		if o.ID == id {
			return o, true
		}
	}
	return Offer{}, false
}

// lambdaServer answers like Lambda's GET /api/v1/instance-types, with the
// key as a bearer token; answer429 first answers that many 429s.
func lambdaServer(t *testing.T, body []byte, answer429 int32) (*httptest.Server, *atomic.Int32) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		if r.Method != http.MethodGet || r.URL.Path != "/api/v1/instance-types" {
			http.Error(w, `{"error":{"code":"global/not-found"}}`, http.StatusNotFound)
			return
		}
		if r.Header.Get("Authorization") != "Bearer lambda-key" {
			http.Error(w, `{"error":{"code":"global/invalid-api-key","message":"API key was invalid, expired, or deleted."}}`, http.StatusUnauthorized)
			return
		}
		if n <= answer429 {
			w.Header().Set("Retry-After", "7")
			http.Error(w, `{"error":{"code":"global/too-many-requests"}}`, http.StatusTooManyRequests)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

// TestLambdaProvider: each instance type gives an offer per region with
// capacity, priced price_cents_per_hour/100 for its specs.gpus GPUs; a
// type without capacity gives none; the type with a string price and the
// one without GPUs are skipped and counted; the rest is kept.
func TestLambdaProvider(t *testing.T) {
	srv, _ := lambdaServer(t, readFixture(t, "lambda_instance_types.json"), 0)
	var waits []time.Duration
	l := &Lambda{BaseURL: srv.URL, APIKey: "lambda-key", HTTPOptions: recordSleeps(&waits)}
	offers, skipped, err := l.FetchOffers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if skipped != 2 {
		t.Errorf("skipped %d instance types, want 2 (the string price and the one without GPUs)", skipped)
	}
	if len(offers) != 4 {
		t.Fatalf("%d offers, want 4 (H100 in 2 regions, A10, A6000): %+v", len(offers), offers)
	}
	h, ok := offerByID(offers, "gpu_8x_h100_sxm5@us-west-1")
	if !ok || h.Provider != "lambda" || h.NumGPUs != 8 || h.USDPerHour != 23.92 || math.Abs(h.PerGPUHour()-2.99) > 1e-12 ||
		h.Location != "us-west-1" || h.GPUName != "H100 (80 GB SXM5)" || h.GPURAMGB != 80 || h.Spot {
		t.Errorf("H100 offer %+v", h)
	}
	if a, ok := offerByID(offers, "gpu_2x_a6000@us-south-1"); !ok || a.GPUName != "RTX A6000 (48 GB)" || a.PerGPUHour() != 0.8 {
		t.Errorf("A6000 offer (GPU from description) %+v", a)
	}
	if _, ok := offerByID(offers, "gpu_1x_a100_sxm4@us-east-1"); ok {
		t.Error("an instance type without capacity gave an offer")
	}
	// Grouped with the other providers' names of the same GPU.
	by := ByModel(offers)
	if mp := by["h100 sxm"]; mp.GPUName != "H100 SXM" || mp.Offers != 2 || math.Abs(mp.Cheapest-2.99) > 1e-12 {
		t.Errorf("H100 SXM: %+v", mp)
	}
	if mp := by["a10"]; mp.Offers != 1 || mp.Cheapest != 0.75 {
		t.Errorf("A10: %+v", mp)
	}
	// A wrong key is not retried.
	l.APIKey = "wrong"
	var he *HTTPError
	if _, _, err := l.FetchOffers(context.Background()); !errors.As(err, &he) || he.Status != 401 || len(waits) != 0 {
		t.Errorf("wrong key: %v (waits %v)", err, waits)
	}
}

// runpodServer answers like RunPod's GraphQL endpoint.
func runpodServer(t *testing.T, body []byte, answer429 int32) (*httptest.Server, *atomic.Int32) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		var q struct{ Query string }
		b, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.Path != "/graphql" || json.Unmarshal(b, &q) != nil || !strings.Contains(q.Query, "gpuTypes") ||
			!strings.Contains(q.Query, "communitySpotPrice") || !strings.Contains(q.Query, "stockStatus") {
			http.Error(w, `{"errors":[{"message":"bad request"}]}`, http.StatusBadRequest)
			return
		}
		if r.Header.Get("Authorization") != "Bearer runpod-key" || r.URL.Query().Get("api_key") != "" {
			http.Error(w, `{"errors":[{"message":"Unauthorized"}]}`, http.StatusUnauthorized)
			return
		}
		if n <= answer429 {
			w.Header().Set("Retry-After", "7")
			http.Error(w, `{"errors":[{"message":"rate limited"}]}`, http.StatusTooManyRequests)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

// TestRunPodProvider: each GPU type in stock gives its Secure and
// Community Cloud offers, on-demand and spot apart, of one GPU; the type
// out of stock gives none, the type no cloud offers none, and the type
// with a string price is skipped and counted.
func TestRunPodProvider(t *testing.T) {
	srv, _ := runpodServer(t, readFixture(t, "runpod_gpu_types.json"), 0)
	r := &RunPod{URL: srv.URL + "/graphql", APIKey: "runpod-key"}
	offers, skipped, err := r.FetchOffers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if skipped != 1 {
		t.Errorf("skipped %d GPU types, want 1 (L40S with a string price)", skipped)
	}
	if len(offers) != 7 {
		t.Fatalf("%d offers, want 7 (H100: 3, RTX 4090: 4): %+v", len(offers), offers)
	}
	if o, ok := offerByID(offers, "NVIDIA H100 80GB HBM3 secure spot"); !ok || !o.Spot || o.PerGPUHour() != 1.75 || o.NumGPUs != 1 || o.GPURAMGB != 80 || o.Provider != "runpod" {
		t.Errorf("H100 secure spot %+v", o)
	}
	by := ByModel(offers)
	h := by["h100 sxm"]
	if h.Offers != 2 || h.Cheapest != 2.69 || h.Median != (2.69+2.99)/2 || h.SpotOffers != 1 || h.CheapestSpot != 1.75 || h.CheapestSpotOffer.ID != "NVIDIA H100 80GB HBM3 secure spot" {
		t.Errorf("H100 SXM on-demand and spot apart: %+v", h)
	}
	if g := by["rtx 4090"]; g.Cheapest != 0.34 || g.CheapestSpot != 0.2 || g.CheapestOffer.ID != "NVIDIA GeForce RTX 4090 community" {
		t.Errorf("RTX 4090: %+v", g)
	}
	if _, ok := by["a100 pcie"]; ok {
		t.Error("a GPU type out of stock gave offers")
	}
	// GraphQL errors come with HTTP 200: an error, not an empty catalog.
	if _, _, err := ParseRunPodGPUTypes([]byte(`{"errors":[{"message":"Something went wrong"}],"data":null}`), "runpod"); err == nil || !strings.Contains(err.Error(), "Something went wrong") {
		t.Errorf("GraphQL error: %v", err)
	}
}

// azureServer answers like Azure's retail prices API in two pages, the
// first linking to the second with NextPageLink; failPage2 429s first
// answer that many 429s on page 2.
func azureServer(t *testing.T, failPage2 int32) (*httptest.Server, *atomic.Int32, *atomic.Value) {
	p1, p2 := readFixture(t, "azure_page1.json"), readFixture(t, "azure_page2.json")
	var page2Calls atomic.Int32
	var filter atomic.Value
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/retail/prices" || r.URL.Query().Get("currencyCode") != "'USD'" {
			http.Error(w, `{"Error":"bad path"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("$skip") == "100" {
			if page2Calls.Add(1) <= failPage2 {
				w.Header().Set("Retry-After", "7")
				http.Error(w, `{"Error":"too many requests"}`, http.StatusTooManyRequests)
				return
			}
			w.Write(p2)
			return
		}
		filter.Store(r.URL.Query().Get("$filter"))
		q := r.URL.Query()
		q.Set("$skip", "100")
		next := srv.URL + "/api/retail/prices?" + q.Encode()
		nb, _ := json.Marshal(next)
		w.Write([]byte(strings.Replace(string(p1), `"{{NEXT}}"`, string(nb), 1)))
	}))
	t.Cleanup(srv.Close)
	return srv, &page2Calls, &filter
}

// TestAzureProviderPages: the provider asks for the GPU VM sizes'
// Consumption prices and follows NextPageLink to the last page; Linux
// on-demand and spot/low-priority prices are offers kept apart, Windows,
// reservation and other sizes' items are not offers, and the item with a
// string price and the one priced 0 are skipped and counted.
func TestAzureProviderPages(t *testing.T) {
	srv, page2Calls, filter := azureServer(t, 0)
	a := &Azure{BaseURL: srv.URL}
	offers, skipped, err := a.FetchOffers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if f, _ := filter.Load().(string); !strings.Contains(f, "serviceName eq 'Virtual Machines'") || !strings.Contains(f, "priceType eq 'Consumption'") ||
		!strings.Contains(f, "armSkuName eq 'Standard_ND96isr_H100_v5'") {
		t.Errorf("filter %q", f)
	}
	if page2Calls.Load() != 1 {
		t.Errorf("page 2 fetched %d times, want once", page2Calls.Load())
	}
	if skipped != 2 {
		t.Errorf("skipped %d items, want 2 (the string price, the zero price)", skipped)
	}
	if len(offers) != 4 {
		t.Fatalf("%d offers, want 4: %+v", len(offers), offers)
	}
	if o, ok := offerByID(offers, "Standard_ND96isr_H100_v5@eastus"); !ok || o.Spot || o.NumGPUs != 8 || math.Abs(o.PerGPUHour()-98.32/8) > 1e-12 || o.Location != "eastus" || o.Provider != "azure" {
		t.Errorf("ND H100 v5 on-demand %+v", o)
	}
	if o, ok := offerByID(offers, "Standard_ND96isr_H100_v5@eastus spot"); !ok || !o.Spot || o.USDPerHour != 39.33 {
		t.Errorf("ND H100 v5 spot %+v", o)
	}
	if o, ok := offerByID(offers, "Standard_NC24ads_A100_v4@westeurope low priority"); !ok || !o.Spot || o.PerGPUHour() != 1.47 {
		t.Errorf("NC A100 v4 low priority %+v", o)
	}
	by := ByModel(offers)
	if h := by["h100 sxm"]; h.Offers != 1 || h.SpotOffers != 1 || math.Abs(h.CheapestSpot-39.33/8) > 1e-12 {
		t.Errorf("H100 SXM %+v", h)
	}
	if a := by["a100 pcie"]; a.Offers != 1 || a.Cheapest != 3.67 {
		t.Errorf("A100 PCIE %+v (page 2's offer)", a)
	}
}

// TestAzureRefusesForeignNextPageLink: a NextPageLink to another host is
// not followed; the fetch fails rather than read another server's answer.
func TestAzureRefusesForeignNextPageLink(t *testing.T) {
	p1 := readFixture(t, "azure_page1.json")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(strings.Replace(string(p1), "{{NEXT}}", "https://prices.example.org/api/retail/prices?$skip=100", 1)))
	}))
	defer srv.Close()
	if _, _, err := (&Azure{BaseURL: srv.URL}).FetchOffers(context.Background()); err == nil || !strings.Contains(err.Error(), "is not on") {
		t.Errorf("foreign NextPageLink: %v", err)
	}
	base, _ := url.Parse(DefaultAzureURL)
	for link, same := range map[string]bool{
		"https://prices.azure.com:443/api/retail/prices?$skip=100": true, // as Azure writes it
		"https://PRICES.azure.com/api/retail/prices?$skip=100":     true,
		"http://prices.azure.com/api/retail/prices":                false,
		"https://prices.azure.com:8443/api/retail/prices":          false,
		"https://prices.azure.com.example.org/api/retail/prices":   false,
	} {
		u, _ := url.Parse(link)
		if sameOrigin(u, base) != same {
			t.Errorf("sameOrigin(%s, %s) = %v", link, base, !same)
		}
	}
}

// TestProvidersRetryRateLimits: each provider waits out HTTP 429 with its
// Retry-After and then reads the answer; Azure retries the page that was
// limited, not the pages before it.
func TestProvidersRetryRateLimits(t *testing.T) {
	ls, lcalls := lambdaServer(t, readFixture(t, "lambda_instance_types.json"), 2)
	rs, rcalls := runpodServer(t, readFixture(t, "runpod_gpu_types.json"), 2)
	as, page2Calls, _ := azureServer(t, 2)
	for _, tc := range []struct {
		name  string
		p     func(HTTPOptions) Provider
		calls *atomic.Int32
	}{
		{"lambda", func(o HTTPOptions) Provider {
			return &Lambda{BaseURL: ls.URL, APIKey: "lambda-key", HTTPOptions: o}
		}, lcalls},
		{"runpod", func(o HTTPOptions) Provider {
			return &RunPod{URL: rs.URL + "/graphql", APIKey: "runpod-key", HTTPOptions: o}
		}, rcalls},
		{"azure", func(o HTTPOptions) Provider { return &Azure{BaseURL: as.URL, HTTPOptions: o} }, page2Calls},
	} {
		var waits []time.Duration
		offers, _, err := tc.p(recordSleeps(&waits)).FetchOffers(context.Background())
		if err != nil || len(offers) == 0 {
			t.Errorf("%s: %d offers, %v", tc.name, len(offers), err)
			continue
		}
		if tc.calls.Load() != 3 || len(waits) != 2 || waits[0] < 7*time.Second || waits[1] < 7*time.Second {
			t.Errorf("%s: %d calls, waits %v: want 2 retries of at least Retry-After 7s", tc.name, tc.calls.Load(), waits)
		}
		// Always limited: gives up after MaxAttempts with the 429.
		tc.calls.Store(-100)
		opts := recordSleeps(&waits)
		opts.MaxAttempts = 3
		var he *HTTPError
		if _, _, err := tc.p(opts).FetchOffers(context.Background()); !errors.As(err, &he) || he.Status != 429 {
			t.Errorf("%s always limited: %v", tc.name, err)
		}
	}
}

// TestProvidersRejectMalformedAnswers: an answer that is not the API's
// shape is an error (the watcher then keeps the provider's last good
// catalog), not an empty catalog.
func TestProvidersRejectMalformedAnswers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		parse func([]byte) error
		bad   []string
	}{
		{"lambda", func(b []byte) error { _, _, err := ParseLambdaInstanceTypes(b, "lambda"); return err },
			[]string{`<html>502 Bad Gateway</html>`, `{"error":{"code":"x"}}`, `{"data":[1,2]}`, ``}},
		{"runpod", func(b []byte) error { _, _, err := ParseRunPodGPUTypes(b, "runpod"); return err },
			[]string{`<html></html>`, `{"data":{}}`, `{"data":{"gpuTypes":{"a":1}}}`, `{"errors":[{"message":"Unauthorized"}]}`}},
		{"azure", func(b []byte) error { _, _, _, err := ParseAzureRetailPage(b, "azure"); return err },
			[]string{`not json`, `{"BillingCurrency":"USD"}`, `{"Items":{}}`}},
	} {
		for _, b := range tc.bad {
			if err := tc.parse([]byte(b)); err == nil {
				t.Errorf("%s accepted %q", tc.name, b)
			}
		}
	}
}

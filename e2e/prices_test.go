package e2e

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/trainmeter/trainmeter/internal/testkit"
)

// fakePriceAPI answers like a provider's API from a fixture of
// collector/internal/pricing/prices/testdata, after checking the request (want); broken makes it
// answer an HTML error page with status 200, as a proxy in maintenance
// does.
type fakePriceAPI struct {
	srv    *httptest.Server
	calls  atomic.Int32
	broken atomic.Bool
}

func newFakePriceAPI(t *testing.T, fixture string, want func(*http.Request) bool, first429 bool, body func(srvURL string, fixture []byte, r *http.Request) []byte) *fakePriceAPI {
	t.Helper()
	b, err := os.ReadFile("../collector/internal/pricing/prices/testdata/" + fixture)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakePriceAPI{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := f.calls.Add(1)
		if !want(r) {
			http.Error(w, "unexpected request "+r.Method+" "+r.URL.String(), http.StatusBadRequest)
			return
		}
		if first429 && n == 1 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":"too many requests"}`, http.StatusTooManyRequests)
			return
		}
		if f.broken.Load() {
			w.Write([]byte("<html><body>down for maintenance</body></html>"))
			return
		}
		out := b
		if body != nil {
			out = body(f.srv.URL, b, r)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(out)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// TestPricesFromSeveralProviders: one collector fetches
// from Lambda (rate-limited once), RunPod and Azure (two pages) — local
// servers answering each API's documented shape — while vast.ai cannot be
// reached. The catalog holds every answering provider's offers with
// provider, spot/on-demand and region; a GPU's price is the cheapest
// on-demand offer across providers; `prices --provider` filters; a
// provider whose answer turns bad keeps its last good offers.
func TestPricesFromSeveralProviders(t *testing.T) {
	t.Parallel()
	lambda := newFakePriceAPI(t, "lambda_instance_types.json", func(r *http.Request) bool {
		return r.Method == http.MethodGet && r.URL.Path == "/api/v1/instance-types" && r.Header.Get("Authorization") == "Bearer lambda-e2e"
	}, true, nil)
	runpod := newFakePriceAPI(t, "runpod_gpu_types.json", func(r *http.Request) bool {
		return r.Method == http.MethodPost && r.URL.Path == "/graphql" && r.Header.Get("Authorization") == "Bearer runpod-e2e"
	}, false, nil)
	page2, err := os.ReadFile("../collector/internal/pricing/prices/testdata/azure_page2.json")
	if err != nil {
		t.Fatal(err)
	}
	azure := newFakePriceAPI(t, "azure_page1.json", func(r *http.Request) bool {
		return r.Method == http.MethodGet && r.URL.Path == "/api/retail/prices" && strings.Contains(r.URL.Query().Get("$filter"), "priceType eq 'Consumption'")
	}, false, func(srvURL string, b []byte, r *http.Request) []byte {
		if r.URL.Query().Get("$skip") != "" {
			return page2
		}
		q := r.URL.Query()
		q.Set("$skip", "100")
		next, _ := json.Marshal(srvURL + "/api/retail/prices?" + q.Encode())
		return []byte(strings.Replace(string(b), `"{{NEXT}}"`, string(next), 1))
	})
	dir := t.TempDir()
	for name, key := range map[string]string{"lambda.key": "lambda-e2e\n", "runpod.key": "runpod-e2e\n"} {
		if err := os.WriteFile(dir+"/"+name, []byte(key), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	unreachable := "http://" + testkit.FreeAddr(t) // nothing listens: vast.ai is down
	c := startCollector(t, "--price-provider", "vastai,lambda,runpod,azure", "--price-fetch-interval", "0",
		"--vastai-url", unreachable,
		"--lambda-url", lambda.srv.URL, "--lambda-key-file", dir+"/lambda.key",
		"--runpod-url", runpod.srv.URL+"/graphql", "--runpod-key-file", dir+"/runpod.key",
		"--azure-url", azure.srv.URL)

	type status struct {
		Provider        string
		Offers, Skipped int
		Error           string
	}
	var fetched struct {
		Offers    int
		Providers []status
	}
	out := c.cli("prices", "fetch", "--json")
	if err := json.Unmarshal([]byte(out), &fetched); err != nil {
		t.Fatal(out, err)
	}
	byName := func(ss []status) map[string]status {
		m := map[string]status{}
		for _, s := range ss {
			m[s.Provider] = s
		}
		return m
	}
	got := byName(fetched.Providers)
	if fetched.Offers != 15 || got["lambda"].Offers != 4 || got["lambda"].Skipped != 2 || got["runpod"].Offers != 7 || got["runpod"].Skipped != 1 ||
		got["azure"].Offers != 4 || got["azure"].Skipped != 2 || got["vastai"].Error == "" || got["vastai"].Offers != 0 {
		t.Errorf("prices fetch: %s", out)
	}
	if lambda.calls.Load() != 2 {
		t.Errorf("Lambda called %d times, want 2 (one 429 with Retry-After, then the answer)", lambda.calls.Load())
	}

	type offer struct {
		ID, Provider, Location string
		Spot                   bool
		USDPerGPUHour          float64 `json:"usd_per_gpu_hour"`
	}
	type gpuPrice struct {
		GpuName      string   `json:"gpu_name"`
		Cheapest     float64  `json:"cheapest_usd_per_gpu_hour"`
		CheapestSpot float64  `json:"cheapest_spot_usd_per_gpu_hour"`
		Providers    []string `json:"providers"`
		CheapestOf   offer    `json:"cheapest"`
		Recommended  []offer
	}
	var list struct{ Gpus []gpuPrice }
	out = c.cli("prices", "--gpu", "NVIDIA H100 80GB HBM3", "--json")
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(out, err)
	}
	if len(list.Gpus) != 1 {
		t.Fatalf("prices --gpu: %s", out)
	}
	h := list.Gpus[0]
	if h.GpuName != "H100 SXM" || strings.Join(h.Providers, ",") != "azure,lambda,runpod" || h.Cheapest != 2.69 || h.CheapestOf.Provider != "runpod" ||
		h.CheapestSpot != 1.75 || len(h.Recommended) != 5 {
		t.Errorf("H100 SXM across providers: %s", out)
	}
	regions := map[string]bool{}
	for _, o := range h.Recommended {
		if o.Provider == "lambda" || o.Provider == "azure" {
			regions[o.Location] = true
		}
	}
	if !regions["us-east-1"] && !regions["eastus"] {
		t.Errorf("recommended offers without their region: %s", out)
	}

	table := c.cli("prices", "--provider", "lambda")
	if !regexp.MustCompile(`H100 SXM +2\.990 +lambda `).MatchString(table) || strings.Contains(table, "RTX 4090") ||
		!regexp.MustCompile(`(?m)^vastai +0 +0 +never +- +failed `).MatchString(table) {
		t.Errorf("prices --provider lambda:\n%s", table)
	}
	if all := c.cli("prices"); !regexp.MustCompile(`RTX 4090 +0\.340 +runpod +\S+ +2 +0\.200 +2 `).MatchString(all) ||
		!regexp.MustCompile(`A100 PCIE +3\.670 +azure `).MatchString(all) {
		t.Errorf("prices:\n%s", all)
	}

	// Lambda's answer turns bad: its last good offers stay, with the error.
	lambda.broken.Store(true)
	out = c.cli("prices", "fetch", "--json")
	fetched.Providers = nil
	if err := json.Unmarshal([]byte(out), &fetched); err != nil {
		t.Fatal(out, err)
	}
	if l := byName(fetched.Providers)["lambda"]; l.Offers != 4 || !strings.Contains(l.Error, "Lambda instance types") || fetched.Offers != 15 {
		t.Errorf("after a bad Lambda answer: %s", out)
	}
	table = c.cli("prices", "--provider", "lambda")
	if !regexp.MustCompile(`H100 SXM +2\.990 +lambda `).MatchString(table) || !regexp.MustCompile(`(?m)^lambda +4 +2 +\S+ +\S+ +failed .*kept\)$`).MatchString(table) {
		t.Errorf("prices --provider lambda after a bad answer:\n%s", table)
	}
	var one struct{ Gpus []gpuPrice }
	if err := json.Unmarshal([]byte(c.cli("prices", "--gpu", "a10", "--json")), &one); err != nil || len(one.Gpus) != 1 || math.Abs(one.Gpus[0].Cheapest-0.75) > 1e-12 {
		t.Errorf("Lambda's A10 after the bad answer: %+v %v", one, err)
	}
}

package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/testkit"
)

// stopDaemon stops a daemon started by daemon() and waits until it is gone.
func stopDaemon(c *cluster, cmd *exec.Cmd) {
	c.t.Helper()
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		c.t.Fatal(err)
	}
	c.eventually("collector exited", func() bool { return syscall.Kill(cmd.Process.Pid, 0) != nil })
}

// hookReceiver is a webhook receiver on loopback that counts what it
// accepted. It answers 503 to the first POST of every alert (the sender must
// retry) and 200 afterwards.
type hookReceiver struct {
	srv        *httptest.Server
	mu         sync.Mutex
	posts      int
	refused    map[string]bool
	accepted   map[string][]map[string]any // alert id → the bodies accepted (want exactly one)
	acceptedAt map[string][]time.Time      // alert id → when each was accepted
	badKeys    []string                    // POSTs whose Idempotency-Key is not their alert's id
}

func newHookReceiver(t *testing.T) *hookReceiver {
	h := &hookReceiver{refused: map[string]bool{}, accepted: map[string][]map[string]any{}, acceptedAt: map[string][]time.Time{}}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var a map[string]any
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" || json.NewDecoder(r.Body).Decode(&a) != nil {
			http.Error(w, "want a JSON POST", http.StatusBadRequest)
			return
		}
		id, _ := a["id"].(string)
		h.mu.Lock()
		defer h.mu.Unlock()
		h.posts++
		if key := r.Header.Get("Idempotency-Key"); key != id || id == "" {
			h.badKeys = append(h.badKeys, fmt.Sprintf("Idempotency-Key %q on alert %q", key, id))
		}
		if !h.refused[id] {
			h.refused[id] = true
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		h.accepted[id] = append(h.accepted[id], a)
		h.acceptedAt[id] = append(h.acceptedAt[id], time.Now())
	}))
	t.Cleanup(h.srv.Close)
	return h
}

// budgetAlerts returns the accepted budget alerts of scope by
// "threshold/actual|projected" → how many times accepted.
func (h *hookReceiver) budgetAlerts(scope string) (map[string]int, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]int{}
	for _, bodies := range h.accepted {
		for _, a := range bodies {
			if a["kind"] != "budget" || a["scope"] != scope {
				continue
			}
			kind := "actual"
			if a["projected"] == true {
				kind = "projected"
			}
			out[fmt.Sprintf("%v/%s", a["threshold"], kind)]++
		}
	}
	return out, h.posts
}

// trainSim runs the example trainer against sock and returns its output.
func trainSim(t *testing.T, sock string, args ...string) (string, time.Duration) {
	t.Helper()
	cmd := exec.Command("python3", append([]string{"clients/python/examples/train_sim.py", "--socket", sock}, args...)...)
	cmd.Dir = ".."
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("train_sim: %v\n%s", err, out)
	}
	return string(out), time.Since(start)
}

// TestBudgetAlertsReachWebhookOnce: a run with a budget crosses 50, 75, 90
// and 100 %; each alert (on actual and on projected spend) reaches a real
// webhook receiver exactly once although the receiver refuses every first
// POST, and `trainmeter alerts --json` lists the same alerts.
func TestBudgetAlertsReachWebhookOnce(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	t.Parallel()
	hook := newHookReceiver(t)
	// 2 sim GPUs at $144/GPU-hour cost $0.08/s: the $0.80 budget is used up
	// after about 10 s of the 15 s run.
	addr, data, statusAddr := testkit.FreeAddr(t), filepath.Join(t.TempDir(), "data"), testkit.FreeAddr(t)
	collectorArgs := []string{"--gpu-price-per-hour", "144", "--webhook", hook.srv.URL + "/alerts", "--status-listen", statusAddr}
	c, collector := collectorAt(t, addr, data, collectorArgs...)
	sock := c.startAgent("budget-node", "sim:2")
	c.waitStreaming("budget-node")
	if out := c.cli("budget", "set", "e2e-team-budget", "0.80"); !strings.Contains(out, "budget e2e-team-budget: $0.800 in total") {
		t.Fatalf("budget set: %q", out)
	}

	out, _ := trainSim(t, sock, "--run-id", "b1", "--model", "budget-model", "--gpus", "0,1", "--budget-scope", "e2e-team-budget",
		"--duration-s", "15", "--step-time", "0.1")
	if strings.Contains(out, "stopped=") {
		t.Fatalf("a budget without the stop policy stopped the run: %s", out)
	}
	r := c.waitEnded("b1")
	if r.GetTotalCostUsd() < 0.8 || r.BudgetScope != "e2e-team-budget" {
		t.Fatalf("run cost $%v scope %q: want more than the $0.80 budget", r.GetTotalCostUsd(), r.BudgetScope)
	}
	want := []string{"0.5/actual", "0.75/actual", "0.9/actual", "1/actual", "0.5/projected", "0.75/projected", "0.9/projected", "1/projected"}
	c.eventually("all 8 alerts at the receiver", func() bool {
		got, _ := hook.budgetAlerts("e2e-team-budget")
		return len(got) == len(want)
	})
	// Anything extra (a redelivery) would be queued or in flight: wait
	// until the collector's webhook senders are idle.
	c.eventually("webhook senders idle", func() bool { return collectorAlerts(t, statusAddr).WebhooksBusy == 0 })
	got, posts := hook.budgetAlerts("e2e-team-budget")
	for _, k := range want {
		if got[k] != 1 {
			t.Errorf("alert %s accepted %d times, want exactly once (all: %v)", k, got[k], got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("alerts accepted: %v, want exactly %v", got, want)
	}
	if posts != 2*len(want) {
		t.Errorf("%d POSTs, want %d (each alert refused once, then accepted)", posts, 2*len(want))
	}
	// The whole list, one entry per accepted POST, and each alert's figures:
	// an actual alert fires on spend (at most the run's final cost) that
	// reached its threshold, a projected one on a projection that did.
	var gotList []string
	hook.mu.Lock()
	for _, bodies := range hook.accepted {
		for _, a := range bodies {
			if a["kind"] != "budget" || a["scope"] != "e2e-team-budget" {
				continue
			}
			kind := "actual"
			if a["projected"] == true {
				kind = "projected"
			}
			gotList = append(gotList, fmt.Sprintf("%v/%s", a["threshold"], kind))
			spent, _ := a["spent_usd"].(float64)
			limit, _ := a["budget_usd"].(float64)
			th, _ := a["threshold"].(float64)
			if limit != 0.8 || spent/limit < th || (kind == "actual" && spent > r.GetTotalCostUsd()+1e-9) {
				t.Errorf("%s alert at %v: spent_usd %v of budget_usd %v (run's final cost %v)", kind, th, spent, limit, r.GetTotalCostUsd())
			}
		}
	}
	hook.mu.Unlock()
	sortedWant := slices.Sorted(slices.Values(want))
	if slices.Sort(gotList); !slices.Equal(gotList, sortedWant) {
		t.Errorf("alerts accepted %v, want %v", gotList, sortedWant)
	}

	var listed struct {
		Alerts []struct {
			ID, Kind, Severity, Scope, Message string
			Threshold                          float64
			Projected                          bool
			RunIDs                             []string `json:"run_ids"`
		}
	}
	if err := json.Unmarshal([]byte(c.cli("alerts", "--json")), &listed); err != nil {
		t.Fatal(err)
	}
	sev := map[float64]string{0.5: "info", 0.75: "warning", 0.9: "critical", 1: "exceeded"}
	hook.mu.Lock()
	var listedKeys []string
	for _, a := range listed.Alerts {
		if a.Kind != "budget" || a.Scope != "e2e-team-budget" || sev[a.Threshold] != a.Severity || len(hook.accepted[a.ID]) != 1 {
			t.Errorf("listed alert %+v: wrong severity, or not the one delivered", a)
		}
		if !slices.Equal(a.RunIDs, []string{"b1"}) {
			t.Errorf("listed alert %+v: run_ids %v, want [b1]", a, a.RunIDs)
		}
		kind := "actual"
		if a.Projected {
			kind = "projected"
		}
		listedKeys = append(listedKeys, fmt.Sprintf("%v/%s", a.Threshold, kind))
	}
	hook.mu.Unlock()
	if slices.Sort(listedKeys); !slices.Equal(listedKeys, sortedWant) {
		t.Errorf("alerts --json lists %v, want %v", listedKeys, sortedWant)
	}
	if len(listed.Alerts) != len(want) {
		t.Errorf("alerts --json lists %d alerts, want %d", len(listed.Alerts), len(want))
	}

	var st struct {
		Budgets []struct {
			SpentUsd float64 `json:"spent_usd"`
			Ratio    float64
			Runs     int
		}
	}
	if err := json.Unmarshal([]byte(c.cli("budget", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Budgets) != 1 || st.Budgets[0].Runs != 1 || math.Abs(st.Budgets[0].SpentUsd-r.GetTotalCostUsd()) > 1e-9 || st.Budgets[0].Ratio < 1 {
		t.Errorf("budget status %+v, run cost %v", st, r.GetTotalCostUsd())
	}
	if table := c.cli("budget"); !strings.Contains(table, "e2e-team-budget") || !strings.Contains(table, "alert") {
		t.Errorf("budget table:\n%s", table)
	}

	// A restarted collector (same data) evaluates the budget again at once
	// and fires nothing new.
	stopDaemon(c, collector)
	c, _ = collectorAt(t, addr, data, collectorArgs...)
	c.eventually("a budget evaluation after the restart, its alerts (if any) sent", func() bool {
		a := collectorAlerts(t, statusAddr)
		return a.BudgetEvaluations >= 1 && a.WebhooksBusy == 0
	})
	if got, posts := hook.budgetAlerts("e2e-team-budget"); posts != 2*len(want) || len(got) != len(want) {
		t.Errorf("after a restart: %d POSTs, alerts %v: an alert fired again", posts, got)
	}
	if out := c.cli("alerts"); strings.Count(out, "budget e2e-team-budget") != len(want) {
		t.Errorf("alerts after the restart:\n%s", out)
	}
}

// TestStopBudgetStopsTrainer: a budget with the stop policy makes the
// example trainer stop early with the budget's reason.
func TestStopBudgetStopsTrainer(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	c := startCollector(t, "--gpu-price-per-hour", "144")
	sock := c.startAgent("stop-node", "sim:2")
	c.waitStreaming("stop-node")
	c.cli("budget", "set", "team:e2e-stop", "0.20", "--policy", "stop")

	// $0.20 at $0.08/s: exceeded after about 3 s of a 60 s run.
	out, took := trainSim(t, sock, "--run-id", "s1", "--model", "stop-model", "--gpus", "0,1", "--label", "team=e2e-stop",
		"--duration-s", "60", "--step-time", "0.1")
	m := regexp.MustCompile(`steps=(\d+) .* stopped='budget team:e2e-stop exceeded \((\d+)%\)'`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("trainer did not stop for the budget:\n%s", out)
	}
	if took > 45*time.Second || m[1] == "600" {
		t.Errorf("trainer ran %v (%s steps): the stop came too late", took, m[1])
	}
	r := c.waitEnded("s1")
	if r.GetTotalCostUsd() < 0.2 || r.Labels["team"] != "e2e-stop" {
		t.Errorf("run cost %v labels %v", r.GetTotalCostUsd(), r.Labels)
	}
	// The stop is the run's end status.
	if r.EndStatus != "stopped: budget" || c.csvRow("s1")["end_status"] != "stopped: budget" {
		t.Errorf("end status %q, want stopped: budget", r.EndStatus)
	}
	listed := c.cli("alerts", "--kind", "budget")
	if !strings.Contains(listed, "budget team:e2e-stop (total): spent") || !strings.Contains(listed, "exceeded") {
		t.Errorf("alerts:\n%s", listed)
	}
}

// TestPriceAlertsFromVastAILikeServer: the collector fetches offers (on
// demand, `trainmeter prices fetch`) from a local server that answers like
// vast.ai's bundles endpoint, with a 429 first; RTX 4090 prices move +5 %,
// then -12 %, then +25 % against the trailing average: the drop and the
// surge alert, the 5 % move does not.
func TestPriceAlertsFromVastAILikeServer(t *testing.T) {
	t.Parallel()
	fixture, err := os.ReadFile("../collector/internal/pricing/prices/testdata/vastai_offers.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Offers []map[string]any `json:"offers"`
	}
	if err := json.Unmarshal(fixture, &doc); err != nil {
		t.Fatal(err)
	}
	factors := []float64{1, 1, 1, 1.05, 1, 0.88, 1.25}
	var mu sync.Mutex
	calls, served := 0, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if r.URL.Path != "/api/v0/bundles/" || r.Header.Get("Authorization") != "Bearer e2e-key" {
			http.Error(w, "bad request", http.StatusUnauthorized)
			return
		}
		if calls == 1 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":"too many requests"}`, http.StatusTooManyRequests)
			return
		}
		f := factors[min(served, len(factors)-1)]
		served++
		offers := make([]map[string]any, len(doc.Offers))
		for i, o := range doc.Offers {
			c := map[string]any{}
			for k, v := range o {
				c[k] = v
			}
			if c["gpu_name"] == "RTX 4090" {
				c["dph_total"] = c["dph_total"].(float64) * f
			}
			offers[i] = c
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"offers": offers})
	}))
	defer srv.Close()
	keyFile := t.TempDir() + "/vast.key"
	if err := os.WriteFile(keyFile, []byte("e2e-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startCollector(t, "--price-provider", "vastai", "--vastai-url", srv.URL, "--vastai-key-file", keyFile, "--price-fetch-interval", "0")
	var alertsAfter []int
	for range factors {
		var res struct {
			Offers, Alerts int
		}
		if err := json.Unmarshal([]byte(c.cli("prices", "fetch", "--json")), &res); err != nil {
			t.Fatal(err)
		}
		if res.Offers != 6 {
			t.Fatalf("fetched %d offers, want the fixture's 6 priceable ones", res.Offers)
		}
		alertsAfter = append(alertsAfter, res.Alerts)
	}
	if want := []int{0, 0, 0, 0, 0, 1, 1}; fmt.Sprint(alertsAfter) != fmt.Sprint(want) {
		t.Errorf("alerts per fetch %v, want %v (the 12 %% drop and the 25 %% surge only)", alertsAfter, want)
	}
	var listed struct {
		Alerts []struct {
			Kind, Severity string
			GpuName        string `json:"gpu_name"`
			Change         float64
		}
	}
	out := c.cli("alerts", "--kind", "price", "--json")
	if err := json.Unmarshal([]byte(out), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed.Alerts) != 2 || listed.Alerts[0].Change > -0.12 || listed.Alerts[1].Change < 0.25 || listed.Alerts[0].GpuName != "RTX 4090" {
		t.Errorf("price alerts: %s", out)
	}
	var prices struct {
		Gpus []struct {
			GpuName     string  `json:"gpu_name"`
			Cheapest    float64 `json:"cheapest_usd_per_gpu_hour"`
			Recommended []struct {
				ID    string
				Score float64
			}
		}
	}
	out = c.cli("prices", "--gpu", "rtx 4090", "--json")
	if err := json.Unmarshal([]byte(out), &prices); err != nil {
		t.Fatal(err)
	}
	if len(prices.Gpus) != 1 || math.Abs(prices.Gpus[0].Cheapest-0.35*1.25) > 1e-9 || len(prices.Gpus[0].Recommended) != 3 || prices.Gpus[0].Recommended[0].ID != "13254871" {
		t.Errorf("prices --gpu rtx 4090: %s", out)
	}
	table := c.cli("prices")
	// Models are shown by their canonical name (vast.ai's "A100 SXM4" is
	// the "A100 SXM" of every provider).
	for _, want := range []string{"RTX 4090", "H100 SXM", "A100 SXM", "+25.0%"} {
		if !strings.Contains(table, want) {
			t.Errorf("prices table lacks %q:\n%s", want, table)
		}
	}
}

// collectorAlerts reads the alerts block of the collector's GET /status
// (zero while it cannot be read, e.g. while the collector starts).
func collectorAlerts(t *testing.T, statusAddr string) (a struct {
	BudgetEvaluations uint64 `json:"budget_evaluations"`
	WebhooksBusy      int    `json:"webhooks_busy"`
}) {
	t.Helper()
	resp, err := http.Get("http://" + statusAddr + "/status")
	if err != nil {
		a.WebhooksBusy = -1
		return a
	}
	defer resp.Body.Close()
	var st struct {
		Alerts json.RawMessage `json:"alerts"`
	}
	if json.NewDecoder(resp.Body).Decode(&st) != nil || json.Unmarshal(st.Alerts, &a) != nil {
		a.WebhooksBusy = -1
	}
	return a
}

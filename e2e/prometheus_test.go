package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/trainmeter/trainmeter/internal/oteltest"
	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
)

// TestPrometheusScrapesTrainmeter has a real Prometheus (Debian package)
// scrape `trainmeter serve --prometheus-listen` (with the collector's read
// token, which the run-level series need) during a replayed 300 W
// workload and asks it, with promtool, for the run's J/token and the GPUs'
// power; every name the Grafana dashboard may use must be there too.
func TestPrometheusScrapesTrainmeter(t *testing.T) {
	t.Parallel()
	prometheus := oteltest.Tool(t, "prometheus")
	promtool := oteltest.Tool(t, "promtool")
	metricsAddr := testkit.FreeAddr(t)
	// The run-level series are for the read token (docs/otel.md): the
	// collector has one, and Prometheus scrapes with it.
	dir := t.TempDir()
	const readTok = "e2e-prometheus-read-token-7d1e"
	readFile := filepath.Join(dir, "read.token")
	if err := os.WriteFile(readFile, []byte(readTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	creds, _ := tlsfiles.StaticToken(readTok, true)
	c, _ := startSecureCollector(t, []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(creds)},
		"--prometheus-listen", metricsAddr, "--gpu-price-per-hour", "2", "--read-token-file", readFile)
	// The agent also serves its own GPUs directly (no collector in between).
	agentMetricsAddr := testkit.FreeAddr(t)
	sock := c.startAgent("prom-node", "replay:"+writeTrace(t, 2, 300, 300, 120), "--warmup", "30s", "--prometheus-listen", agentMetricsAddr)
	c.waitStreaming("prom-node")

	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
scrape_configs:
  - job_name: trainmeter
    authorization:
      credentials_file: %q
    static_configs:
      - targets: [%q]
  - job_name: trainmeter-agent
    static_configs:
      - targets: [%q]
`, readFile, metricsAddr, agentMetricsAddr)), 0o644); err != nil {
		t.Fatal(err)
	}
	promAddr := testkit.FreeAddr(t)
	oteltest.Start(t, "prometheus", prometheus, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+promAddr)
	server := "http://" + promAddr

	tr := dialTrainer(t, sock)
	tr.send(`{"event":"run_start","run_id":"prom-run","model":"llama-prom","backend":"torch","gpus":[0,1],"warmup_s":1}`)
	period := timedSteps(tr, "prom-run", 30, 512, 100*time.Millisecond)
	tr.send(`{"event":"run_end","run_id":"prom-run"}`)
	tr.sync()
	rep := c.waitEnded("prom-run")

	query := func(expr string) []oteltest.PromSample {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s, err := oteltest.PromQuery(ctx, promtool, server, expr)
		if err != nil {
			t.Logf("%v", err)
		}
		return s
	}
	defer func() {
		if t.Failed() {
			req, _ := http.NewRequest(http.MethodGet, "http://"+metricsAddr+"/metrics", nil)
			req.Header.Set("Authorization", "Bearer "+readTok)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Logf("--- trainmeter /metrics ---\n%s", b)
			}
		}
	}()

	jpt := `trainmeter_run_energy_per_token_joules{trainmeter_run_id="prom-run",job="trainmeter"}`
	tps := `trainmeter_run_throughput_per_second{trainmeter_run_id="prom-run",job="trainmeter"}`
	// The results are kept from inside Eventually: a later query could
	// come back empty (a failed promtool run) and must not be indexed.
	var jptS, tpsS []oteltest.PromSample
	oteltest.Eventually(t, 60*time.Second, "Prometheus to have the run's final J/token and tokens/s", func() bool {
		jptS, tpsS = query(jpt), query(tps)
		return len(jptS) == 1 && near(jptS[0].Value, rep.GetJPerToken(), 1e-9) && len(tpsS) == 1 && near(tpsS[0].Value, rep.GetTokPerS(), 1e-9)
	})
	if l := jptS[0].Labels; l["trainmeter_run_model"] != "llama-prom" || l["trainmeter_run_backend"] != "torch" {
		t.Errorf("J/token series labels %v", l)
	}
	t.Logf("J/token in Prometheus %v, collector report %v", jptS[0].Value, rep.GetJPerToken())
	checkWorkload(t, "Prometheus", tpsS[0].Value, jptS[0].Value, 512, period, 600)

	for _, job := range []string{"trainmeter", "trainmeter-agent"} {
		var power []oteltest.PromSample
		oteltest.Eventually(t, 30*time.Second, job+" GPU power in Prometheus", func() bool {
			power = query(fmt.Sprintf(`hw_power_watts{job=%q,trainmeter_node="prom-node",hw_type="gpu"}`, job))
			return len(power) == 2
		})
		for _, p := range power {
			if !near(p.Value, 300, 0.001) || p.Labels["hw_id"] == "" {
				t.Errorf("hw_power_watts%v = %v, want 300 W with an hw_id", p.Labels, p.Value)
			}
		}
	}
	// J/token is also the run's power ÷ its throughput (both after warmup):
	// the exported gauges agree with each other in PromQL.
	if s := query(`sum by (trainmeter_run_id) (trainmeter_run_power_watts{trainmeter_run_id="prom-run"}) / sum by (trainmeter_run_id) (trainmeter_run_throughput_per_second{trainmeter_run_id="prom-run"})`); len(s) != 1 || !near(s[0].Value, rep.GetJPerToken(), 1e-6) {
		t.Errorf("power / throughput = %v, want J/token %v", s, rep.GetJPerToken())
	}
	scraped, sourced := oteltest.DashboardMetrics(t)
	for _, name := range scraped {
		if s := query(fmt.Sprintf(`count(%s{job="trainmeter"})`, name)); len(s) != 1 || s[0].Value < 1 {
			t.Errorf("Prometheus has no series %s (deploy/grafana/metrics.txt lists it)", name)
		}
	}
	// Without the token a scrape gets the node-level series only.
	if resp, err := http.Get("http://" + metricsAddr + "/metrics"); err != nil {
		t.Error(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "prom-run") || strings.Contains(string(b), "llama-prom") || !strings.Contains(string(b), "hw_power_watts{") {
			t.Errorf("/metrics without the read token shows the run or lacks the GPUs:\n%s", b)
		}
	}
	// What the collector-down alert reads on this path besides `up`.
	if s := query(`target_info{job="trainmeter"}`); len(s) != 1 {
		t.Errorf(`target_info{job="trainmeter"}: %d series, want 1 (deploy/prometheus/trainmeter-rules.yml reads it)`, len(s))
	}
	checkDashboardOnPrometheus(t, query, sourced)
}

// checkDashboardOnPrometheus runs every query of the Grafana dashboard (its
// panels, rows included, and its variables) against the real Prometheus:
// each must return series, except those that read only in-process
// "source" metrics (budgets, recommendations: not fed in this workload), and
// every label a legend shows or a variable lists must be on them.
func checkDashboardOnPrometheus(t *testing.T, query func(string) []oteltest.PromSample, sourced []string) {
	t.Helper()
	d := oteltest.ReadDashboard(t)
	readsSource := func(expr string) bool {
		for _, n := range sourced {
			if strings.Contains(expr, n) {
				return true
			}
		}
		return false
	}
	// Range functions (increase over 1m) need a few scrapes: poll a while.
	results := make([][]oteltest.PromSample, len(d.Queries))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		var empty []string
		for i, q := range d.Queries {
			expr := oteltest.GrafanaExpand(q.Expr, d.Variables)
			if len(results[i]) == 0 {
				results[i] = query(expr)
			}
			if len(results[i]) == 0 && !readsSource(expr) {
				empty = append(empty, fmt.Sprintf("panel %q: %s", q.Panel, expr))
			}
		}
		if len(empty) == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, e := range empty {
				t.Errorf("dashboard %s returns nothing against the real workload", e)
			}
			break
		}
	}
	for i, q := range d.Queries {
		s := results[i]
		for _, l := range oteltest.LegendLabels(q.Legend) {
			for _, x := range s {
				if x.Labels[l] == "" {
					t.Errorf("dashboard panel %q: legend %q shows label %s, absent from %v", q.Panel, q.Legend, l, x.Labels)
				}
			}
		}
	}
	for _, v := range d.Variables {
		metric, label, ok := oteltest.LabelValues(v.Query)
		if v.Type != "query" || !ok || metric == "" {
			continue // deploy/otel_test.go requires label_values(METRIC, LABEL)
		}
		var values []string
		for _, x := range query(oteltest.GrafanaExpand(metric, d.Variables)) {
			if x.Labels[label] != "" {
				values = append(values, x.Labels[label])
			}
		}
		if len(values) == 0 {
			t.Errorf("dashboard variable %s: %s has no series with label %s", v.Name, metric, label)
		}
	}
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/oteltest"
	"github.com/trainmeter/trainmeter/internal/testkit"
)

// TestExamplePipelineToPrometheusRemoteWrite runs the example pipeline of
// deploy/otelcol/otelcol-config.yaml for real: trainmeter serve pushes OTLP
// to an OpenTelemetry Collector with that config, which remote-writes into a
// Prometheus; promtool then finds the run's J/token and the GPUs' power
// under the names the dashboard uses.
func TestExamplePipelineToPrometheusRemoteWrite(t *testing.T) {
	t.Parallel()
	otelcol := oteltest.OtelcolBinary(t)
	prometheus := oteltest.Tool(t, "prometheus")
	promtool := oteltest.Tool(t, "promtool")
	dir := t.TempDir()

	promCfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(promCfg, []byte("global:\n  scrape_interval: 15s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	promAddr := testkit.FreeAddr(t)
	oteltest.Start(t, "prometheus", prometheus, "--config.file="+promCfg, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+promAddr, "--web.enable-remote-write-receiver")

	// The example as shipped, on free ports instead of 4317/4318.
	example, err := os.ReadFile(filepath.Join("..", "deploy", "otelcol", "otelcol-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	grpcAddr, httpAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	cfg := strings.NewReplacer("0.0.0.0:4317", grpcAddr, "0.0.0.0:4318", httpAddr).Replace(string(example))
	if !strings.Contains(cfg, grpcAddr) || !strings.Contains(cfg, httpAddr) {
		t.Fatal("the example config no longer listens on 0.0.0.0:4317 and 0.0.0.0:4318")
	}
	ocCfg := filepath.Join(dir, "otelcol.yaml")
	if err := os.WriteFile(ocCfg, []byte(cfg+"\n  telemetry:\n    metrics:\n      level: none\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	oteltest.StartEnv(t, "otelcol", otelcol, []string{"PROMETHEUS_REMOTE_WRITE_URL=http://" + promAddr + "/api/v1/write"}, "--config", ocCfg)

	c := startCollector(t, "--otlp-endpoint", grpcAddr, "--otlp-insecure", "--otlp-interval", "1s", "--gpu-price-per-hour", "2")
	sock := c.startAgent("rw-node", "replay:"+writeTrace(t, 2, 300, 300, 120), "--warmup", "30s")
	c.waitStreaming("rw-node")
	tr := dialTrainer(t, sock)
	tr.send(`{"event":"run_start","run_id":"rw-run","model":"llama-rw","gpus":[0,1],"warmup_s":1}`)
	period := timedSteps(tr, "rw-run", 30, 512, 100*time.Millisecond)
	tr.send(`{"event":"run_end","run_id":"rw-run"}`)
	tr.sync()
	rep := c.waitEnded("rw-run")

	server := "http://" + promAddr
	query := func(expr string) []oteltest.PromSample {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s, err := oteltest.PromQuery(ctx, promtool, server, expr)
		if err != nil {
			t.Logf("%v", err)
		}
		return s
	}
	jpt := `trainmeter_run_energy_per_token_joules{trainmeter_run_id="rw-run",job="trainmeter-collector"}`
	var jptS, tpsS []oteltest.PromSample
	oteltest.Eventually(t, 90*time.Second, "the run's final J/token and tokens/s in Prometheus via remote-write", func() bool {
		jptS = query(jpt)
		tpsS = query(`trainmeter_run_throughput_per_second{trainmeter_run_id="rw-run",job="trainmeter-collector"}`)
		return len(jptS) == 1 && near(jptS[0].Value, rep.GetJPerToken(), 1e-9) && len(tpsS) == 1 && near(tpsS[0].Value, rep.GetTokPerS(), 1e-9)
	})
	checkWorkload(t, "remote-write", tpsS[0].Value, jptS[0].Value, 512, period, 600)
	power := query(`hw_power_watts{trainmeter_node="rw-node",hw_type="gpu"}`)
	if len(power) != 2 {
		t.Fatalf("hw_power_watts: %d series, want 2: %v", len(power), power)
	}
	for _, p := range power {
		if !near(p.Value, 300, 0.001) {
			t.Errorf("hw_power_watts%v = %v, want 300", p.Labels, p.Value)
		}
		if p.Labels["host_name"] == "" || !strings.HasSuffix(p.Labels["instance"], c.addr) {
			t.Errorf("hw_power_watts labels %v: want host_name and instance = service.instance.id (…/%s)", p.Labels, c.addr)
		}
	}
	scraped, _ := oteltest.DashboardMetrics(t)
	for _, name := range scraped {
		if s := query(fmt.Sprintf(`count(%s{job="trainmeter-collector"})`, name)); len(s) != 1 || s[0].Value < 1 {
			t.Errorf("remote-written Prometheus has no series %s (deploy/grafana/metrics.txt lists it)", name)
		}
	}
	// What the alert rules (deploy/prometheus/trainmeter-rules.yml) read on
	// this path, where there is no `up`: the collector's target_info and the
	// node's liveness, under job trainmeter-collector.
	for _, expr := range []string{
		`target_info{job="trainmeter-collector"}`,
		`trainmeter_agent_connected{job="trainmeter-collector",trainmeter_node="rw-node"}`,
	} {
		if s := query(expr); len(s) != 1 {
			t.Errorf("%s: %d series, want 1 (the alert rules read it): %v", expr, len(s), s)
		}
	}
}

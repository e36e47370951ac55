package e2e

import (
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/oteltest"
)

// The OTel names and the attributes the tests expect (docs/otel.md).
type wantMetric struct {
	name, unit, kind string // kind: gauge or sum
	monotonic        bool
}

var wantGPUMetrics = []wantMetric{
	{"hw.power", "W", "gauge", false},
	{"hw.energy", "J", "sum", true},
	{"hw.gpu.utilization", "1", "gauge", false},
	{"hw.gpu.memory.usage", "By", "sum", false},
	{"hw.gpu.memory.limit", "By", "sum", false},
}

var wantRunMetrics = []wantMetric{
	{"trainmeter.run.tokens", "{token}", "sum", true},
	{"trainmeter.run.energy", "J", "sum", true},
	{"trainmeter.run.energy_per_token", "J/{token}", "gauge", false},
	{"trainmeter.run.throughput", "{token}/s", "gauge", false},
	{"trainmeter.run.power", "W", "gauge", false},
	{"trainmeter.run.cost_usd", "{USD}", "gauge", false},
	{"trainmeter.run.projected_cost_usd", "{USD}", "gauge", false},
	{"trainmeter.run.data_wait_ratio", "1", "gauge", false},
	{"trainmeter.run.active", "", "gauge", false},
	{"trainmeter.agent.connected", "", "gauge", false},
	{"trainmeter.agent.last_seen_age", "s", "gauge", false},
	{"trainmeter.budget.use_ratio", "1", "gauge", false},
	{"trainmeter.recommendations", "{recommendation}", "sum", true},
}

func near(got, want, rel float64) bool { return math.Abs(got-want) <= rel*math.Abs(want) }

// workloadTolerance is how far the exported tokens/s and J/token may be from
// what the export tests' workload itself implies, independently of the
// collector's aggregates: tokens per step ÷ the step period the trainer
// measured, and the replayed power (2 GPUs × 300 W) ÷ that. The measured
// span (run end − the 1 s warmup, about 2 s) is cut at the exact warmup end,
// so it holds ±1 of its ~20 steps (5 %); the agent stamps run_start and
// run_end on receipt, some tens of ms late on a loaded machine; the
// trainer's period includes its last sync round trip. 25 % covers these
// with room and still catches a wrong unit, a factor of 2 (one GPU, double
// counting) or warmup not excluded.
const workloadTolerance = 0.25

// timedSteps runs tr.runSteps and returns the mean step period the trainer
// saw (sleeps stretch on a loaded machine).
func timedSteps(tr *trainer, run string, n, tokens int, every time.Duration) time.Duration {
	start := time.Now()
	tr.runSteps(run, n, tokens, every)
	return time.Since(start) / time.Duration(n)
}

// checkWorkload compares exported tokens/s and J/token with the workload's
// own figures (workloadTolerance).
func checkWorkload(t *testing.T, who string, tokPerS, jPerToken float64, tokensPerStep int, period time.Duration, powerW float64) {
	t.Helper()
	wantTPS := float64(tokensPerStep) / period.Seconds()
	wantJPT := powerW / wantTPS
	if !near(tokPerS, wantTPS, workloadTolerance) {
		t.Errorf("%s: tokens/s = %.1f, want about %.1f (%d tokens per %v step, ±%.0f%%)", who, tokPerS, wantTPS, tokensPerStep, period, 100*workloadTolerance)
	}
	if !near(jPerToken, wantJPT, workloadTolerance) {
		t.Errorf("%s: J/token = %.5f, want about %.5f (%.0f W ÷ %.1f tokens/s, ±%.0f%%)", who, jPerToken, wantJPT, powerW, wantTPS, 100*workloadTolerance)
	}
	t.Logf("%s: tokens/s %.1f (workload: %.1f), J/token %.5f (workload: %.5f)", who, tokPerS, wantTPS, jPerToken, wantJPT)
}

func withService(points []oteltest.Point, service string) []oteltest.Point {
	var out []oteltest.Point
	for _, p := range points {
		if p.Resource["service.name"] == service {
			out = append(out, p)
		}
	}
	return out
}

// TestOTLPExportReachesARealOTelCollector points the trainmeter collector
// (OTLP/gRPC) and an agent (OTLP/HTTP, direct export) at a real OpenTelemetry
// Collector, runs a replayed 300 W workload, and checks what the Collector
// wrote to its file exporter: names, units, types, attributes and values.
func TestOTLPExportReachesARealOTelCollector(t *testing.T) {
	t.Parallel()
	oc := oteltest.StartCollector(t)
	c := startCollector(t, "--otlp-endpoint", oc.GRPC, "--otlp-insecure", "--otlp-interval", "500ms",
		"--gpu-price-per-hour", "2", "--energy-price-kwh", "0.25")
	sock := c.startAgent("otel-node", "replay:"+writeTrace(t, 2, 300, 300, 120), "--warmup", "30s",
		"--otlp-endpoint", oc.HTTP, "--otlp-protocol", "http", "--otlp-insecure", "--otlp-interval", "500ms")
	c.waitStreaming("otel-node")
	// A budget the run is sure to exceed: its alerts must go out as OTel log
	// records and its use as trainmeter.budget.use_ratio.
	c.cli("budget", "set", "team-a", "0.000001")
	tr := dialTrainer(t, sock)
	tr.send(`{"event":"run_start","run_id":"otel-run","model":"llama-otel","backend":"torch","gpus":[0,1],"warmup_s":1,"budget_scope":"team-a"}`)
	period := timedSteps(tr, "otel-run", 30, 512, 100*time.Millisecond)
	tr.send(`{"event":"run_end","run_id":"otel-run"}`)
	tr.sync()
	rep := c.waitEnded("otel-run")
	if rep.GetJPerToken() <= 0 || rep.TokensProcessed != 30*512 {
		t.Fatalf("collector report: J/token %v tokens %d", rep.GetJPerToken(), rep.TokensProcessed)
	}

	// Exports are cumulative snapshots: wait for one taken after the run's
	// final figures and for the GPUs to span enough time to check energy.
	var pts []oteltest.Point
	oteltest.Eventually(t, 60*time.Second, "the run's final figures and 10 s of GPU energy at the OTel Collector", func() bool {
		pts = oc.Metrics(t)
		final := false
		for _, p := range oteltest.Latest(withService(pts, "trainmeter-collector"), "trainmeter.run.energy_per_token") {
			final = final || (p.Attrs["trainmeter.run.id"] == "otel-run" && p.Value == rep.GetJPerToken())
		}
		return final && energySpan(pts, "trainmeter-collector") >= 10*time.Second && energySpan(pts, "trainmeter-agent") >= 10*time.Second
	})

	col := withService(pts, "trainmeter-collector")
	agent := withService(pts, "trainmeter-agent")
	if len(col) == 0 || len(agent) == 0 {
		t.Fatalf("points from the collector: %d, from the agent: %d", len(col), len(agent))
	}
	for _, p := range []oteltest.Point{col[0], agent[0]} {
		for _, k := range []string{"host.name", "service.name", "service.instance.id"} {
			if p.Resource[k] == "" {
				t.Errorf("%s: resource attribute %s missing: %v", p.Resource["service.name"], k, p.Resource)
			}
		}
	}
	if agent[0].Resource["service.instance.id"] != "otel-node" {
		t.Errorf("agent service.instance.id = %q, want the node name", agent[0].Resource["service.instance.id"])
	}

	checkCatalog(t, "collector", col, append(append([]wantMetric{}, wantGPUMetrics...), wantRunMetrics...))
	checkCatalog(t, "agent", agent, wantGPUMetrics)
	checkGPUs(t, "collector", col)
	checkGPUs(t, "agent", agent)

	// The run's figures equal the collector's own report of the ended run.
	run := map[string]oteltest.Point{}
	for _, w := range wantRunMetrics {
		for _, p := range oteltest.Latest(col, w.name) {
			if p.Attrs["trainmeter.run.id"] == "otel-run" {
				run[w.name] = p
			}
		}
	}
	want := map[string]float64{
		"trainmeter.run.tokens":             float64(rep.TokensProcessed),
		"trainmeter.run.energy":             rep.EnergyTotalJ,
		"trainmeter.run.energy_per_token":   rep.GetJPerToken(),
		"trainmeter.run.throughput":         rep.GetTokPerS(),
		"trainmeter.run.power":              rep.GetAvgPowerW(),
		"trainmeter.run.cost_usd":           rep.GetTotalCostUsd(),
		"trainmeter.run.projected_cost_usd": rep.GetProjectedCostUsd(),
		"trainmeter.run.data_wait_ratio":    rep.DataWaitS / (rep.DataWaitS + rep.ComputeS),
		"trainmeter.run.active":             0,
	}
	for name, v := range want {
		p, ok := run[name]
		if !ok {
			t.Errorf("%s: no point for run otel-run", name)
			continue
		}
		if !near(p.Value, v, 1e-9) {
			t.Errorf("%s = %v, want %v (the collector's report)", name, p.Value, v)
		}
		for k, v := range map[string]string{"trainmeter.run.model": "llama-otel", "trainmeter.run.backend": "torch",
			"trainmeter.run.budget_scope": "team-a", "trainmeter.run.gpu_model": "Replay GPU"} {
			if p.Attrs[k] != v {
				t.Errorf("%s: attribute %s = %q, want %q", name, k, p.Attrs[k], v)
			}
		}
	}
	// Plausibility against the workload, not the collector's aggregates:
	// 512 tokens per step, 2 GPUs at 300 W, 1/6 of each step waiting.
	checkWorkload(t, "OTLP", run["trainmeter.run.throughput"].Value, run["trainmeter.run.energy_per_token"].Value, 512, period, 600)
	if p := run["trainmeter.run.power"]; !near(p.Value, 600, 0.01) {
		t.Errorf("trainmeter.run.power = %v W, want 600 W (2 GPUs at 300 W)", p.Value)
	}
	if p := run["trainmeter.run.data_wait_ratio"]; !near(p.Value, 0.01/0.06, 1e-9) {
		t.Errorf("data wait share = %v, want 1/6", p.Value)
	}
	if p := run["trainmeter.run.cost_usd"]; p.Value <= 0 {
		t.Errorf("cost = %v, want > 0 for a priced run", p.Value)
	}
	// Budget use and alerts come from the collector's budget manager.
	ratios := oteltest.Latest(col, "trainmeter.budget.use_ratio")
	if len(ratios) != 1 {
		t.Errorf("trainmeter.budget.use_ratio: %d series, want 1 (budget team-a)", len(ratios))
	}
	for _, p := range ratios {
		if p.Attrs["trainmeter.budget.scope"] != "team-a" || p.Attrs["trainmeter.budget.period"] != "total" || p.Value < 1 {
			t.Errorf("trainmeter.budget.use_ratio %v = %v, want team-a/total >= 1 (exceeded)", p.Attrs, p.Value)
		}
	}
	var exceeded bool
	oteltest.Eventually(t, 30*time.Second, "the budget's exceeded alert as an OTel log record", func() bool {
		for _, r := range oc.Logs(t) {
			if r.EventName == "trainmeter.alert" && r.Attrs["trainmeter.alert.kind"] == "budget" &&
				r.Attrs["trainmeter.alert.scope"] == "team-a" && r.SeverityText == "EXCEEDED" &&
				r.Attrs["trainmeter.alert.projected"] == "false" && r.Resource["service.name"] == "trainmeter-collector" {
				exceeded = true
			}
		}
		return exceeded
	})
	for _, p := range oteltest.Latest(col, "trainmeter.agent.connected") {
		if p.Attrs["trainmeter.node"] != "otel-node" || p.Value != 1 {
			t.Errorf("trainmeter.agent.connected %v = %v, want otel-node = 1", p.Attrs, p.Value)
		}
	}
	for _, p := range oteltest.Latest(col, "trainmeter.agent.last_seen_age") {
		if p.Value < 0 || p.Value > 30 {
			t.Errorf("trainmeter.agent.last_seen_age = %v s for a streaming agent", p.Value)
		}
	}
}

// checkCatalog asserts every wanted metric arrived with its unit, type and
// temporality, that nothing unexpected did, and that every data point
// attribute that arrived is documented in docs/otel.md.
func checkCatalog(t *testing.T, who string, pts []oteltest.Point, want []wantMetric) {
	t.Helper()
	seen := map[string]oteltest.Point{}
	documented := map[string]bool{}
	for _, a := range oteltest.DocAttributes(t) {
		documented[a] = true
	}
	undocumented := map[string]bool{}
	for _, p := range pts {
		seen[p.Name] = p
		if p.Scope != "github.com/trainmeter/trainmeter" {
			t.Errorf("%s: %s has scope %q", who, p.Name, p.Scope)
		}
		for k := range p.Attrs {
			if !documented[k] && !undocumented[p.Name+" "+k] {
				undocumented[p.Name+" "+k] = true
				t.Errorf("%s: %s arrived with attribute %s, which docs/otel.md does not document", who, p.Name, k)
			}
		}
	}
	wanted := map[string]bool{}
	for _, w := range want {
		wanted[w.name] = true
		p, ok := seen[w.name]
		if !ok {
			t.Errorf("%s: metric %s never arrived", who, w.name)
			continue
		}
		if p.Unit != w.unit || p.Kind != w.kind || p.Monotonic != w.monotonic || (p.Kind == "sum" && !p.Cumulative) {
			t.Errorf("%s: %s arrived as unit %q %s monotonic=%v cumulative=%v, want unit %q %s monotonic=%v cumulative",
				who, w.name, p.Unit, p.Kind, p.Monotonic, p.Cumulative, w.unit, w.kind, w.monotonic)
		}
	}
	var extra []string
	for name := range seen {
		if !wanted[name] {
			extra = append(extra, name)
		}
	}
	sort.Strings(extra)
	if len(extra) > 0 {
		t.Errorf("%s: metrics not in the documented catalog: %v", who, extra)
	}
}

// checkGPUs asserts the hw.* points describe the two replayed GPUs.
func checkGPUs(t *testing.T, who string, pts []oteltest.Point) {
	t.Helper()
	for _, name := range []string{"hw.power", "hw.energy", "hw.gpu.utilization", "hw.gpu.memory.usage", "hw.gpu.memory.limit"} {
		latest := oteltest.Latest(pts, name)
		byID := map[string]oteltest.Point{}
		for _, p := range latest {
			byID[p.Attrs["hw.id"]] = p
		}
		if len(byID) != 2 {
			t.Errorf("%s: %s for GPUs %v, want GPU-replay-0 and GPU-replay-1", who, name, keys(byID))
			continue
		}
		for g, id := range []string{"GPU-replay-0", "GPU-replay-1"} {
			p, ok := byID[id]
			if !ok {
				t.Errorf("%s: %s: no point for %s", who, name, id)
				continue
			}
			for k, v := range map[string]string{"hw.type": "gpu", "hw.model": "Replay GPU", "hw.vendor": "unknown",
				"hw.name": "otel-node/gpu" + string(rune('0'+g)), "trainmeter.node": "otel-node"} {
				if p.Attrs[k] != v {
					t.Errorf("%s: %s %s: attribute %s = %q, want %q", who, name, id, k, p.Attrs[k], v)
				}
			}
			var want float64
			switch name {
			case "hw.power":
				want = 300
			case "hw.gpu.utilization":
				want = 0.95
			case "hw.gpu.memory.usage":
				want = float64(30000+1000*g) * (1 << 20)
			case "hw.gpu.memory.limit":
				want = 81559 * (1 << 20)
			case "hw.energy":
				checkEnergyRate(t, who, pts, id)
				continue
			}
			if !near(p.Value, want, 0.001) {
				t.Errorf("%s: %s %s = %v, want %v", who, name, id, p.Value, want)
			}
		}
	}
}

// checkEnergyRate asserts hw.energy grows at the replayed 300 W: the rise
// between the first and last export against the time between them. Energy
// arrives in 1 s windows while exports are stamped when taken, so each end
// may be off by up to a window (300 J), plus some delay on a loaded machine.
func checkEnergyRate(t *testing.T, who string, pts []oteltest.Point, id string) {
	t.Helper()
	var first, last *oteltest.Point
	for i := range pts {
		p := &pts[i]
		if p.Name != "hw.energy" || p.Attrs["hw.id"] != id {
			continue
		}
		if first == nil || p.Time.Before(first.Time) {
			first = p
		}
		if last == nil || p.Time.After(last.Time) {
			last = p
		}
	}
	if first == nil {
		t.Errorf("%s: no hw.energy for %s", who, id)
		return
	}
	dt := last.Time.Sub(first.Time).Seconds()
	rate := (last.Value - first.Value) / dt
	if math.Abs(last.Value-first.Value-300*dt) > 2*300+0.05*300*dt {
		t.Errorf("%s: hw.energy of %s rose %v J in %.1f s = %.1f W, want about 300 W", who, id, last.Value-first.Value, dt, rate)
	}
	if !first.Start.Equal(last.Start) {
		t.Errorf("%s: hw.energy of %s: start time moved (%v → %v): not one cumulative series", who, id, first.Start, last.Start)
	}
}

// energySpan is how long hw.energy of the service has been exported.
func energySpan(pts []oteltest.Point, service string) time.Duration {
	var lo, hi time.Time
	for _, p := range pts {
		if p.Name != "hw.energy" || p.Resource["service.name"] != service {
			continue
		}
		if lo.IsZero() || p.Time.Before(lo) {
			lo = p.Time
		}
		if p.Time.After(hi) {
			hi = p.Time
		}
	}
	return hi.Sub(lo)
}

func keys[V any](m map[string]V) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ",")
}

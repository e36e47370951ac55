package deploy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/trainmeter/trainmeter/internal/oteltest"
)

// The alert rules are valid and behave as intended (promtool's unit tests
// in trainmeter-rules.test.yml).
func TestPrometheusRules(t *testing.T) {
	promtool := oteltest.Tool(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", "trainmeter-rules.yml"},
		{"test", "rules", "trainmeter-rules.test.yml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// Every alert in trainmeter-rules.yml is unit-tested both ways in
// trainmeter-rules.test.yml: at least one case where it fires and one where
// it must not. And the case the ingest node map cannot cover (an agent that
// is down when the collector restarts has no series) is among them, on the
// scrape and the remote-write path.
func TestPrometheusRulesAreAllTested(t *testing.T) {
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	var tests struct {
		Tests []struct {
			InputSeries []struct {
				Series string `yaml:"series"`
			} `yaml:"input_series"`
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []struct {
					ExpLabels map[string]string `yaml:"exp_labels"`
				} `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	for path, v := range map[string]any{"trainmeter-rules.yml": &rules, "trainmeter-rules.test.yml": &tests} {
		b, err := os.ReadFile(filepath.Join("prometheus", path))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	vanishedJobs := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) == 0 {
				quiet[a.Alertname] = true
			}
			for _, e := range a.ExpAlerts {
				fires[a.Alertname] = true
				if a.Alertname == "TrainmeterAgentVanished" {
					vanishedJobs[e.ExpLabels["job"]] = true
				}
			}
		}
	}
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts = append(alerts, r.Alert)
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("alert %s: promtool tests where it fires: %v, where it must not: %v; want both", r.Alert, fires[r.Alert], quiet[r.Alert])
			}
			// The collector-down rule must not depend on `up` alone: there
			// is none on the remote-write path (job trainmeter-collector).
			if r.Alert == "TrainmeterCollectorDown" && !strings.Contains(r.Expr, "trainmeter-collector") {
				t.Errorf("TrainmeterCollectorDown does not cover job trainmeter-collector (remote-write): %s", r.Expr)
			}
		}
	}
	if !slices.Contains(alerts, "TrainmeterAgentVanished") {
		t.Errorf("no rule for an agent whose series vanished (alerts: %v)", alerts)
	}
	for _, job := range []string{"trainmeter", "trainmeter-collector"} {
		if !vanishedJobs[job] {
			t.Errorf("no promtool case where TrainmeterAgentVanished fires for job %s", job)
		}
	}
}

var (
	labelMatchers = regexp.MustCompile(`\{[^}]*\}`)
	groupings     = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	metricNames   = regexp.MustCompile(`\b(hw|trainmeter)_[a-z0-9_]+\b`)
	matcherLabels = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
)

// dashboardMetrics returns the metric names a PromQL expression reads.
func dashboardMetrics(expr string) []string {
	e := groupings.ReplaceAllString(labelMatchers.ReplaceAllString(expr, ""), "")
	return metricNames.FindAllString(e, -1)
}

// exprLabels returns the label names a PromQL expression matches on or
// groups by.
func exprLabels(expr string) []string {
	var out []string
	for _, sel := range labelMatchers.FindAllString(expr, -1) {
		for _, m := range matcherLabels.FindAllStringSubmatch(sel, -1) {
			out = append(out, m[1])
		}
	}
	for _, g := range groupings.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(g[2], ",") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
	}
	return out
}

// dashboardLabels are the label names the dashboard may use: the documented
// attributes (docs/otel.md) as Prometheus renders them, and the job and
// instance every series has. e2e/prometheus_test.go checks each panel's
// legend labels on the real series.
func dashboardLabels(t *testing.T) []string {
	out := []string{"job", "instance"}
	for _, a := range oteltest.DocAttributes(t) {
		out = append(out, oteltest.PromLabel(a))
	}
	return out
}

// The Grafana dashboard is valid JSON, has the panels the issue asks for,
// uses only metric names the tests prove exist (deploy/grafana/metrics.txt)
// and documented labels, in its panels (rows included), legends and
// variables, and, when promtool is there, only PromQL that parses.
func TestGrafanaDashboard(t *testing.T) {
	d := oteltest.ReadDashboard(t)
	scraped, sourced := oteltest.DashboardMetrics(t)
	known := append(scraped, sourced...)
	labels := dashboardLabels(t)
	vars := map[string]bool{}
	for _, v := range d.Variables {
		vars[v.Name] = true
	}
	for _, p := range d.QueryLess {
		t.Errorf("panel %q has no query", p)
	}
	checkLabels := func(where string, ls []string) {
		t.Helper()
		for _, l := range ls {
			if !slices.Contains(labels, l) {
				t.Errorf("%s uses label %s, which is no documented attribute (docs/otel.md) nor job/instance", where, l)
			}
		}
	}
	checkVars := func(where, text string) {
		t.Helper()
		for _, v := range oteltest.GrafanaVars(text) {
			if !vars[v] && !strings.HasPrefix(v, "__") {
				t.Errorf("%s uses $%s, which is no dashboard variable", where, v)
			}
		}
	}
	var exprs []string
	for _, q := range d.Queries {
		where := fmt.Sprintf("panel %q query %q", q.Panel, q.Expr)
		names := dashboardMetrics(q.Expr)
		if len(names) == 0 {
			t.Errorf("%s reads no trainmeter metric", where)
		}
		for _, n := range names {
			if !slices.Contains(known, n) {
				t.Errorf("%s uses %s, which is not in deploy/grafana/metrics.txt (no test proves it exists)", where, n)
			}
		}
		checkLabels(where, exprLabels(q.Expr))
		checkLabels(fmt.Sprintf("panel %q legend %q", q.Panel, q.Legend), oteltest.LegendLabels(q.Legend))
		checkVars(where, q.Expr)
		exprs = append(exprs, oteltest.GrafanaExpand(q.Expr, d.Variables))
	}
	for _, v := range d.Variables {
		if v.Type != "query" {
			continue
		}
		where := fmt.Sprintf("variable %s (%q)", v.Name, v.Query)
		metric, label, ok := oteltest.LabelValues(v.Query)
		if !ok || metric == "" {
			t.Errorf("%s: want label_values(METRIC, LABEL)", where)
			continue
		}
		for _, n := range dashboardMetrics(metric) {
			if !slices.Contains(known, n) {
				t.Errorf("%s uses %s, which is not in deploy/grafana/metrics.txt", where, n)
			}
		}
		if len(dashboardMetrics(metric)) == 0 {
			t.Errorf("%s reads no trainmeter metric", where)
		}
		checkLabels(where, append(exprLabels(metric), label))
		checkVars(where, v.Query)
		exprs = append(exprs, fmt.Sprintf("count by (%s) (%s)", label, oteltest.GrafanaExpand(metric, d.Variables)))
	}
	for _, want := range []string{"GPU power", "GPU energy (per interval)", "J/token per run", "Tokens/s per run", "Run cost (USD)", "Budget use", "Dataloader wait share"} {
		if !slices.Contains(d.Panels, want) {
			t.Errorf("dashboard lacks the panel %q (has %v)", want, d.Panels)
		}
	}

	// The extractors themselves.
	if got := dashboardMetrics(`sum by (trainmeter_run_id) (trainmeter_run_power_watts{trainmeter_node="x"}) / hw_power_watts`); !slices.Equal(got, []string{"trainmeter_run_power_watts", "hw_power_watts"}) {
		t.Fatalf("dashboardMetrics extracts %v", got)
	}
	if got := exprLabels(`sum by (trainmeter_run_id, job) (x{hw_type="gpu",trainmeter_node=~"$node"}) / on (instance) y`); !slices.Equal(got, []string{"hw_type", "trainmeter_node", "trainmeter_run_id", "job", "instance"}) {
		t.Fatalf("exprLabels extracts %v", got)
	}
	if got := oteltest.LegendLabels("{{hw_name}} ({{ trainmeter_run_model }})"); !slices.Equal(got, []string{"hw_name", "trainmeter_run_model"}) {
		t.Fatalf("LegendLabels extracts %v", got)
	}
	if m, l, ok := oteltest.LabelValues("label_values(hw_power_watts{hw_type=\"gpu\"}, trainmeter_node)"); !ok || m != `hw_power_watts{hw_type="gpu"}` || l != "trainmeter_node" {
		t.Fatalf("LabelValues gives %q %q %v", m, l, ok)
	}
	nested, err := oteltest.ParseDashboard([]byte(`{"panels":[{"type":"row","title":"r","panels":[{"title":"p","targets":[{"expr":"up","legendFormat":"{{x}}"}]}]}],
		"templating":{"list":[{"name":"v","type":"query","query":{"query":"label_values(up, job)","refId":"A"}}]}}`))
	if err != nil || len(nested.Queries) != 1 || nested.Queries[0].Panel != "r/p" || nested.Variables[0].Query != "label_values(up, job)" {
		t.Fatalf("ParseDashboard of a row and an object query: %+v, %v", nested, err)
	}

	// PromQL syntax: each query as a recording rule, checked by promtool.
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if oteltest.Required() {
			t.Fatal("promtool is not installed (TRAINMETER_REQUIRE_OTEL=1)")
		}
		t.Log("promtool not installed: PromQL syntax of the dashboard not checked")
		return
	}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs {
		q, _ := json.Marshal(e)
		fmt.Fprintf(&rules, "      - record: dashboard:query%d\n        expr: %s\n", i, q)
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(path, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("dashboard PromQL does not parse: %v\n%s", err, out)
	}
}

// The example collector pipeline loads in a real OpenTelemetry Collector.
func TestOtelcolExampleConfig(t *testing.T) {
	bin := oteltest.OtelcolBinary(t)
	cmd := exec.Command(bin, "validate", "--config", filepath.Join("otelcol", "otelcol-config.yaml"))
	cmd.Env = append(os.Environ(), "PROMETHEUS_REMOTE_WRITE_URL=http://127.0.0.1:9090/api/v1/write")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("otelcol validate: %v\n%s", err, out)
	}
}

// scripts/otelcol-build.sh keys its cache on the manifest, the script itself,
// the builder version and the Go toolchain; --cached-only finds a cached
// binary (or exits 3) without flock, which the tests' machines may lack.
func TestOtelcolBuildScriptCache(t *testing.T) {
	root := oteltest.RepoRoot(t)
	script := filepath.Join(root, "scripts", "otelcol-build.sh")
	src, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(root, "deploy", "otelcol", "builder-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^BUILDER_VERSION=(\S+)$`).FindSubmatch(src)
	if m == nil {
		t.Fatal("otelcol-build.sh sets no BUILDER_VERSION")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH")
	}
	goVersion, err := exec.Command(goBin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	for _, b := range [][]byte{manifest, src, []byte("builder " + string(m[1]) + "\n"), goVersion} {
		h.Write(b)
	}
	key := hex.EncodeToString(h.Sum(nil))[:16]

	// A PATH with what --cached-only needs, and no flock.
	bin := t.TempDir()
	for _, tool := range []string{"bash", "cat", "cut", "dirname", "sha256sum"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("%s is not on PATH", tool)
		}
		if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(goBin, filepath.Join(bin, "go")); err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	run := func() (string, int) {
		cmd := exec.Command(filepath.Join(bin, "bash"), script, "--cached-only")
		cmd.Env = append(os.Environ(), "PATH="+bin, "TRAINMETER_CACHE="+cache)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != 0 && code != 3 {
			t.Fatalf("otelcol-build.sh --cached-only: exit %d: %s", code, stderr.String())
		}
		return strings.TrimSpace(string(out)), code
	}
	if out, code := run(); code != 3 || out != "" {
		t.Fatalf("empty cache: exit %d, output %q; want exit 3 and nothing", code, out)
	}
	want := filepath.Join(cache, "otelcol-"+key, "otelcol-trainmeter")
	if err := os.MkdirAll(filepath.Dir(want), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(want, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, code := run(); code != 0 || out != want {
		t.Fatalf("cached binary: exit %d, output %q; want %s (the key covers manifest, script, builder version, go version)", code, out, want)
	}
}

package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

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

type dashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

var (
	labelMatchers = regexp.MustCompile(`\{[^}]*\}`)
	groupings     = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	metricNames   = regexp.MustCompile(`\b(hw|trainmeter)_[a-z0-9_]+\b`)
	grafanaVars   = strings.NewReplacer("$__rate_interval", "1m", "$__range", "1h", "$node", ".*", "$run", ".*")
)

// dashboardMetrics returns the metric names a PromQL expression reads.
func dashboardMetrics(expr string) []string {
	e := groupings.ReplaceAllString(labelMatchers.ReplaceAllString(expr, ""), "")
	return metricNames.FindAllString(e, -1)
}

// The Grafana dashboard is valid JSON, has the panels the issue asks for,
// uses only metric names the tests prove exist (deploy/grafana/metrics.txt)
// and, when promtool is there, only PromQL that parses.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("grafana", "trainmeter-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}
	scraped, sourced := oteltest.DashboardMetrics(t)
	known := append(scraped, sourced...)
	var titles, exprs []string
	for _, p := range d.Panels {
		titles = append(titles, p.Title)
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			names := dashboardMetrics(tg.Expr)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q reads no trainmeter metric", p.Title, tg.Expr)
			}
			for _, n := range names {
				if !slices.Contains(known, n) {
					t.Errorf("panel %q uses %s, which is not in deploy/grafana/metrics.txt (no test proves it exists)", p.Title, n)
				}
			}
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, want := range []string{"GPU power", "GPU energy (per interval)", "J/token per run", "Tokens/s per run", "Run cost (USD)", "Budget use", "Dataloader wait share"} {
		if !slices.Contains(titles, want) {
			t.Errorf("dashboard lacks the panel %q (has %v)", want, titles)
		}
	}
	if got := dashboardMetrics(`sum by (trainmeter_run_id) (trainmeter_run_power_watts{trainmeter_node="x"}) / hw_power_watts`); !slices.Equal(got, []string{"trainmeter_run_power_watts", "hw_power_watts"}) {
		t.Fatalf("dashboardMetrics extracts %v", got)
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
		q, _ := json.Marshal(grafanaVars.Replace(e))
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

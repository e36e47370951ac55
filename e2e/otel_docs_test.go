package e2e

import (
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/trainmeter/trainmeter/internal/oteltest"
)

// TestOTelDocsMatchTheTestedCatalog ties docs/otel.md to what the tests
// see: its metric tables must list exactly the metrics the OTLP e2e test
// receives (wantGPUMetrics, wantRunMetrics) with the same units and types,
// and exactly the Prometheus names the Prometheus e2e tests and the
// telemetry tests find (deploy/grafana/metrics.txt). Needs no peers.
func TestOTelDocsMatchTheTestedCatalog(t *testing.T) {
	docs := oteltest.DocMetrics(t)
	byName := map[string]oteltest.DocMetric{}
	for _, d := range docs {
		if _, dup := byName[d.Name]; dup {
			t.Errorf("docs/otel.md lists %s twice", d.Name)
		}
		byName[d.Name] = d
	}

	// The OTel side: names, units and types.
	types := map[string]wantMetric{
		"Gauge":         {kind: "gauge"},
		"Counter":       {kind: "sum", monotonic: true},
		"UpDownCounter": {kind: "sum"},
	}
	tested := map[string]bool{}
	for _, w := range append(append([]wantMetric{}, wantGPUMetrics...), wantRunMetrics...) {
		tested[w.name] = true
		d, ok := byName[w.name]
		if !ok {
			t.Errorf("%s arrives in the e2e test but docs/otel.md does not list it", w.name)
			continue
		}
		if d.Unit != w.unit {
			t.Errorf("%s: docs/otel.md says unit %q, the e2e test receives %q", w.name, d.Unit, w.unit)
		}
		ty, ok := types[d.Type]
		if !ok {
			t.Errorf("%s: docs/otel.md type %q is none of Gauge, Counter, UpDownCounter", w.name, d.Type)
		} else if ty.kind != w.kind || ty.monotonic != w.monotonic {
			t.Errorf("%s: docs/otel.md says %s, the e2e test receives %s monotonic=%v", w.name, d.Type, w.kind, w.monotonic)
		}
	}
	for _, d := range docs {
		if !tested[d.Name] {
			t.Errorf("docs/otel.md lists %s, which no e2e test expects (wantGPUMetrics, wantRunMetrics)", d.Name)
		}
	}
	// The agent exports the Per GPU table, no more (checkCatalog "agent").
	var gpuDocs, gpuWant []string
	for _, d := range docs {
		if strings.HasPrefix(d.Section, "Per GPU") {
			gpuDocs = append(gpuDocs, d.Name)
		}
	}
	for _, w := range wantGPUMetrics {
		gpuWant = append(gpuWant, w.name)
	}
	sort.Strings(gpuDocs)
	sort.Strings(gpuWant)
	if !slices.Equal(gpuDocs, gpuWant) {
		t.Errorf("docs/otel.md's Per GPU table lists %v, the e2e test expects %v", gpuDocs, gpuWant)
	}

	// The Prometheus side: the same set of names as metrics.txt (each of
	// which a test finds in a real Prometheus or in /metrics), each the
	// rendering of its OTel name: dots to underscores, a unit suffix maybe,
	// and _total exactly for counters.
	scraped, sourced := oteltest.DashboardMetrics(t)
	tested = map[string]bool{}
	for _, n := range append(scraped, sourced...) {
		tested[n] = true
	}
	documented := map[string]bool{}
	for _, d := range docs {
		documented[d.PromName] = true
		if !tested[d.PromName] {
			t.Errorf("docs/otel.md: %s is rendered %s, which is not in deploy/grafana/metrics.txt (no test finds it)", d.Name, d.PromName)
		}
		if base := strings.ReplaceAll(d.Name, ".", "_"); d.PromName != base && !strings.HasPrefix(d.PromName, base+"_") {
			t.Errorf("docs/otel.md: %s is rendered %s, which does not start with %s", d.Name, d.PromName, base)
		}
		if strings.HasSuffix(d.PromName, "_total") != (d.Type == "Counter") {
			t.Errorf("docs/otel.md: %s (%s) is rendered %s: want _total exactly for counters", d.Name, d.Type, d.PromName)
		}
	}
	for n := range tested {
		if !documented[n] {
			t.Errorf("deploy/grafana/metrics.txt lists %s, which docs/otel.md does not", n)
		}
	}

	// The attributes the e2e tests check are documented.
	attrs := oteltest.DocAttributes(t)
	for _, a := range []string{"hw.type", "hw.id", "hw.name", "hw.model", "hw.vendor", "trainmeter.node",
		"trainmeter.run.id", "trainmeter.run.model", "trainmeter.run.backend", "trainmeter.run.budget_scope", "trainmeter.run.gpu_model",
		"trainmeter.budget.scope", "trainmeter.budget.period", "trainmeter.recommendation.kind"} {
		if !slices.Contains(attrs, a) {
			t.Errorf("attribute %s is not documented in docs/otel.md (found %v)", a, attrs)
		}
	}
}

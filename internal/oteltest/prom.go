package oteltest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// PromSample is one series of an instant query.
type PromSample struct {
	Labels map[string]string
	Value  float64
}

// parsePromJSON reads promtool's JSON rendering of an instant vector:
// [{"metric":{...},"value":[unix_ts,"value"]}, ...].
func parsePromJSON(b []byte) ([]PromSample, error) {
	var raw []struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("promtool output is not an instant vector: %v: %s", err, b)
	}
	out := make([]PromSample, 0, len(raw))
	for _, r := range raw {
		s, ok := r.Value[1].(string)
		if !ok {
			return nil, fmt.Errorf("promtool output: value %v is not a string", r.Value[1])
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("promtool output: value %q: %v", s, err)
		}
		out = append(out, PromSample{Labels: r.Metric, Value: v})
	}
	return out, nil
}

// DashboardMetrics reads deploy/grafana/metrics.txt: the Prometheus names the
// dashboard may use, split into those a scrape of the real binaries shows
// (scraped) and those that need an in-process source (sourced).
func DashboardMetrics(t testing.TB) (scraped, sourced []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(RepoRoot(t), "deploy", "grafana", "metrics.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 0 || strings.HasPrefix(f[0], "#"):
		case len(f) == 1:
			scraped = append(scraped, f[0])
		case len(f) == 2 && f[1] == "source":
			sourced = append(sourced, f[0])
		default:
			t.Fatalf("metrics.txt: bad line %q", line)
		}
	}
	return scraped, sourced
}

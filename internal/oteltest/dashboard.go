package oteltest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// DashboardPath is the Grafana dashboard, relative to the repository root.
var DashboardPath = filepath.Join("deploy", "grafana", "trainmeter-dashboard.json")

// DashboardQuery is one query of a dashboard panel.
type DashboardQuery struct {
	Panel  string // the panel's title ("row/panel" inside a row)
	Expr   string // PromQL, with Grafana variables
	Legend string // legendFormat
}

// DashboardVariable is one templating variable.
type DashboardVariable struct {
	Name, Type string
	// Query is the variable's query (e.g. label_values(m, l)); a Grafana
	// query may be a string or an object with a "query" field.
	Query string
}

// Dashboard is what the tests read from the Grafana dashboard.
type Dashboard struct {
	Title     string
	Panels    []string // every panel's title, rows' nested panels included
	Queries   []DashboardQuery
	Variables []DashboardVariable
	// QueryLess lists the panels (not rows) without any query.
	QueryLess []string
}

type grafanaPanel struct {
	Title   string         `json:"title"`
	Type    string         `json:"type"`
	Panels  []grafanaPanel `json:"panels"` // a row's panels (collapsed rows)
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
}

// ReadDashboard parses the dashboard: panels at the top level and inside
// rows, their targets, and templating.list.
func ReadDashboard(t testing.TB) Dashboard {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(RepoRoot(t), DashboardPath))
	if err != nil {
		t.Fatal(err)
	}
	d, err := ParseDashboard(b)
	if err != nil {
		t.Fatalf("%s: %v", DashboardPath, err)
	}
	return d
}

// ParseDashboard parses a Grafana dashboard JSON model.
func ParseDashboard(b []byte) (Dashboard, error) {
	var raw struct {
		Title      string         `json:"title"`
		Panels     []grafanaPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return Dashboard{}, fmt.Errorf("not valid JSON: %w", err)
	}
	d := Dashboard{Title: raw.Title}
	var walk func(prefix string, ps []grafanaPanel)
	walk = func(prefix string, ps []grafanaPanel) {
		for _, p := range ps {
			title := prefix + p.Title
			d.Panels = append(d.Panels, title)
			if p.Type == "row" {
				walk(title+"/", p.Panels)
				continue
			}
			if len(p.Targets) == 0 {
				d.QueryLess = append(d.QueryLess, title)
			}
			for _, tg := range p.Targets {
				d.Queries = append(d.Queries, DashboardQuery{Panel: title, Expr: tg.Expr, Legend: tg.LegendFormat})
			}
			walk(title+"/", p.Panels)
		}
	}
	walk("", raw.Panels)
	for _, v := range raw.Templating.List {
		dv := DashboardVariable{Name: v.Name, Type: v.Type}
		if len(v.Query) > 0 {
			var s string
			if err := json.Unmarshal(v.Query, &s); err != nil {
				var obj struct {
					Query string `json:"query"`
				}
				if err := json.Unmarshal(v.Query, &obj); err != nil {
					return Dashboard{}, fmt.Errorf("variable %s: query is neither a string nor an object with a query: %s", v.Name, v.Query)
				}
				s = obj.Query
			}
			dv.Query = s
		}
		d.Variables = append(d.Variables, dv)
	}
	return d, nil
}

var (
	legendLabels = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	labelValues  = regexp.MustCompile(`^\s*label_values\(\s*(?:([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s*,\s*)?([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)
	grafanaVar   = regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)`)
)

// LegendLabels returns the label names a legendFormat shows ({{label}}).
func LegendLabels(legend string) []string { return firstGroups(legendLabels, legend) }

// LabelValues splits a label_values(METRIC, LABEL) variable query; metric
// is empty for label_values(LABEL); ok is false for any other query.
func LabelValues(query string) (metric, label string, ok bool) {
	m := labelValues.FindStringSubmatch(query)
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

// GrafanaVars returns the names of the variables ($x, ${x}) text uses.
func GrafanaVars(text string) []string { return firstGroups(grafanaVar, text) }

// firstGroups is the first group of every match of re in s.
func firstGroups(re *regexp.Regexp, s string) []string {
	var out []string
	for _, m := range re.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// GrafanaExpand replaces Grafana's built-in and the dashboard's variables
// with values Prometheus accepts ("all" for the multi-value ones), so that a
// query can run as plain PromQL.
func GrafanaExpand(expr string, vars []DashboardVariable) string {
	pairs := []string{"$__rate_interval", "1m", "$__range", "1h", "$__interval", "15s"}
	for _, v := range vars {
		pairs = append(pairs, "${"+v.Name+"}", ".*", "$"+v.Name, ".*")
	}
	return strings.NewReplacer(pairs...).Replace(expr)
}

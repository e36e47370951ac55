package console_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/trainmeter/trainmeter/collector/internal/cli"
)

// trainmeter runs the CLI in process, as a user would from a shell.
func trainmeter(t *testing.T, args ...string) string {
	t.Helper()
	cmd := cli.NewRootCommand(func(string) string { return "" })
	var out strings.Builder
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	if err := cmd.ExecuteContext(t.Context()); err != nil {
		t.Fatalf("trainmeter %v: %v\n%s", args, err, out.String())
	}
	return out.String()
}

// TestUsagePageIsUsageJSON: /usage shows the rows and node totals of
// `trainmeter usage --json` over the same period and grouping, to the last
// digit and in its order (idle rows included); its CSV download is `usage
// --csv`, byte for byte; the per-day chart has the period's bars.
func TestUsagePageIsUsageJSON(t *testing.T) {
	c := startCollector(t, nil)
	c.seedFleet(t)
	const since, until = "2025-03-01T00:00:00Z", "2025-03-01T12:01:00Z"
	for _, by := range [][]string{{"label:team"}, {"node"}, {"gpu", "user"}} {
		args := []string{"usage", "--collector", c.srv.Addr().String(), "--since", since, "--until", until}
		for _, b := range by {
			args = append(args, "--by", b)
		}
		var js struct {
			Rows  []map[string]any `json:"rows"`
			Nodes []map[string]any `json:"nodes"`
		}
		out := trainmeter(t, append(args, "--json")...)
		if err := json.Unmarshal([]byte(out), &js); err != nil || len(js.Rows) == 0 || len(js.Nodes) != 1 {
			t.Fatalf("usage --json: %v\n%s", err, out)
		}
		q := url.Values{"by": by, "since": {since}, "until": {until}}.Encode()
		resp, body := get(t, nil, c.base+"/usage?"+q)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/usage?%s: %s", q, resp.Status)
		}
		if bad := unsafeMarkup(body); len(bad) > 0 {
			t.Errorf("/usage: %v", bad)
		}
		rows, _ := dataFields(t, body, "usage")
		nodes, _ := dataFields(t, body, "usage-nodes")
		for _, f := range []string{"gpu_seconds", "energy_j", "cost_usd", "gpu_share", "energy_share"} {
			if len(rows[f]) != len(js.Rows) {
				t.Fatalf("by %v: %d rows of %s on the page, usage --json has %d", by, len(rows[f]), f, len(js.Rows))
			}
			for i, r := range js.Rows {
				samePageNumber(t, "by "+strings.Join(by, ",")+" row "+strconv.Itoa(i)+" "+f, rows[f][i], r[f])
			}
		}
		for _, f := range []string{"gpu_seconds", "energy_j", "idle_gpu_seconds", "idle_energy_j"} {
			samePageNumber(t, "node "+f, nodes[f][0], js.Nodes[0][f])
		}
		// The CSV download is `usage --csv`.
		wantCSV := trainmeter(t, append(args, "--csv")...)
		link := regexp.MustCompile(`id="csv"|href="(/usage\.csv\?[^"]+)"`).FindAllStringSubmatch(body, -1)
		var href string
		for _, m := range link {
			if m[1] != "" {
				href = strings.ReplaceAll(m[1], "&amp;", "&")
			}
		}
		resp, gotCSV := get(t, nil, c.base+href)
		if resp.StatusCode != 200 || gotCSV != wantCSV || !strings.HasPrefix(resp.Header.Get("Content-Disposition"), "attachment") {
			t.Errorf("by %v: CSV download (%s, %s):\n%s\nusage --csv:\n%s", by, href, resp.Status, gotCSV, wantCSV)
		}
		// One UTC day in the period: one bar, a segment per group.
		if m := regexp.MustCompile(`id="day-chart" data-points="(\d+)"`).FindStringSubmatch(body); m == nil || m[1] == "0" {
			t.Errorf("by %v: the chart has no data (%v)", by, m)
		}
	}
	// The team split: a, b and idle in the chart's legend.
	_, body := get(t, nil, c.base+"/usage?"+url.Values{"by": {"label:team"}, "since": {since}, "until": {until}}.Encode())
	for _, k := range []string{"> a</li>", "> b</li>", "> idle</li>"} {
		if !strings.Contains(body, k) {
			t.Errorf("chart legend lacks %q", k)
		}
	}
	for q, want := range map[string]int{"by=colour": 400, "since=yesterday": 400, "since=2025-03-02&until=2025-03-01": 400, "chart=pie": 400, "": 200, "since=400d": 200} {
		if resp, _ := get(t, nil, c.base+"/usage?"+q); resp.StatusCode != want {
			t.Errorf("/usage?%s: %s, want %d", q, resp.Status, want)
		}
	}
}

// samePageNumber: a data-value on a page is the JSON number, exactly
// (protojson leaves a zero number out).
func samePageNumber(t *testing.T, what, page string, want any) {
	t.Helper()
	w, _ := want.(float64)
	got, err := strconv.ParseFloat(page, 64)
	if err != nil || got != w {
		t.Errorf("%s: page %q, --json %v", what, page, want)
	}
}

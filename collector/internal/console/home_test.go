package console_test

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"
	"google.golang.org/protobuf/types/known/timestamppb"

	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// seedFleet ingests, through the real ingest stream, one node of two GPUs:
// run "fleet-a" (team a) on GPU 0 ended, run "fleet-b" (team b) on GPU 0
// still live, GPU 1 idle throughout; with a budget on team b small enough
// to be at risk.
func (c *collector) seedFleet(t *testing.T) {
	t.Helper()
	conn := tu.Dial(t, c.srv.Addr().String())
	ctx := context.Background()
	if _, err := trainmeterv1.NewBudgetServiceClient(conn).SetBudget(ctx, &trainmeterv1.SetBudgetRequest{Scope: "team:b", LimitUsd: 0.003}); err != nil {
		t.Fatal(err)
	}
	a := tu.ConnectHello(t, conn, &trainmeterv1.Hello{Node: "fleet-node", BootId: "boot", AgentVersion: "test", GpuBackend: "sim",
		Gpus: []*trainmeterv1.GpuInfo{{Index: 0, Name: "Sim GPU", HasEnergyCounter: true}, {Index: 1, Name: "Sim GPU", HasEnergyCounter: true}}})
	defer a.Close()
	for s := range 10 {
		run := "fleet-a"
		if s >= 5 {
			run = "fleet-b"
		}
		w := tu.Window(run, float64(s), 1000, 300)
		var evs []*trainmeterv1.RunEvent
		switch s {
		case 0, 5:
			st := tu.Start(run, float64(s), "fleet-model")
			st.GetRunStart().Labels = map[string]string{"team": strings.TrimPrefix(run, "fleet-")}
			evs = append(evs, st)
		case 4:
			evs = append(evs, tu.End(run, 5))
		}
		b := tu.Batch(uint64(s+1), float64(s), []*trainmeterv1.RunWindow{w}, evs...)
		b.GpuWindows = []*trainmeterv1.GpuWindow{
			{Gpu: 0, EnergyCounterJ: 300, CounterOk: true, PowerAvgW: 300, Samples: 20, GpuSeconds: 1},
			{Gpu: 1, EnergyCounterJ: 60, CounterOk: true, PowerAvgW: 60, Samples: 20, GpuSeconds: 1, IdleGpuSeconds: 1, IdleEnergyCounterJ: 60},
		}
		a.MustAck(b)
	}
}

// dataFields is every element with a data-field under the element with
// id, as field → data-value, and whether each sits in a link (itself, an
// ancestor, or its table row has one).
func dataFields(t *testing.T, body, id string) (vals map[string][]string, unlinked []string) {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	vals = map[string][]string{}
	attr := func(n *html.Node, k string) (string, bool) {
		for _, a := range n.Attr {
			if a.Key == k {
				return a.Val, true
			}
		}
		return "", false
	}
	hasLink := func(n *html.Node) bool {
		for c := range n.Descendants() {
			if c.Type == html.ElementNode && c.Data == "a" {
				return true
			}
		}
		return false
	}
	var in func(n *html.Node, inside, linked bool, row *html.Node)
	in = func(n *html.Node, inside, linked bool, row *html.Node) {
		if n.Type == html.ElementNode {
			if v, ok := attr(n, "id"); ok && v == id {
				inside = true
			}
			if n.Data == "a" {
				linked = true
			}
			if n.Data == "tr" {
				row = n
			}
			if f, ok := attr(n, "data-field"); ok && inside {
				v, _ := attr(n, "data-value")
				vals[f] = append(vals[f], v)
				if !linked && (row == nil || !hasLink(row)) {
					unlinked = append(unlinked, f)
				}
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			in(c, inside, linked, row)
		}
	}
	in(doc, false, false, nil)
	return vals, unlinked
}

// TestHomeIsTheFleetOverview: / is the fleet now (GPUs busy and idle,
// power), the month's and the last 24 h's spend split by team with idle's
// share, the budget at risk, the live run, the costliest runs and the
// alerts; each figure is the Usage, ListRuns or budget services' own and
// sits in a link to the page behind it.
func TestHomeIsTheFleetOverview(t *testing.T) {
	c := startCollector(t, nil)
	c.seedFleet(t)
	ctx := context.Background()
	qs := queryClient(t, c)

	resp, body := get(t, &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}, c.base+"/")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/: %s (want the fleet overview, not a redirect)", resp.Status)
	}
	if bad := unsafeMarkup(body); len(bad) > 0 {
		t.Errorf("/: %v", bad)
	}

	// Now: GPU 0 ran a run in the last minute, GPU 1 was idle; power is
	// the node's GPU energy over the time its GPUs covered.
	now, unlinked := dataFields(t, body, "now")
	if len(unlinked) > 0 {
		t.Errorf("#now: figures without a link: %v", unlinked)
	}
	if got := now["busy_gpus"]; len(got) != 1 || got[0] != "1" {
		t.Errorf("busy GPUs %v, want 1 (GPU 0 busy, GPU 1 idle)", got)
	}
	if got := now["live_runs"]; len(got) != 1 || got[0] != "1" {
		t.Errorf("live runs %v, want 1", got)
	}
	if got := now["budgets_at_risk"]; len(got) != 1 || got[0] != "1" {
		t.Errorf("budgets at risk %v, want 1 (team:b)", got)
	}
	minute, err := qs.Usage(ctx, &trainmeterv1.UsageRequest{Since: tu.TS(0), Until: tu.TS(60)})
	if err != nil {
		t.Fatal(err)
	}
	n := minute.GetNodes()[0]
	wantW := n.GetEnergyJ() / (n.GetGpuSeconds() / 2)
	if got := now["power_w"]; len(got) != 1 || got[0] != strconv.FormatFloat(wantW, 'g', -1, 64) || wantW != 360 {
		t.Errorf("power now %v, want %v = 360 W (300 W + 60 W)", got, wantW)
	}
	fleet, _ := dataFields(t, body, "fleet")
	if got := fleet["busy"]; len(got) != 1 || got[0] != "1" {
		t.Errorf("node busy GPUs %v, want 1", got)
	}

	// Spend this month, by team: the Usage RPC's rows, to the last digit.
	for _, per := range []struct{ id, since string }{{"spend-month", "2025-03-01T00:00:00Z"}, {"spend-day", "2025-02-28T12:01:00Z"}} {
		u, err := qs.Usage(ctx, &trainmeterv1.UsageRequest{Since: ts(t, per.since), Until: timestamp(tu.Now()), By: []string{"label:team"}})
		if err != nil {
			t.Fatal(err)
		}
		vals, unlinked := dataFields(t, body, per.id)
		if len(unlinked) > 0 {
			t.Errorf("#%s: figures without a link: %v", per.id, unlinked)
		}
		var want []string
		var idle, total float64
		for _, r := range u.GetRows() {
			want = append(want, strconv.FormatFloat(r.GetCostUsd(), 'g', -1, 64))
		}
		for _, nd := range u.GetNodes() {
			idle += nd.GetIdleGpuSeconds()
			total += nd.GetGpuSeconds()
		}
		if len(u.GetRows()) != 3 { // a, b, idle
			t.Fatalf("%s: usage rows %v, want teams a and b and the idle row", per.id, u.GetRows())
		}
		if got := vals["cost_usd"]; strings.Join(sorted(got), " ") != strings.Join(sorted(want), " ") {
			t.Errorf("%s: costs on the page %v, Usage %v", per.id, got, want)
		}
		if got := vals["idle_share"]; len(got) != 1 || got[0] != strconv.FormatFloat(idle/total, 'g', -1, 64) || idle/total != 0.5 {
			t.Errorf("%s: idle share %v, want %v = 0.5", per.id, got, idle/total)
		}
	}
	if !strings.Contains(body, `href="/usage?by=label%3Ateam&amp;since=2025-03-01T00%3A00%3A00Z&amp;until=2025-03-01T12%3A01%3A00Z"`) {
		t.Errorf("the month's spend does not link to its Usage page")
	}

	// Live and costliest runs: links to the runs, costs as the reports'.
	for _, id := range []string{"live", "costliest"} {
		vals, unlinked := dataFields(t, body, id)
		if len(unlinked) > 0 {
			t.Errorf("#%s: figures without a link: %v", id, unlinked)
		}
		want := map[string]int{"live": 1, "costliest": 2}[id]
		if len(vals["total_cost_usd"]) != want {
			t.Errorf("#%s: %d runs, want %d", id, len(vals["total_cost_usd"]), want)
		}
	}
	run, err := qs.GetRun(ctx, &trainmeterv1.GetRunRequest{RunId: "fleet-b"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body, `<a href="/runs/fleet-b">fleet-b</a>`) || !strings.Contains(body, `data-value="`+strconv.FormatFloat(run.GetRun().GetTotalCostUsd(), 'g', -1, 64)+`"`) {
		t.Errorf("the live run fleet-b is not on the page with its cost")
	}

	// By user instead of team; a grouping Usage refuses is a 400.
	if resp, body := get(t, nil, c.base+"/?by=user"); resp.StatusCode != 200 || !strings.Contains(body, `aria-current="true">user</a>`) {
		t.Errorf("/?by=user: %s", resp.Status)
	}
	if resp, _ := get(t, nil, c.base+"/?"+url.Values{"by": {"colour"}}.Encode()); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("/?by=colour: %s, want 400", resp.Status)
	}
}

func ts(t *testing.T, s string) *timestamppb.Timestamp {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return timestamppb.New(v)
}

func timestamp(v time.Time) *timestamppb.Timestamp { return timestamppb.New(v) }

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }

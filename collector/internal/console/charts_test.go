package console_test

import (
	"encoding/json"
	"math"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/html"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// gapRun is a run as trying the product showed it: it starts mid-second
// (0.5 s), its windows for seconds 3 to 5 never arrived (the node was
// cut off), and it ends mid-second (at 8.4 s), idle GPU after it. Its one
// GPU draws 300 W while the run computes and 50 W idle, so that the run's
// power and the GPU's agree wherever a window is the run's alone.
const gapRun = "gappy"

func (c *collector) seedGapRun(t *testing.T) {
	t.Helper()
	conn := tu.Dial(t, c.srv.Addr().String())
	a := tu.Connect(t, conn, "n1", "boot")
	defer a.Close()
	seq := uint64(0)
	for sec := 0; sec <= 8; sec++ {
		if sec >= 3 && sec <= 5 {
			continue
		}
		st, en := float64(sec), float64(sec+1)
		if sec == 0 {
			st = 0.5
		}
		if sec == 8 {
			en = 8.4
		}
		w := tu.Window(gapRun, float64(sec), 1000, 300*(en-st))
		w.Start, w.End = tu.TS(st), tu.TS(en)
		var evs []*trainmeterv1.RunEvent
		if sec == 0 {
			s := tu.Start(gapRun, 0.5, "gap-model")
			s.GetRunStart().WarmupS = 0
			evs = append(evs, s)
		}
		if sec == 6 {
			evs = append(evs, &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_Eval{Eval: &trainmeterv1.Eval{
				RunId: gapRun, Time: tu.TS(6.5), Epoch: proto.Int64(1), ValLoss: proto.Float64(2.31)}}})
		}
		if sec == 8 {
			evs = append(evs, tu.End(gapRun, 8.4))
		}
		b := tu.Batch(seq+1, float64(sec), []*trainmeterv1.RunWindow{w}, evs...)
		// The GPU's mean over the whole second: the run's 300 W over its
		// part, 50 W idle over the rest.
		b.GpuWindows[0].PowerAvgW = 300*(en-st) + 50*(1-(en-st))
		b.GpuWindows[0].EnergyCounterJ = b.GpuWindows[0].PowerAvgW
		seq++
		a.MustAck(b)
	}
}

type chartJSON struct {
	StartMs *int64 `json:"start_ms"`
	EndMs   *int64 `json:"end_ms"`
	Series  []struct {
		Name   string     `json:"name"`
		T      []int64    `json:"t_unix_ms"`
		Values []*float64 `json:"values"`
	} `json:"series"`
}

// TestTimelineTellsTheTruth: what the Run page's charts receive. Missing
// windows are a null (a break in the line), not a line across them; no
// point lies before the run's start; a GPU's line has no point for a
// window the run covers only part of (its mean includes the idle GPU after
// the run), so where both lines have a point they agree.
func TestTimelineTellsTheTruth(t *testing.T) {
	c := startCollector(t, nil)
	c.seedGapRun(t)
	_, body := get(t, nil, c.base+"/api/runs/"+url.PathEscape(gapRun)+"/timeline")
	var tl chartJSON
	if err := json.Unmarshal([]byte(body), &tl); err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	start, end := *tl.StartMs, *tl.EndMs
	if want := tu.TS(0.5).AsTime().UnixMilli(); start != want {
		t.Fatalf("start_ms %d, want %d", start, want)
	}
	at := map[string]map[int64]*float64{}
	for _, s := range tl.Series {
		at[s.Name] = map[int64]*float64{}
		var nulls int
		for i, ts := range s.T {
			if ts < start || ts > end {
				t.Errorf("%s: point at %d ms, outside the run [%d, %d]", s.Name, ts, start, end)
			}
			at[s.Name][ts] = s.Values[i]
			if s.Values[i] == nil {
				nulls++
				if i == 0 || i == len(s.T)-1 {
					t.Errorf("%s: a break at its end (point %d)", s.Name, i)
				}
			}
		}
		// Seconds 3 to 5 missing: one break between second 2 and second 6.
		if nulls != 1 {
			t.Errorf("%s: %d breaks, want 1 (seconds 3 to 5 missing): t %v", s.Name, nulls, s.T)
		}
	}
	total, gpu := at["power_w"], at["power_w:n1/gpu0"]
	if len(total) == 0 || len(gpu) == 0 {
		t.Fatalf("series: %v", strings.Join(func() (n []string) {
			for k := range at {
				n = append(n, k)
			}
			return
		}(), " "))
	}
	both := 0
	for ts, g := range gpu {
		v, ok := total[ts]
		if g == nil || !ok || v == nil {
			continue
		}
		both++
		if math.Abs(*v-*g) > 1e-6 {
			t.Errorf("at %d ms: total %v W, the run's one GPU %v W", ts-start, *v, *g)
		}
	}
	if both < 4 {
		t.Errorf("total and GPU share %d points, want the run's whole seconds (1, 2, 6, 7)", both)
	}
}

// cardsOf reads the Run page's cards: field → [shown text, reason].
func cardsOf(t *testing.T, body string) map[string][2]string {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]string{}
	var walk func(n *html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "dd" {
			var field, reason string
			for _, a := range n.Attr {
				if a.Key == "data-field" {
					field = a.Val
				}
			}
			var text strings.Builder
			for c := n.FirstChild; c != nil; c = c.NextSibling {
				if c.Type == html.ElementNode && c.Data == "small" {
					reason = strings.TrimSpace(textOf(c))
					continue
				}
				text.WriteString(textOf(c))
			}
			if field != "" {
				out[field] = [2]string{strings.TrimSpace(text.String()), reason}
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	return out
}

func textOf(n *html.Node) string {
	if n.Type == html.TextNode {
		return n.Data
	}
	var b strings.Builder
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		b.WriteString(textOf(c))
	}
	return b.String()
}

// TestRunCardsSayUnknown: a run just started, with no price and one
// window, no tokens: a figure that is not known reads "—" with why, never 0.
func TestRunCardsSayUnknown(t *testing.T) {
	c := startCollector(t, func(cfg *server.Config) { cfg.GPUPricePerHour = 0 })
	conn := tu.Dial(t, c.srv.Addr().String())
	a := tu.Connect(t, conn, "n1", "boot")
	defer a.Close()
	w := tu.Window("fresh", 0, 0, 0)
	w.VramPeakMib, w.VramSumMib, w.VramSamples, w.EnergyCounterJ, w.EnergyIntegratedJ, w.Steps = 0, 0, 0, 0, 0, 0
	a.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{w}, tu.Start("fresh", 0, "m")))
	_, body := get(t, nil, c.base+runPath("fresh"))
	cards := cardsOf(t, body)
	for _, f := range []string{"j_per_token", "tok_per_s", "energy_total_j", "avg_power_total_w", "vram_peak_mb", "total_cost_usd", "projected_cost_usd", "tokens_processed"} {
		got, ok := cards[f]
		if !ok {
			t.Errorf("no card %s", f)
			continue
		}
		if got[0] != "—" || got[1] == "" {
			t.Errorf("card %s reads %q (reason %q), want — with the reason", f, got[0], got[1])
		}
	}
}

// TestRunCostAndCause: the Run page breaks the cost down (GPU time at its
// price, energy, the total) and shows a failed run's cause before its
// figures.
func TestRunCostAndCause(t *testing.T) {
	c := startCollector(t, nil)
	c.seed(t)
	_, body := get(t, nil, c.base+runPath(evilRun))
	cause := strings.Index(body, `id="end-error"`)
	cards := strings.Index(body, `class="cards"`)
	if cause < 0 || cards < 0 || cause > cards {
		t.Errorf("the failed run's cause at %d, its cards at %d: want the cause first", cause, cards)
	}
	for f, got := range cardsOf(t, body) {
		if got[0] == "—" || got[0] == "" || got[1] != "" {
			t.Errorf("card %s of a run that has it reads %q (reason %q)", f, got[0], got[1])
		}
	}
	for _, want := range []string{`id="cost"`, `data-cost="gpu"`, `data-cost="energy"`, `data-cost="total"`, "GPU-hours", "$2/GPU-hour"} {
		if !strings.Contains(body, want) {
			t.Errorf("run page: no %s in the cost breakdown", want)
		}
	}
}

// seedCompare ingests two groups of two ended runs (backend a and b): b's
// runs make more tokens for the same energy.
func (c *collector) seedCompare(t *testing.T) []string {
	t.Helper()
	conn := tu.Dial(t, c.srv.Addr().String())
	a := tu.Connect(t, conn, "n1", "boot")
	defer a.Close()
	var seq uint64
	runs := []string{"cmp-a1", "cmp-a2", "cmp-b1-with-a-rather-long-name", "cmp-b2"}
	for i, run := range runs {
		start := tu.Start(run, 0, "cmp-model")
		start.GetRunStart().Metadata.Backend = []string{"a", "a", "b", "b"}[i]
		for s := 0; s < 5; s++ {
			seq++
			w := tu.Window(run, float64(s), uint64(1000*(1+i/2)+50*i), 300+float64(7*i))
			var evs []*trainmeterv1.RunEvent
			if s == 0 {
				evs = append(evs, start)
			}
			if s == 4 {
				evs = append(evs, tu.End(run, 5))
			}
			a.MustAck(tu.Batch(seq, float64(s), []*trainmeterv1.RunWindow{w}, evs...))
		}
	}
	return runs
}

// TestCompareCharts: each figure's bars are labelled with their group and
// value and carry a 95 % CI whisker (a line with end caps); the scatter
// has each run once, coloured by its group, with a legend; numbers read
// in one format (no exponent).
func TestCompareCharts(t *testing.T) {
	c := startCollector(t, nil)
	runs := c.seedCompare(t)
	_, body := get(t, nil, c.base+"/compare?"+url.Values{"model": {"cmp-model"}, "by": {"backend"}}.Encode())
	doc, err := html.Parse(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var rows, whiskers, labels int
	points := map[string]string{}
	legend := map[string]bool{}
	var walk func(n *html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			attr := map[string]string{}
			for _, a := range n.Attr {
				attr[a.Key] = a.Val
			}
			switch {
			case n.Data == "g" && attr["class"] == "bar-row":
				rows++
				for ch := n.FirstChild; ch != nil; ch = ch.NextSibling {
					if ch.Type != html.ElementNode {
						continue
					}
					var cls, d string
					for _, a := range ch.Attr {
						if a.Key == "class" {
							cls = a.Val
						}
						if a.Key == "d" {
							d = a.Val
						}
					}
					if ch.Data == "text" && cls == "bar-label" && strings.HasPrefix(attr["data-group"], strings.TrimSuffix(textOf(ch), "…")) {
						labels++
					}
					if ch.Data == "path" && cls == "ci" && strings.Count(d, "M") == 3 {
						whiskers++
					}
				}
			case n.Data == "circle" && attr["class"] == "run":
				points[attr["data-run"]] = attr["data-group"] + " " + attr["fill"]
			case n.Data == "li" && attr["data-group"] != "":
				legend[attr["data-group"]] = true
			}
		}
		for ch := n.FirstChild; ch != nil; ch = ch.NextSibling {
			walk(ch)
		}
	}
	walk(doc)
	// J/token, tok/s, E10k_J, VRAM, $/Mtok: two groups each.
	if rows != 10 || labels != rows || whiskers != rows {
		t.Errorf("bars: %d rows, %d labelled, %d with a CI whisker; want 10 each", rows, labels, whiskers)
	}
	if len(points) != len(runs) {
		t.Errorf("scatter: %d runs %v, want %d", len(points), points, len(runs))
	}
	colour := map[string]string{}
	for run, gf := range points {
		g, fill, _ := strings.Cut(gf, " ")
		if want := map[bool]string{true: "a", false: "b"}[strings.HasPrefix(run, "cmp-a")]; g != want {
			t.Errorf("scatter: %s in group %q, want %q", run, g, want)
		}
		if colour[g] != "" && colour[g] != fill {
			t.Errorf("scatter: group %s drawn in %s and %s", g, colour[g], fill)
		}
		colour[g] = fill
	}
	if colour["a"] == colour["b"] || !legend["a"] || !legend["b"] {
		t.Errorf("scatter: colours %v, legend %v: want one colour per group, each in the legend", colour, legend)
	}
	if m := regexp.MustCompile(`\d\.?\d*e[-+]\d\d`).FindString(textOf(doc)); m != "" {
		t.Errorf("compare page writes %s: want decimal notation", m)
	}
}

// TestCompareForm: the form's model is typed, an exact match, and kept as
// typed (a list of every model would read every run's report); runs named
// are drawn in the scatter from their own reports, each once; a model
// without ended runs is a clear 400.
func TestCompareForm(t *testing.T) {
	c := startCollector(t, nil)
	runs := c.seedCompare(t)
	_, body := get(t, nil, c.base+"/compare?"+url.Values{"model": {"cmp-model"}, "by": {"backend"}}.Encode())
	if !strings.Contains(body, `<input name="model" value="cmp-model"`) || strings.Contains(body, "<select") {
		t.Errorf("compare form: want a text box holding the model typed, no list:\n%s", body)
	}
	named := []string{runs[0], runs[2], runs[3]}
	_, body = get(t, nil, c.base+"/compare?"+url.Values{"runs": {strings.Join(named, " ")}, "by": {"backend"}}.Encode())
	circles := regexp.MustCompile(`<circle class="run" data-run="([^"]+)"`).FindAllStringSubmatch(body, -1)
	var drawn []string
	for _, m := range circles {
		drawn = append(drawn, m[1])
	}
	slices.Sort(drawn)
	if !slices.Equal(drawn, named) {
		t.Errorf("scatter of runs %v draws %v", named, drawn)
	}
	resp, body := get(t, nil, c.base+"/compare?model=cmp-mod&by=backend")
	if resp.StatusCode != 400 || !strings.Contains(body, "no ended runs") {
		t.Errorf("compare of a model no run has (a prefix of one): %s, want 400 saying it has no ended runs:\n%.400s", resp.Status, body)
	}
}

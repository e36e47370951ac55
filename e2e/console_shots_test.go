package e2e

import (
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/trainmeter/trainmeter/internal/testkit"
)

// layoutProblems is run in each page: the labelled elements whose text
// does not fit their box (scrollWidth past clientWidth), the page wider
// than the window, and every chart without data: an element with
// data-points of 0 (the Run page's uPlot figures, the Usage page's SVG),
// a compare bar chart without a bar.
const layoutProblems = `(() => {
  const bad = [];
  const what = e => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") + ' "' + e.textContent.trim().replace(/\s+/g, " ").slice(0, 50) + '"';
  for (const e of document.querySelectorAll("header a, nav a, main h1, main h2, main h3, main th, main td, main dt, main dd, main label, main button, main li, main figcaption, main .cards div")) {
    const cs = getComputedStyle(e);
    if (cs.display === "inline" || cs.display === "none" || e.closest("details:not([open])")) continue;
    if (e.scrollWidth > e.clientWidth + 1) bad.push("overflows its box: " + what(e) + " " + e.scrollWidth + " > " + e.clientWidth + " px");
  }
  const d = document.documentElement;
  if (d.scrollWidth > d.clientWidth + 1) bad.push("the page is wider than the window: " + d.scrollWidth + " > " + d.clientWidth + " px");
  for (const f of document.querySelectorAll("[data-points]")) if (Number(f.dataset.points) === 0) bad.push("a chart without data: " + what(f));
  for (const c of document.querySelectorAll(".bar-chart")) if (!c.querySelector("rect.bar")) bad.push("a bar chart without bars: " + what(c));
  return bad;
})()`

// lowContrast is run in each page: every visible HTML element with text
// of its own whose colour against its effective background (its own and
// its ancestors' background colours, alpha blended over white) has a WCAG
// 2 contrast ratio under 4.5:1, or 3:1 for large text (24 px, or 18.66 px
// bold). Text drawn in SVG or on a canvas (the charts) is not checked:
// what lies under it is another element, not an ancestor.
const lowContrast = `(() => {
  const parse = c => { const m = c.match(/rgba?\(([^)]+)\)/); if (!m) return null;
    const v = m[1].split(/[ ,\/]+/).filter(Boolean).map(Number); return [v[0], v[1], v[2], v.length > 3 ? v[3] : 1]; };
  const over = (top, under) => [0, 1, 2].map(i => top[i] * top[3] + under[i] * (1 - top[3])).concat([1]);
  const bgOf = e => { const layers = [];
    for (let a = e; a; a = a.parentElement) { const c = parse(getComputedStyle(a).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; } }
    let bg = [255, 255, 255, 1]; for (const c of layers.reverse()) bg = over(c, bg); return bg; };
  const lum = c => { const [r, g, b] = c.slice(0, 3).map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const bad = [];
  for (const e of document.body.querySelectorAll("*")) {
    if (!(e instanceof HTMLElement) || e.closest("svg, details:not([open]) > :not(summary)")) continue;
    if (![...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim())) continue;
    const cs = getComputedStyle(e);
    if (cs.visibility !== "visible" || !e.getClientRects().length) continue;
    const fg0 = parse(cs.color); if (!fg0) continue;
    const bg = bgOf(e), fg = over(fg0, bg);
    const l1 = lum(fg), l2 = lum(bg), ratio = (Math.max(l1, l2) + 0.05) / (Math.min(l1, l2) + 0.05);
    const px = parseFloat(cs.fontSize), large = px >= 24 || (px >= 18.66 && Number(cs.fontWeight) >= 700);
    if (ratio < (large ? 3 : 4.5) - 0.005)
      bad.push("low contrast " + ratio.toFixed(2) + ":1 (" + cs.color + " on rgb(" + bg.slice(0, 3).map(Math.round).join(", ") + ")): " +
        e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") + (e.className ? "." + String(e.className).split(" ").join(".") : "") + ' "' + e.textContent.trim().replace(/\s+/g, " ").slice(0, 40) + '"');
  }
  return bad;
})()`

// focusable is run in each page: the links and controls a keyboard user
// tabs through, and whether the focused one shows an outline.
const focusable = `(() => {
  const els = [...document.querySelectorAll("a[href], button, input, select")].filter(e => e.offsetParent !== null);
  if (!els.length) return "no focusable element";
  const a = document.querySelector("main a[href]") || els[0];
  a.focus();
  if (document.activeElement !== a) return "a link takes no focus";
  return "";
})()`

// TestConsoleScreenshots: the real collector and agents (two nodes of
// simulated GPUs), runs of two teams and two backends sent through the
// trainer socket, one run still live and one GPU idle, a budget at risk;
// headless Chromium 1,400 px wide opens every page: none reports an error,
// no label overflows its box, no chart is empty, no text is below WCAG
// contrast, links take the keyboard's focus. The screenshots go to $TRAINMETER_SCREENSHOT_DIR (`make
// console-screenshots` sets docs/console), else the test's temp dir.
func TestConsoleScreenshots(t *testing.T) {
	exe := chromiumPath(t)
	ui := testkit.FreeAddr(t)
	c := startCollector(t, "--ui-listen", ui, "--gpu-price-per-hour", "2.5")
	base := "http://" + ui
	sockA := c.startAgent("gpu-node-a", "sim:4")
	sockB := c.startAgent("gpu-node-b", "sim:2")
	c.waitStreaming("gpu-node-a")
	c.waitStreaming("gpu-node-b")
	c.cli("budget", "set", "team:nlp", "0.007")
	a, b := dialTrainer(t, sockA), dialTrainer(t, sockB)

	// Node b: a live run on GPU 0 for the whole test; GPU 1 stays idle.
	b.send(`{"event":"run_start","run_id":"llama-8b-sft-live","model":"llama-3-8b","backend":"unsloth","gpus":[0],"warmup_s":0.3,"seq_len":2048,"team":"vision"}`)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				b.send(`{"event":"step","run_id":"llama-8b-sft-live","step":%d,"tokens":4096,"compute_s":0.09,"data_wait_s":0.01}`, i)
			}
		}
	}()
	defer func() { close(stop); <-done }()

	// Node a: four runs at once, two backends, two teams, then run_end.
	runs := []struct{ id, backend, team string }{
		{"mistral-7b-bnb-1", "bnb", "nlp"}, {"mistral-7b-unsloth-1", "unsloth", "nlp"},
		{"mistral-7b-bnb-2", "bnb", "research"}, {"mistral-7b-unsloth-2", "unsloth", "research"},
	}
	for gpu, r := range runs {
		a.send(`{"event":"run_start","run_id":%q,"model":"mistral-7b","backend":%q,"gpus":[%d],"warmup_s":0.5,"seq_len":1024,"batch_size":8,"team":%q}`, r.id, r.backend, gpu, r.team)
	}
	for i := 1; i <= 60; i++ {
		time.Sleep(70 * time.Millisecond)
		for k, r := range runs {
			tokens := 2000 + 40*k + i%7
			if r.backend == "unsloth" {
				tokens += 900
			}
			a.send(`{"event":"step","run_id":%q,"step":%d,"tokens":%d,"compute_s":0.06,"data_wait_s":0.01}`, r.id, i, tokens)
		}
		if i%20 == 0 {
			a.send(`{"event":"eval","run_id":%q,"epoch":%d,"val_loss":%g}`, runs[0].id, i/20, 2.5-0.2*float64(i/20))
		}
	}
	for _, r := range runs {
		a.send(`{"event":"run_end","run_id":%q}`, r.id)
	}
	a.sync()
	ids := make([]string, len(runs))
	for i, r := range runs {
		ids[i] = r.id
	}
	c.endedReports(ids...)
	// "Now" on the home page is the last minute: a GPU is busy when runs
	// used most of it. Node a's runs took about 4.3 s; once its GPUs have
	// idled longer than that (before the runs and after), they read idle.
	time.Sleep(6 * time.Second)

	shots := t.TempDir()
	if d := os.Getenv("TRAINMETER_SCREENSHOT_DIR"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		shots = d
	}
	br := newBrowser(t, exe)
	br.do(t, "window 1,400 px wide", chromedp.EmulateViewport(1400, 900))
	for _, p := range []struct{ path, ready, shot string }{
		{"/", `#fleet tr[data-node="gpu-node-b"]`, "home"},
		{"/usage?" + url.Values{"by": {"label:team"}, "since": {"24h"}}.Encode(), "#day-chart", "usage"},
		{"/runs", "#runs-body", "runs"},
		{"/runs/" + runs[0].id, `#charts[data-loaded="true"] canvas`, "run"},
		{"/compare?" + url.Values{"model": {"mistral-7b"}, "by": {"backend"}}.Encode(), "#groups", "compare"},
		{"/budgets", "#budgets", "budgets"},
		{"/nodes", `#nodes tr[data-node="gpu-node-a"]`, "nodes"},
		{"/prices", "#prices", "prices"},
		{"/recommendations", "#recommendations", "recommendations"},
	} {
		br.open(t, base, p.path, p.ready, shots, p.shot)
		if bad := eval[[]string](t, br, layoutProblems); len(bad) > 0 {
			t.Errorf("%s at 1,400 px:\n  %s", p.path, strings.Join(bad, "\n  "))
		}
		if bad := eval[[]string](t, br, lowContrast); len(bad) > 0 {
			t.Errorf("%s: contrast:\n  %s", p.path, strings.Join(bad, "\n  "))
		}
		if msg := eval[string](t, br, focusable); msg != "" {
			t.Errorf("%s: keyboard: %s", p.path, msg)
		}
		if p.shot == "home" {
			// The live run, the budget at risk, node b's busy GPU.
			home := br.values(t, `Object.fromEntries([...document.querySelectorAll("#now [data-field]")].map(e => [e.dataset.field, e.dataset.value]))`)
			if home["live_runs"] != "1" || home["budgets_at_risk"] != "1" || home["busy_gpus"] != "1" {
				t.Errorf("home page figures %v: want 1 live run, 1 budget at risk, 1 busy GPU", home)
			}
		}
	}
	// The check itself: a label too long for its box, and an empty chart,
	// put on the last page, are found.
	bad := eval[[]string](t, br, `(() => {
	  const li = document.createElement("li"); li.textContent = "a label far too long for a box of 40 px";
	  li.style.width = "40px"; li.style.whiteSpace = "nowrap"; li.style.overflow = "hidden";
	  const f = document.createElement("figure"); f.dataset.points = "0"; f.id = "empty-chart";
	  document.querySelector("main").append(li, f);
	  return `+layoutProblems+`; })()`)
	if len(bad) != 2 || !strings.Contains(bad[0], "far too long") || !strings.Contains(bad[1], "without data") {
		t.Errorf("the layout check does not find an overflowing label and an empty chart: %q", bad)
	}
	// And a grey too light on white, put on the last page, is found.
	bad = eval[[]string](t, br, `(() => {
	  const p = document.createElement("p"); p.textContent = "faint text"; p.id = "faint"; p.style.color = "#aaa";
	  document.querySelector("main").append(p);
	  return `+lowContrast+`; })()`)
	if len(bad) != 1 || !strings.Contains(bad[0], "p#faint") || !strings.Contains(bad[0], "2.32:1") {
		t.Errorf("the contrast check does not find a light grey on white: %q", bad)
	}
	t.Logf("screenshots in %s", shots)
}

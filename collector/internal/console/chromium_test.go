package console_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// The console's pages in headless Chromium, against an in-process
// collector: what a chart drew (its tick labels, legend, event labels) is
// read from the page. Without Chromium the tests skip, and fail where CI
// installs it (CI=true or TRAINMETER_REQUIRE_CHROMIUM=1).

func chromium(t *testing.T) string {
	t.Helper()
	names := []string{"chromium", "chromium-browser", "google-chrome"}
	if p := os.Getenv("TRAINMETER_CHROMIUM"); p != "" {
		names = []string{p}
	}
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium found (apt-get install chromium, or set TRAINMETER_CHROMIUM)"
	if os.Getenv("CI") == "true" || os.Getenv("TRAINMETER_REQUIRE_CHROMIUM") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// tab is a headless Chromium tab that records console errors, exceptions
// and dialogs.
type tab struct {
	ctx context.Context
	mu  sync.Mutex
	bad []string
}

func newTab(t *testing.T, width, height int) *tab {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium(t)), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(width, height), chromedp.Flag("renderer-process-limit", "1"))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	b := &tab{ctx: ctx}
	messages := chromedp.Console(ctx)
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			switch m.Type {
			case chromedp.ConsoleError, chromedp.ConsoleWarning, chromedp.ConsoleException:
				b.report(fmt.Sprintf("%s (%s:%d)", m, m.URL, m.Line))
			}
		}
	}()
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			b.report("dialog: " + ev.Message)
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	return b
}

func (b *tab) report(msg string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.bad = append(b.bad, msg)
}

// open loads url, waits for ready (a CSS selector) and fails on anything
// the page reported. TRAINMETER_SCREENSHOT_DIR keeps a screenshot.
func (b *tab) open(t *testing.T, url, ready, shot string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(ready))); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	if d := os.Getenv("TRAINMETER_SCREENSHOT_DIR"); d != "" {
		if png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
			_ = os.WriteFile(filepath.Join(d, shot+".png"), png, 0o644)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.bad) > 0 {
		t.Errorf("%s: the page reported:\n  %s", url, strings.Join(b.bad, "\n  "))
		b.bad = nil
	}
}

func js[T any](t *testing.T, b *tab, script string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](script))
	if err != nil {
		t.Fatalf("evaluate %s: %v", script, err)
	}
	return v
}

func (b *tab) mouse(t *testing.T, typ input.DispatchMouseEventType, x, y float64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.MouseEvent(typ, x, y)); err != nil {
		t.Fatal(err)
	}
}

func (b *tab) key(t *testing.T, k string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.KeyEvent(k)); err != nil {
		t.Fatal(err)
	}
}

// axisJS reads, for each chart, every tick label uPlot drew with where it
// drew it, measured in the axis font: "chart axis label left right" per
// label, and the chart's width.
const axisJS = `[...document.querySelectorAll("#charts figure")].filter(f => f.uplot).flatMap(f => {
  const u = f.uplot, m = document.createElement("canvas").getContext("2d"), out = [];
  u.axes.forEach((a, ai) => {
    m.font = a.font[0];
    (a._values || []).forEach((v, i) => {
      if (v == null || typeof v !== "string") { if (v != null) out.push({chart: f.id, axis: ai, label: "not a string: " + Object.prototype.toString.call(v), left: 0, right: 0, width: 0}); return; }
      const w = m.measureText(v).width;
      if (ai === 0) {
        const x = u.valToPos(a._splits[i], "x") + u.bbox.left / devicePixelRatio;
        out.push({chart: f.id, axis: ai, label: v, left: x - w / 2, right: x + w / 2, width: u.width});
      } else {
        out.push({chart: f.id, axis: ai, label: v, left: a._size - a.ticks.size - a.gap - w, right: a._size, width: u.width});
      }
    });
  });
  return out;
})`

type axisLabel struct {
	Chart, Label       string
	Axis               int
	Left, Right, Width float64
}

// TestRunChartsInChromium: the Run page of a 8 s run with missing windows
// and an eval, drawn by Chromium. Its time axis reads in whole seconds
// ("2 s", not ":31.050"); no axis label is cut off; every event has a
// label on the chart; the legend shows values, with the cursor on the plot
// and off it (uPlot's "--" is what it writes for no value).
func TestRunChartsInChromium(t *testing.T) {
	c := startCollector(t, nil)
	c.seedGapRun(t)
	b := newTab(t, 1400, 1600)
	b.open(t, c.base+runPath(gapRun), `#charts[data-loaded="true"] canvas`, "run-gaps")

	labels := js[[]axisLabel](t, b, axisJS)
	xTicks := 0
	for _, l := range labels {
		if strings.HasPrefix(l.Label, "not a string") {
			t.Errorf("%s axis %d: %s", l.Chart, l.Axis, l.Label)
		}
		if l.Left < 0 || l.Right > l.Width {
			t.Errorf("%s axis %d: label %q spans [%.1f, %.1f] px of a %.0f px chart: cut off", l.Chart, l.Axis, l.Label, l.Left, l.Right, l.Width)
		}
		if l.Axis == 0 {
			xTicks++
			if !strings.HasSuffix(l.Label, " s") || strings.ContainsAny(l.Label, ".:") {
				t.Errorf("%s: time tick %q, want whole seconds since the start (\"2 s\")", l.Chart, l.Label)
			}
		}
	}
	if xTicks < 6 {
		t.Errorf("%d time ticks over 6 charts: %v", xTicks, labels)
	}

	evs := js[[]string](t, b, `[...document.querySelectorAll("#chart-power .ev-label")].map(e => e.textContent)`)
	for _, want := range []string{"start", "warmup end", "eval", "end"} {
		if !slices.Contains(evs, want) {
			t.Errorf("power chart event labels %q, want %q among them", evs, want)
		}
	}
	inside := js[bool](t, b, `[...document.querySelectorAll("#charts .ev-label")].every(e => { const r = e.getBoundingClientRect(), f = e.closest("figure").getBoundingClientRect(); return r.left >= f.left && r.right <= f.right; })`)
	if !inside {
		t.Error("an event label reaches outside its chart")
	}

	legend := `[...document.querySelectorAll("#chart-power .u-legend .u-series")].map(e => (e.querySelector(".u-label")?.textContent || "") + "=" + (e.querySelector(".u-value")?.textContent || ""))`
	off := js[[]string](t, b, legend)
	for _, v := range off[1:] {
		if strings.HasSuffix(v, "--") || !strings.HasSuffix(v, " W") {
			t.Errorf("power legend without the cursor: %q, want each series' last value in W", off)
			break
		}
	}
	// The cursor on the plot at 1.5 s: each series' value there.
	pos := js[[]float64](t, b, `(() => { const u = document.querySelector("#chart-power").uplot, r = u.over.getBoundingClientRect(); return [r.left + u.valToPos(1.5, "x"), r.top + r.height / 2]; })()`)
	b.mouse(t, input.DispatchMouseEventTypeMouseMoved, pos[0], pos[1])
	on := js[[]string](t, b, legend)
	if len(on) < 3 || !strings.Contains(on[0], "s ·") {
		t.Errorf("power legend with the cursor at 1.5 s: %q", on)
	}
	for _, v := range on[1:] {
		if strings.HasSuffix(v, "--") || !strings.HasSuffix(v, " W") {
			t.Errorf("power legend with the cursor at 1.5 s: %q, want each series' value in W", on)
			break
		}
	}
	// From the keyboard: Tab to the power chart, End moves the cursor to its
	// last point, and the legend shows the values there.
	b.mouse(t, input.DispatchMouseEventTypeMouseMoved, 1, 1)
	focused := ""
	for range 20 {
		b.key(t, "\t")
		if focused = js[string](t, b, `document.activeElement.id`); focused == "chart-power" {
			break
		}
	}
	if focused != "chart-power" {
		t.Fatalf("Tab never reaches the power chart (last focus %q)", focused)
	}
	b.key(t, kb.End)
	end := js[[]string](t, b, legend)
	b.key(t, kb.ArrowLeft)
	left := js[[]string](t, b, legend)
	if len(end) < 3 || !strings.Contains(end[0], "s ·") || slices.Equal(end, left) {
		t.Errorf("power legend on the keyboard: after End %q, then ← %q: want the time and values at each", end, left)
	}
	if p := js[int](t, b, `document.querySelectorAll(".error").length`); p != 0 {
		t.Errorf("%d errors on the page", p)
	}
}

// TestCompareInChromium: the Compare page at 800 px. The page itself never
// scrolls sideways: a table wider than the window scrolls in its own box,
// its last column reachable; every label and value of the bar charts and
// the scatter lies inside its chart.
func TestCompareInChromium(t *testing.T) {
	c := startCollector(t, nil)
	c.seedCompare(t)
	b := newTab(t, 800, 1200)
	b.open(t, c.base+"/compare?model=cmp-model&by=backend", "#groups", "compare-narrow")
	if w := js[[]int](t, b, `[document.documentElement.scrollWidth, document.documentElement.clientWidth]`); w[0] > w[1] {
		t.Errorf("the page is %d px wide in a %d px window: it scrolls sideways (a table cut off)", w[0], w[1])
	}
	for _, id := range []string{"groups", "rows"} {
		ok := js[bool](t, b, fmt.Sprintf(`(() => { const tb = document.getElementById(%q), box = tb.parentElement, th = tb.querySelector("thead th:last-child");
  box.scrollLeft = box.scrollWidth; const r = th.getBoundingClientRect(), br = box.getBoundingClientRect();
  return getComputedStyle(box).overflowX === "auto" && r.right <= br.right + 1 && r.left >= br.left - 1; })()`, id))
		if !ok {
			t.Errorf("#%s: its last column is not reachable in its scrolling box", id)
		}
	}
	out := js[[]string](t, b, `[...document.querySelectorAll(".bar-chart svg text, .scatter svg text")].filter(e => {
  const r = e.getBoundingClientRect(), s = e.closest("svg").getBoundingClientRect();
  return r.left < s.left - 0.5 || r.right > s.right + 0.5 || r.top < s.top - 0.5 || r.bottom > s.bottom + 0.5; }).map(e => e.textContent)`)
	if len(out) > 0 {
		t.Errorf("labels outside their chart: %q", out)
	}
	if n := js[int](t, b, `document.querySelectorAll(".bar-chart svg text").length`); n < 20 {
		t.Errorf("%d labels on the bar charts, want a name and a value per bar", n)
	}
}

// TestRunTimeAxisInMinutes: a 5-minute run's time axis reads in minutes
// ("1 min", "1:30"), never in seconds past 120 or in milliseconds.
func TestRunTimeAxisInMinutes(t *testing.T) {
	c := startCollector(t, nil)
	conn := tu.Dial(t, c.srv.Addr().String())
	a := tu.Connect(t, conn, "n1", "boot")
	defer a.Close()
	for s := 0; s < 300; s++ {
		var evs []*trainmeterv1.RunEvent
		if s == 0 {
			evs = append(evs, tu.Start("five-min", 0, "m"))
		}
		w := tu.Window("five-min", float64(s), 1000, 300)
		w.DataWaitS = 0 // no dataloader advice: the stream answers with acks only
		a.MustAck(tu.Batch(uint64(s+1), float64(s), []*trainmeterv1.RunWindow{w}, evs...))
	}
	b := newTab(t, 1400, 1600)
	b.open(t, c.base+runPath("five-min"), `#charts[data-loaded="true"] canvas`, "run-five-min")
	minutes := regexp.MustCompile(`^(\d+ min|\d+:[0-5]\d)$`)
	whole := 0
	for _, l := range js[[]axisLabel](t, b, axisJS) {
		if l.Axis != 0 {
			continue
		}
		if !minutes.MatchString(l.Label) {
			t.Errorf("%s: time tick %q, want minutes (\"1 min\", \"1:30\")", l.Chart, l.Label)
		}
		if strings.HasSuffix(l.Label, " min") {
			whole++
		}
		if l.Left < 0 || l.Right > l.Width {
			t.Errorf("%s: time tick %q cut off", l.Chart, l.Label)
		}
	}
	if whole == 0 {
		t.Error("no whole-minute tick on a 5-minute run")
	}
}

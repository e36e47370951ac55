package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// chromiumPath finds a headless-capable Chromium: $TRAINMETER_CHROMIUM,
// else chromium, chromium-browser or google-chrome on PATH. Missing, the
// test skips, or fails under TRAINMETER_REQUIRE_CHROMIUM=1 (CI sets it).
func chromiumPath(t *testing.T) string {
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
	if os.Getenv("TRAINMETER_REQUIRE_CHROMIUM") == "1" {
		t.Fatalf("%s (TRAINMETER_REQUIRE_CHROMIUM=1)", msg)
	}
	t.Skip(msg + " (set TRAINMETER_REQUIRE_CHROMIUM=1 to fail instead)")
	return ""
}

// browser is a headless Chromium tab that records every console error or
// warning, uncaught exception, browser log entry (a CSP violation, a failed
// load) and dialog (an alert() a trainer value smuggled in).
type browser struct {
	ctx context.Context
	mu  sync.Mutex
	bad []string
}

func newBrowser(t *testing.T, exe string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1280, 1400), chromedp.Flag("renderer-process-limit", "1"))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	b := &browser{ctx: ctx}
	// The first action starts the browser, which lives as long as ctx.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", exe, err)
	}
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

func (b *browser) report(msg string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.bad = append(b.bad, msg)
}

// problems returns (and clears) what the pages reported.
func (b *browser) problems() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.bad
	b.bad = nil
	return p
}

func (b *browser) do(t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func eval[T any](t *testing.T, b *browser, js string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// open loads path, waits for ready (a CSS selector), saves a screenshot
// and fails on anything the page reported.
func (b *browser) open(t *testing.T, base, path, ready, shotDir, shot string) {
	t.Helper()
	b.do(t, "open "+path, chromedp.Navigate(base+path), chromedp.WaitVisible(chromedp.CSS(ready)))
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", path, err)
	}
	f := filepath.Join(shotDir, shot+".png")
	if err := os.WriteFile(f, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s", f)
	if p := b.problems(); len(p) > 0 {
		t.Errorf("%s: the page reported:\n  %s", path, strings.Join(p, "\n  "))
	}
}

// values evaluates js, an object of strings (data-values keyed by what they are).
func (b *browser) values(t *testing.T, js string) map[string]string {
	t.Helper()
	return eval[map[string]string](t, b, js)
}

// TestConsoleInChromium: a collector fed by a real agent (two backends,
// two ended runs each, trainer values with <script> and quotes in them),
// its console driven by headless Chromium. Every page loads with no console
// error, exception, CSP violation or dialog; the Runs, Run and Compare pages
// show exactly the figures of `trainmeter report --json` and `compare
// --json`; a new live run, and a live run's new tokens, are on the open
// pages by the first refresh asked for after the collector had them (the
// pages ask every second). Screenshots go to the test's temp dir.
func TestConsoleInChromium(t *testing.T) {
	exe := chromiumPath(t)
	ui := testkit.FreeAddr(t)
	c := startCollector(t, "--ui-listen", ui, "--gpu-price-per-hour", "2.5")
	base := "http://" + ui
	sock := c.startAgent("ui-node", "sim:2")
	c.waitStreaming("ui-node")
	tr := dialTrainer(t, sock)
	backends := map[string]string{"ui-bnb-1": "bnb", "ui-uns-1": "unsloth", "ui-bnb-2": "bnb", "ui-uns-2": "unsloth"}
	for _, pair := range [][2]string{{"ui-bnb-1", "ui-uns-1"}, {"ui-bnb-2", "ui-uns-2"}} {
		for gpu, run := range pair {
			tr.send(`{"event":"run_start","run_id":%q,"model":"ui-model","backend":%q,"gpus":[%d],"warmup_s":0.3,"seq_len":512,"dataset":"d","notes":"<script>alert('notes')</script>","labels":{"team":"\"><script>alert(1)</script>"}}`, run, backends[run], gpu)
		}
		// 30 steps 60 ms apart: over 1 s after the 0.3 s warmup, which a
		// rate after warmup needs (docs/measurement.md).
		for i := 1; i <= 30; i++ {
			time.Sleep(60 * time.Millisecond)
			tr.send(`{"event":"step","run_id":%q,"step":%d,"tokens":%d,"compute_s":0.05,"data_wait_s":0.01}`, pair[0], i, 1000+10*i)
			tr.send(`{"event":"step","run_id":%q,"step":%d,"tokens":%d,"compute_s":0.05,"data_wait_s":0.01}`, pair[1], i, 2000+10*i)
		}
		tr.send(`{"event":"eval","run_id":%q,"epoch":1,"val_loss":2.5}`, pair[0])
		for _, run := range pair {
			tr.send(`{"event":"run_end","run_id":%q}`, run)
		}
		tr.sync()
	}
	reports := c.endedReports(slices.Collect(maps.Keys(backends))...)
	c.cli("budget", "set", "model:ui-model", "50")

	// Screenshots: under the test's temp dir; TRAINMETER_SCREENSHOT_DIR
	// keeps them (to look at the pages after the test).
	shots := t.TempDir()
	if d := os.Getenv("TRAINMETER_SCREENSHOT_DIR"); d != "" {
		shots = d
	}
	b := newBrowser(t, exe)

	// Runs: every run's row has the report's figures.
	b.open(t, base, "/runs", "#runs-body", shots, "runs")
	rows := b.values(t, `Object.fromEntries([...document.querySelectorAll("#runs-body tr[data-run] [data-field]")].map(e => [e.closest("tr").dataset.run + "/" + e.dataset.field, e.dataset.value]))`)
	for run, rep := range reports {
		for _, f := range []string{"tok_per_s", "j_per_token", "avg_power_total_w", "total_cost_usd"} {
			sameNumber(t, "runs page "+run+" "+f, rows[run+"/"+f], rep[f])
		}
	}

	// Run: the figures, the report's fields, and the charts drawn.
	b.open(t, base, "/runs/ui-bnb-1", `#charts[data-loaded="true"] canvas`, shots, "run")
	cards := b.values(t, `Object.fromEntries([...document.querySelectorAll("#summary [data-field]")].map(e => [e.dataset.field, e.dataset.value]))`)
	for _, f := range []string{"j_per_token", "tok_per_s", "energy_total_j", "avg_power_total_w", "vram_peak_mb", "total_cost_usd", "projected_cost_usd", "wall_s", "tokens_processed"} {
		sameNumber(t, "run page "+f, cards[f], reports["ui-bnb-1"][f])
	}
	charts := b.values(t, `Object.fromEntries([...document.querySelectorAll("#charts figure")].map(f => [f.id, f.dataset.series + " " + f.dataset.points + " " + f.querySelectorAll("canvas").length]))`)
	for _, id := range []string{"chart-power", "chart-energy", "chart-tokps", "chart-jtok", "chart-vram", "chart-wait"} {
		if f := strings.Fields(charts[id]); len(f) != 3 || f[1] == "0" || f[2] != "1" {
			t.Errorf("run page: chart %s is %q, want series, points and a canvas", id, charts[id])
		}
	}
	if !strings.Contains(charts["chart-power"], "power_w,power_w:ui-node/gpu0") {
		t.Errorf("power chart series: %q, want the total and the run's GPU", charts["chart-power"])
	}
	fields := b.values(t, `Object.fromEntries([...document.querySelectorAll("#report-fields td[data-name]")].map(e => [e.dataset.name, e.textContent]))`)
	for _, f := range []string{"run_id", "tokens_processed", "end_status", "energy_j"} {
		if got, want := fields[f], jsonText(reports["ui-bnb-1"][f]); got != want {
			t.Errorf("run page report field %s = %s, report --json %s", f, got, want)
		}
	}

	// Compare: each group's figures are compare --json's.
	out := c.cli("compare", "--model", "ui-model", "--by", "backend", "--json")
	var raw struct {
		Groups []struct {
			Key       string         `json:"key"`
			JPerToken map[string]any `json:"j_per_token"`
			TokPerS   map[string]any `json:"tok_per_s"`
		} `json:"groups"`
		Rows []struct {
			Key     string         `json:"key"`
			Speedup map[string]any `json:"speedup"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil || len(raw.Groups) != 2 || len(raw.Rows) != 1 {
		t.Fatalf("compare --json: %v\n%s", err, out)
	}
	b.open(t, base, "/compare?"+url.Values{"model": {"ui-model"}, "by": {"backend"}}.Encode(), "#groups", shots, "compare")
	groups := b.values(t, `Object.fromEntries([...document.querySelectorAll("#groups tr[data-group]")].flatMap(tr => { const td = tr.querySelectorAll("td.n"); return [[tr.dataset.group + "/j", td[0].dataset.value], [tr.dataset.group + "/jlo", td[0].dataset.ciLow], [tr.dataset.group + "/tok", td[1].dataset.value]]; }))`)
	for _, g := range raw.Groups {
		sameNumber(t, "compare "+g.Key+" J/token", groups[g.Key+"/j"], g.JPerToken["mean"])
		sameNumber(t, "compare "+g.Key+" J/token ci_low", groups[g.Key+"/jlo"], g.JPerToken["ci_low"])
		sameNumber(t, "compare "+g.Key+" tok/s", groups[g.Key+"/tok"], g.TokPerS["mean"])
	}
	speed := b.values(t, `Object.fromEntries([...document.querySelectorAll("#rows tr[data-group]")].map(tr => [tr.dataset.group, tr.querySelectorAll("td.n")[1].dataset.value]))`)
	sameNumber(t, "compare speedup", speed[raw.Rows[0].Key], raw.Rows[0].Speedup["value"])

	for _, p := range []struct{ path, ready, shot string }{
		{"/budgets", "#budgets", "budgets"}, {"/prices", "#prices", "prices"},
		{"/recommendations", "#recommendations", "recommendations"}, {"/nodes", `#nodes tr[data-node="ui-node"]`, "nodes"},
	} {
		b.open(t, base, p.path, p.ready, shots, p.shot)
	}

	// Live: on the open Runs page, a new run appears, with its sparkline,
	// by the first refresh asked for after the collector had it.
	b.open(t, base, "/runs", "#runs-body", shots, "runs-before-live")
	tr.send(`{"event":"run_start","run_id":"ui-live","model":"ui-model","backend":"bnb","gpus":[0],"warmup_s":0.2}`)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				tr.send(`{"event":"step","run_id":"ui-live","step":%d,"tokens":500,"compute_s":0.09,"data_wait_s":0.01}`, i)
			}
		}
	}()
	defer func() { close(stop); <-done }()
	seen := c.collectorHas(func() bool {
		r, err := c.q.GetRun(context.Background(), &trainmeterv1.GetRunRequest{RunId: "ui-live"})
		return err == nil && r.GetRun().GetTokensProcessed() > 0
	})
	lag := b.waitRefresh(t, "#runs", seen, `document.querySelector('#runs-body tr[data-run="ui-live"] svg polyline') !== null`)
	t.Logf("runs page: the live run on the page %v after the collector had it (the page asks every second)", lag)
	if p := b.problems(); len(p) > 0 {
		t.Errorf("runs page while live:\n  %s", strings.Join(p, "\n  "))
	}

	// On the live run's page, its tokens grow with the collector's.
	b.open(t, base, "/runs/ui-live", `#charts[data-loaded="true"] canvas`, shots, "run-live")
	before := eval[uint64](t, b, `Number(document.querySelector('#summary [data-field="tokens_processed"]').dataset.value)`)
	var target uint64
	seen = c.collectorHas(func() bool {
		r, err := c.q.GetRun(context.Background(), &trainmeterv1.GetRunRequest{RunId: "ui-live"})
		target = r.GetRun().GetTokensProcessed()
		return err == nil && target > before
	})
	lag = b.waitRefresh(t, "#run", seen, fmt.Sprintf(`Number(document.querySelector('#summary [data-field="tokens_processed"]').dataset.value) >= %d`, target))
	t.Logf("run page: tokens %d → ≥ %d on the page %v after the collector had them", before, target, lag)
	if p := b.problems(); len(p) > 0 {
		t.Errorf("run page while live:\n  %s", strings.Join(p, "\n  "))
	}
}

// collectorHas waits until ok (a query of the collector) holds and returns
// when it first did.
func (c *cluster) collectorHas(ok func() bool) time.Time {
	c.t.Helper()
	c.eventually("the collector to have the change", ok)
	return time.Now()
}

// waitRefresh waits until the page (sel, whose data-updated-ms its script
// sets to when it asked for the data shown) has refreshed with data asked
// for after since, then checks cond holds on the page: what the collector
// had at since is shown by the next refresh, so by the page's poll interval
// (data-poll-ms, at most 1 s) plus one answer. Returns how long it took.
func (b *browser) waitRefresh(t *testing.T, sel string, since time.Time, cond string) time.Duration {
	t.Helper()
	poll := eval[int](t, b, fmt.Sprintf(`Number(document.querySelector(%q).dataset.pollMs)`, sel))
	if poll <= 0 || poll > 1000 {
		t.Errorf("%s polls every %d ms, want at most 1000 (live updates within 2 s)", sel, poll)
	}
	js := fmt.Sprintf(`Number(document.querySelector(%q).dataset.updatedMs || 0) > %d`, sel, since.UnixMilli())
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("waiting for %s to refresh: %v", sel, err)
	}
	lag := time.Since(since)
	ok := eval[bool](t, b, cond)
	if !ok {
		t.Errorf("the first refresh of %s after the collector had the change does not show it (%s)", sel, cond)
	}
	return lag
}

// sameNumber: a data-value on a page is the JSON number, exactly.
func sameNumber(t *testing.T, what, page string, want any) {
	t.Helper()
	w, ok := want.(float64)
	if !ok {
		t.Errorf("%s: --json has %v (%T), want a number", what, want, want)
		return
	}
	got, err := strconv.ParseFloat(page, 64)
	if err != nil || got != w {
		t.Errorf("%s: page %q, --json %v", what, page, w)
	}
	if w == 0 {
		t.Errorf("%s is 0: the check proves nothing", what)
	}
}

// jsonText is v as the Run page's report-field table writes it (compact JSON).
func jsonText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestConsoleLoginInChromium: the console's login, driven by headless
// Chromium against the real collector with a read token. "next" points at
// another host the test owns as /%09/HOST/pwned: the form posts it back with
// the TAB decoded, and Chromium drops a TAB from a URL, so a redirect to
// "/\t/HOST/pwned" is one to "//HOST/pwned".
//
// From another site (login CSRF, as an attacker's page would do it): a page
// of another origin that posts the attacker's token and that next to
// /login is refused with 403; the browser has no console cookie and never
// asks the other host for /pwned.
//
// From the console's own form (a victim following a crafted link): the
// login succeeds and the browser lands on the console's home, not on the
// other host.
func TestConsoleLoginInChromium(t *testing.T) {
	exe := chromiumPath(t)
	dir := t.TempDir()
	const readTok = "e2e-console-read-token-51c2"
	readFile := filepath.Join(dir, "read.token")
	if err := os.WriteFile(readFile, []byte(readTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ui := testkit.FreeAddr(t)
	creds, _ := tlsfiles.StaticToken(readTok, true)
	startSecureCollector(t, []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(creds)},
		"--ui-listen", ui, "--read-token-file", readFile)
	base := "http://" + ui

	// The other site: records every request; /csrf is a page that posts
	// the attacker's token to the console's login as soon as it loads.
	var mu sync.Mutex
	var evilHits []string
	var next string
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		evilHits = append(evilHits, r.URL.Path)
		mu.Unlock()
		if r.URL.Path == "/csrf" {
			fmt.Fprintf(w, `<!doctype html><form id="f" method="post" action="%s/login"><input name="token" value="%s"><input name="next" value="%s"></form><script>document.getElementById("f").submit()</script>`,
				base, readTok, strings.ReplaceAll(next, "%09", "&#9;"))
			return
		}
		fmt.Fprint(w, "<!doctype html><p id=evil>the other host</p>")
	}))
	t.Cleanup(evil.Close)
	next = "/%09/" + strings.TrimPrefix(evil.URL, "http://") + "/pwned"
	hits := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(evilHits)
	}

	b := newBrowser(t, exe)
	cookies := func() []string {
		ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
		defer cancel()
		res, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{base + "/"}})
		if err != nil {
			t.Fatalf("cookies: %v", err)
		}
		var out []string
		for _, c := range res.Cookies {
			out = append(out, c.Name)
		}
		return out
	}
	// settle waits until the tab is on a page other than from (a URL
	// prefix), then a little longer for a redirect to go on elsewhere,
	// and returns where it is and what it shows.
	settle := func(from string) (string, string) {
		deadline := time.Now().Add(20 * time.Second)
		for {
			loc := eval[string](t, b, `document.location.href`)
			if !strings.HasPrefix(loc, from) || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond)
		return eval[string](t, b, `document.location.href`), eval[string](t, b, `document.body ? document.body.innerText : ""`)
	}

	// From another site.
	b.do(t, "open the other site's page", chromedp.Navigate(evil.URL+"/csrf"))
	loc, body := settle(evil.URL + "/csrf")
	if u, err := url.Parse(loc); err != nil || u.Host != ui || !strings.Contains(body, "cross-site request refused") {
		t.Errorf("a login posted from another site with next=%s: the browser is at %q showing %q, want the console's refusal", next, loc, body)
	}
	if c := cookies(); slices.Contains(c, "trainmeter_token") {
		t.Errorf("a login posted from another site set the console's cookie: %v", c)
	}
	if h := hits(); slices.Contains(h, "/pwned") {
		t.Errorf("a login posted from another site sent the browser to the other host: it was asked for %v", h)
	}
	b.problems() // the refusal's 403 is reported as a failed load

	// From the console's own form.
	b.do(t, "log in with next="+next,
		chromedp.Navigate(base+"/login?next="+next),
		chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)),
		chromedp.SetValue(chromedp.CSS(`input[name="token"]`), readTok),
		chromedp.Submit(chromedp.CSS(`form.login`)),
	)
	loc, _ = settle(base + "/login")
	if u, err := url.Parse(loc); err != nil || u.Host != ui || u.Path != "/" {
		t.Errorf("after login with next=%s the browser is at %q, want the console's home /", next, loc)
	}
	if h := hits(); slices.Contains(h, "/pwned") {
		t.Errorf("the login sent the browser to the other host: it was asked for %v", h)
	}
	if c := cookies(); !slices.Contains(c, "trainmeter_token") {
		t.Errorf("the login form with the read token set no cookie: %v", c)
	}
	if p := b.problems(); len(p) > 0 {
		t.Errorf("login pages reported:\n  %s", strings.Join(p, "\n  "))
	}
}

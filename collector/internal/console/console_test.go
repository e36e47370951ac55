package console_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"golang.org/x/net/html"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/console"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/clock"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles/tlstest"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.GoleakOptions()...)
}

// Trainer-supplied values that would run a script, or break out of an
// attribute, if a page interpolated them unescaped.
const (
	evilRun   = `r<script>alert("run")</script>'"`
	evilRun2  = `q"><img src=x onerror=alert(2)>`
	evilModel = `m<script>alert('model')</script>`
	evilNote  = `<script>alert("note")</script>`
	evilLabel = `"><script>alert(3)</script>`
	evilError = `torch.cuda.OutOfMemoryError: <script>alert("oom")</script>`
)

type collector struct {
	srv  *server.Server
	base string // http://host:port of the console
}

func startCollector(t *testing.T, mod func(*server.Config)) *collector {
	t.Helper()
	cfg := server.Config{Listen: "127.0.0.1:0", UIListen: "127.0.0.1:0", DataDir: filepath.Join(t.TempDir(), "data"), Clock: tu.Clock(), GPUPricePerHour: 2}
	if mod != nil {
		mod(&cfg)
	}
	srv := server.New(cfg, slog.New(slog.DiscardHandler))
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	c := &collector{srv: srv}
	if a := srv.ConsoleAddr(); a != nil {
		c.base = "http://" + a.String()
	}
	return c
}

// seed ingests two ended runs of the evil model through the real ingest
// stream, with the evil values in every trainer-supplied field.
func (c *collector) seed(t *testing.T) {
	t.Helper()
	conn := tu.Dial(t, c.srv.Addr().String())
	a := tu.Connect(t, conn, "node<b>1", "boot")
	defer a.Close()
	var seq uint64
	for i, run := range []string{evilRun, evilRun2} {
		start := tu.Start(run, 0, evilModel)
		rs := start.GetRunStart()
		rs.Metadata.Notes = evilNote
		rs.Metadata.Backend = []string{"bnb", "unsloth"}[i]
		rs.Labels = map[string]string{"team": evilLabel}
		rs.User, rs.Attribution = "alice", "slurm"
		for s := 0; s < 5; s++ {
			seq++
			w := tu.Window(run, float64(s), uint64(1000*(i+1)), 300)
			var evs []*trainmeterv1.RunEvent
			if s == 0 {
				evs = append(evs, start)
			}
			if s == 4 {
				end := tu.End(run, 5)
				if i == 0 { // the first run failed, with a cause
					end.GetRunEnd().EndStatus, end.GetRunEnd().EndError = "error", evilError
				}
				evs = append(evs, end)
			}
			a.MustAck(tu.Batch(seq, float64(s), []*trainmeterv1.RunWindow{w}, evs...))
		}
	}
}

func get(t *testing.T, client *http.Client, u string) (*http.Response, string) {
	t.Helper()
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func runPath(id string) string { return "/runs/" + url.PathEscape(id) }

// consolePages are every page with the evil runs in it.
func consolePages() []string {
	q := url.Values{"run": {evilRun, evilRun2}}.Encode()
	return []string{"/", "/usage?by=label:team&by=model&since=2025-03-01", "/runs", "/runs/rows", runPath(evilRun), runPath(evilRun) + "/summary", runPath(evilRun2),
		"/compare?" + q, "/compare?" + url.Values{"model": {evilModel}, "by": {"backend"}}.Encode(),
		"/budgets", "/prices", "/recommendations", "/nodes", "/runs?" + url.Values{"label": {"team=" + evilLabel}}.Encode()}
}

// unsafeMarkup parses a page as a browser does and returns what could run
// a script: a script element that is not one of the console's files, an
// event handler attribute, a javascript: URL, a style element or
// attribute (the CSP would block them: a console error).
func unsafeMarkup(body string) []string {
	var bad []string
	z := html.NewTokenizer(strings.NewReader(body))
	for {
		tt := z.Next()
		switch tt {
		case html.ErrorToken:
			return bad
		case html.StartTagToken, html.SelfClosingTagToken:
			tok := z.Token()
			if tok.Data == "style" {
				bad = append(bad, "<style>")
			}
			src := ""
			for _, a := range tok.Attr {
				k, v := strings.ToLower(a.Key), strings.ToLower(strings.TrimSpace(a.Val))
				switch {
				case strings.HasPrefix(k, "on"):
					bad = append(bad, tok.String())
				case k == "style":
					bad = append(bad, tok.String())
				case (k == "href" || k == "src" || k == "action") && strings.HasPrefix(v, "javascript:"):
					bad = append(bad, tok.String())
				case k == "src":
					src = a.Val
				}
			}
			if tok.Data == "script" && !strings.HasPrefix(src, "/static/") {
				bad = append(bad, tok.String())
			}
		}
	}
}

// TestPagesEscapeTrainerValues: run ids, a model, notes and labels with
// <script> and quotes in them are shown as text on every page, never as
// markup, and the charts' JSON carries them as data.
func TestPagesEscapeTrainerValues(t *testing.T) {
	c := startCollector(t, nil)
	c.seed(t)
	for _, p := range consolePages() {
		resp, body := get(t, nil, c.base+p)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %s\n%s", p, resp.Status, body)
			continue
		}
		for _, evil := range []string{evilRun, evilRun2, evilModel, evilNote, evilLabel, evilError, "<img", `alert("`} {
			if strings.Contains(body, evil) {
				t.Errorf("GET %s: the raw trainer value %q is in the page", p, evil)
			}
		}
		if bad := unsafeMarkup(body); len(bad) > 0 {
			t.Errorf("GET %s: markup that could run a script: %q", p, bad)
		}
	}
	// The values are there, escaped, where a user reads them; the failed
	// run's cause once in its summary and once in the report's fields.
	_, body := get(t, nil, c.base+runPath(evilRun))
	if want := `<code id="end-error">torch.cuda.OutOfMemoryError: &lt;script&gt;alert(&#34;oom&#34;)&lt;/script&gt;</code>`; !strings.Contains(body, want) ||
		!strings.Contains(body, `data-name="end_error"`) {
		t.Errorf("run page lacks the escaped end error %s or its report field", want)
	}
	if want := `<dd id="attribution">alice · slurm</dd>`; !strings.Contains(body, want) || !strings.Contains(body, `data-name="attribution"`) {
		t.Errorf("run page lacks who ran it and where the run came from: %s", want)
	}
	for _, want := range []string{`r&lt;script&gt;alert(&#34;run&#34;)&lt;/script&gt;&#39;&#34;`, `&lt;script&gt;alert(&#34;note&#34;)&lt;/script&gt;`, `team=&#34;&gt;&lt;script&gt;alert(3)&lt;/script&gt;`} {
		if !strings.Contains(body, want) {
			t.Errorf("run page lacks the escaped %s", want)
		}
	}
	// The run link is one path segment: the run's page opens.
	_, rows := get(t, nil, c.base+"/runs/rows")
	if !strings.Contains(rows, `href="/runs/r%3cscript%3ealert%28%22run%22%29%3c%2fscript%3e%27%22"`) && !strings.Contains(rows, `href="`+runPath(evilRun)+`"`) {
		t.Errorf("run link is not one escaped path segment:\n%s", rows)
	}

	resp, body := get(t, nil, c.base+"/api"+runPath(evilRun)+"/timeline")
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "application/json" {
		t.Fatalf("timeline: %s %s\n%s", resp.Status, ct, body)
	}
	if strings.ContainsAny(body, "<>") {
		t.Errorf("timeline JSON has a raw < or >: %s", body)
	}
	var tl struct {
		RunID  string `json:"run_id"`
		Series []struct {
			Name string
		}
	}
	if err := json.Unmarshal([]byte(body), &tl); err != nil || tl.RunID != evilRun || len(tl.Series) == 0 {
		t.Fatalf("timeline JSON: %v %q %d series", err, tl.RunID, len(tl.Series))
	}
}

// TestSecurityHeaders: every answer (pages, data, assets, errors) has the
// strict CSP and the other headers.
func TestSecurityHeaders(t *testing.T) {
	c := startCollector(t, nil)
	c.seed(t)
	for _, p := range []string{"/runs", "/api" + runPath(evilRun) + "/timeline", "/static/run.js", "/static/vendor/uplot/uPlot.iife.min.js", "/runs/nope", "/login"} {
		resp, _ := get(t, nil, c.base+p)
		csp := resp.Header.Get("Content-Security-Policy")
		for _, want := range []string{"script-src 'self'", "object-src 'none'", "frame-ancestors 'none'", "base-uri 'none'", "default-src 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("GET %s: CSP %q lacks %s", p, csp, want)
			}
		}
		if strings.Contains(csp, "unsafe") {
			t.Errorf("GET %s: CSP allows unsafe: %q", p, csp)
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("X-Frame-Options") != "DENY" || resp.Header.Get("Referrer-Policy") != "same-origin" {
			t.Errorf("GET %s: headers %v", p, resp.Header)
		}
	}
	if resp, _ := get(t, nil, c.base+"/runs/nope"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown run: %s, want 404", resp.Status)
	}
	if resp, _ := get(t, nil, c.base+"/static/vendor/uplot/uPlot.iife.min.js"); resp.Header.Get("Content-Type") != "text/javascript; charset=utf-8" {
		t.Errorf("uPlot served as %q", resp.Header.Get("Content-Type"))
	}
}

// TestPagesShowTheServicesNumbers: the figures on the Runs, Run and
// Compare pages are the query API's, to the last digit.
func TestPagesShowTheServicesNumbers(t *testing.T) {
	c := startCollector(t, nil)
	c.seed(t)
	ctx := context.Background()
	qs := queryClient(t, c)
	run, err := qs.GetRun(ctx, &trainmeterv1.GetRunRequest{RunId: evilRun})
	if err != nil {
		t.Fatal(err)
	}
	r := run.GetRun()
	want := map[string]float64{"tok_per_s": r.GetTokPerS(), "j_per_token": r.GetJPerToken(), "avg_power_total_w": r.GetAvgPowerTotalW(),
		"total_cost_usd": r.GetTotalCostUsd(), "energy_total_j": r.GetEnergyTotalJ(), "projected_cost_usd": r.GetProjectedCostUsd(), "wall_s": r.GetWallS()}
	_, body := get(t, nil, c.base+runPath(evilRun))
	got := dataValues(body)
	for k, v := range want {
		if v == 0 {
			t.Errorf("%s is 0 in the report: the check would prove nothing", k)
		}
		if got[k] != v {
			t.Errorf("run page %s = %v, report %v", k, got[k], v)
		}
	}
	cmp, err := qs.Compare(ctx, &trainmeterv1.CompareRequest{Model: evilModel, By: "backend"})
	if err != nil {
		t.Fatal(err)
	}
	_, page := get(t, nil, c.base+"/compare?"+url.Values{"model": {evilModel}, "by": {"backend"}}.Encode())
	for _, g := range cmp.GetGroups() {
		cell := regexp.MustCompile(`data-group="` + regexp.QuoteMeta(g.GetKey()) + `">\s*<td>[^<]*(?:<em>[^<]*</em>)?</td>\s*<td[^>]*>\d+</td>\s*<td class="n" data-value="([^"]+)"`).FindStringSubmatch(page)
		if cell == nil {
			t.Fatalf("compare page: no row for group %q:\n%s", g.GetKey(), page)
		}
		if v, _ := strconv.ParseFloat(cell[1], 64); v != g.GetJPerToken().GetMean() {
			t.Errorf("compare page %s J/token %v, Compare %v", g.GetKey(), v, g.GetJPerToken().GetMean())
		}
	}
}

func queryClient(t *testing.T, c *collector) trainmeterv1.QueryServiceClient {
	return trainmeterv1.NewQueryServiceClient(tu.Dial(t, c.srv.Addr().String()))
}

var dataValue = regexp.MustCompile(`data-field="([^"]+)" data-value="([^"]+)"`)

func dataValues(body string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range dataValue.FindAllStringSubmatch(body, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		out[m[1]] = v
	}
	return out
}

// TestConsoleTokens: with query tokens the console needs the read or the
// admin token, from a header or the login cookie; an ingest token or a
// wrong one is refused; without query tokens it is open.
func TestConsoleTokens(t *testing.T) {
	dir := t.TempDir()
	readFile, adminFile, ingestFile := filepath.Join(dir, "read"), filepath.Join(dir, "admin"), filepath.Join(dir, "ingest.yaml")
	for f, s := range map[string]string{readFile: "read-tok-1", adminFile: "admin-tok-2", ingestFile: "\"node<b>1\": ingest-tok-3\n"} {
		if err := tlstest.WriteFile(f, []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	c := startCollector(t, func(cfg *server.Config) {
		cfg.ReadTokenFile, cfg.AdminTokenFile = readFile, adminFile
	})
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, _ := get(t, noRedirect, c.base+"/runs?model=x")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login?next=%2Fruns%3Fmodel%3Dx" {
		t.Errorf("page without a token: %s → %q, want 303 to the login form", resp.Status, resp.Header.Get("Location"))
	}
	if resp, _ := get(t, nil, c.base+"/runs/rows"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("fragment without a token: %s, want 401", resp.Status)
	}
	if resp, _ := get(t, nil, c.base+"/static/run.js"); resp.StatusCode != http.StatusOK {
		t.Errorf("assets need no token (they hold no data): %s", resp.Status)
	}
	bearer := func(tok, path string) int {
		req, _ := http.NewRequest(http.MethodGet, c.base+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for tok, want := range map[string]int{"read-tok-1": 200, "admin-tok-2": 200, "ingest-tok-3": 401, "wrong": 401} {
		if got := bearer(tok, "/api/runs/x/timeline"); got != want && !(want == 200 && got == 404) {
			t.Errorf("token %s on data: %d, want %d", tok, got, want)
		}
		if got := bearer(tok, "/nodes"); got != want {
			t.Errorf("token %s on a page: %d, want %d", tok, got, want)
		}
	}
	// The login form: a wrong token is refused, the read token sets an
	// HttpOnly, SameSite=Strict cookie the pages then accept.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	resp, err := browser.PostForm(c.base+"/login", url.Values{"token": {"wrong"}, "next": {"/nodes"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("login with a wrong token: %s", resp.Status)
	}
	resp, err = noRedirect.PostForm(c.base+"/login", url.Values{"token": {"read-tok-1"}, "next": {"//evil.example/"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	ck := resp.Header.Get("Set-Cookie")
	if resp.Header.Get("Location") != "/" || !strings.Contains(ck, "HttpOnly") || !strings.Contains(ck, "SameSite=Strict") {
		t.Errorf("login: %s → %q, cookie %q (want a local redirect and an HttpOnly SameSite=Strict cookie)", resp.Status, resp.Header.Get("Location"), ck)
	}
	resp, err = browser.PostForm(c.base+"/login", url.Values{"token": {"read-tok-1"}, "next": {"/nodes"}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `<table id="nodes">`) {
		t.Errorf("after login: %s\n%s", resp.Status, body)
	}

	// Ingest tokens alone do not close the console: the query API is open then too.
	open := startCollector(t, func(cfg *server.Config) { cfg.IngestTokensFile = ingestFile })
	if resp, _ := get(t, nil, open.base+"/runs"); resp.StatusCode != http.StatusOK {
		t.Errorf("ingest tokens only: %s, want the console open as the query API is", resp.Status)
	}
}

// TestUIListen: the default address taken leaves the collector running
// without a console; an address asked for and taken is an error; "" is
// no console; the query address is refused.
func TestUIListen(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	c := startCollector(t, func(cfg *server.Config) { cfg.UIListen, cfg.UIListenDefault = taken.Addr().String(), true })
	if c.srv.ConsoleAddr() != nil {
		t.Errorf("console on a taken default address: %v", c.srv.ConsoleAddr())
	}
	srv := server.New(server.Config{Listen: "127.0.0.1:0", UIListen: taken.Addr().String(), DataDir: t.TempDir()}, nil)
	if err := srv.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "console: listen on") {
		_ = srv.Shutdown(context.Background())
		t.Errorf("asked-for address taken: %v, want an error", err)
	}
	off := startCollector(t, func(cfg *server.Config) { cfg.UIListen = "" })
	if off.srv.ConsoleAddr() != nil {
		t.Errorf("--ui-listen \"\": console at %v", off.srv.ConsoleAddr())
	}
	bad := server.Config{Listen: "127.0.0.1:7433", UIListen: "127.0.0.1:7433", DataDir: "x"}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "its own port") {
		t.Errorf("same address as the query API: %v", err)
	}
	if console.DefaultListen != "127.0.0.1:7434" {
		t.Errorf("default moved to %s: update docs/console.md and README", console.DefaultListen)
	}
}

// TestConsoleTLS: with the query API's certificate (and client CA) the
// console serves HTTPS only, requires a client certificate signed by that
// CA as gRPC does, and says HSTS; plain HTTP gets no page.
func TestConsoleTLS(t *testing.T) {
	files, err := tlstest.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := startCollector(t, func(cfg *server.Config) {
		cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSClientCAFile = files.ServerCert, files.ServerKey, files.CAFile
	})
	addr := c.srv.ConsoleAddr().String()
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(files.CAFile)
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CA: %v", err)
	}
	clientCert, err := tls.LoadX509KeyPair(files.ClientCert, files.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	client := func(certs ...tls.Certificate) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: certs, MinVersion: tls.VersionTLS12}}}
	}
	resp, err := client(clientCert).Get("https://" + addr + "/runs")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Strict-Transport-Security"), "max-age=") {
		t.Errorf("https with a client certificate: %s, HSTS %q", resp.Status, resp.Header.Get("Strict-Transport-Security"))
	}
	if resp, err := client().Get("https://" + addr + "/runs"); err == nil {
		resp.Body.Close()
		t.Errorf("https without a client certificate: %s, want the handshake refused (mTLS)", resp.Status)
	}
	if resp, err := http.Get("http://" + addr + "/runs"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "<table") {
			t.Errorf("plain HTTP on the TLS console served a page: %s", resp.Status)
		}
	}
}

// TestRunsFiltersAndBudgets: the Runs page's filters narrow the rows as
// named; the Budgets page shows a budget set through the API with its
// figures.
func TestRunsFiltersAndBudgets(t *testing.T) {
	c := startCollector(t, nil)
	c.seed(t)
	rowsOf := func(q url.Values) []string {
		_, body := get(t, nil, c.base+"/runs/rows?"+q.Encode())
		var ids []string
		for _, m := range regexp.MustCompile(`<tr data-run="([^"]*)"`).FindAllStringSubmatch(body, -1) {
			ids = append(ids, html.UnescapeString(m[1]))
		}
		return ids
	}
	for _, tc := range []struct {
		q    url.Values
		want []string
	}{
		{url.Values{}, []string{evilRun, evilRun2}},
		{url.Values{"backend": {"bnb"}}, []string{evilRun}},
		{url.Values{"backend": {"unsloth"}, "model": {evilModel}}, []string{evilRun2}},
		{url.Values{"model": {"other"}}, nil},
		{url.Values{"status": {"live"}}, nil},
		{url.Values{"status": {"ended"}}, []string{evilRun, evilRun2}},
		{url.Values{"label": {"team=" + evilLabel}}, []string{evilRun, evilRun2}},
		{url.Values{"label": {"team"}}, []string{evilRun, evilRun2}},
		{url.Values{"label": {"team=nlp"}}, nil},
	} {
		got := rowsOf(tc.q)
		if strings.Join(got, "|") != strings.Join(tc.want, "|") && !(len(got) == 2 && len(tc.want) == 2 && got[0] == tc.want[1] && got[1] == tc.want[0]) {
			t.Errorf("rows?%s: %q, want %q", tc.q.Encode(), got, tc.want)
		}
	}

	bc := trainmeterv1.NewBudgetServiceClient(tu.Dial(t, c.srv.Addr().String()))
	if _, err := bc.SetBudget(context.Background(), &trainmeterv1.SetBudgetRequest{Scope: "model:" + evilModel, LimitUsd: 123.5}); err != nil {
		t.Fatal(err)
	}
	want, err := bc.ListBudgets(context.Background(), &trainmeterv1.ListBudgetsRequest{})
	if err != nil || len(want.GetBudgets()) != 1 {
		t.Fatalf("ListBudgets: %v %v", err, want)
	}
	_, body := get(t, nil, c.base+"/budgets")
	for _, v := range []float64{123.5, want.GetBudgets()[0].GetSpentUsd(), want.GetBudgets()[0].GetProjectedUsd()} {
		if !strings.Contains(body, `data-value="`+strconv.FormatFloat(v, 'g', -1, 64)+`"`) {
			t.Errorf("budgets page lacks %v:\n%s", v, body)
		}
	}
	if want.GetBudgets()[0].GetSpentUsd() == 0 {
		t.Error("the budget's runs cost nothing: the check proves less")
	}
}

// TestBadInput: a wrong run, grouping key, number or range is a clear
// 4xx answer with the service's message, and the console keeps serving.
func TestBadInput(t *testing.T) {
	c := startCollector(t, nil)
	c.seed(t)
	for _, tc := range []struct {
		path string
		code int
		says string
	}{
		{"/runs/no-such-run", 404, "not found"},
		{"/runs/no-such-run/summary", 404, "not found"},
		{"/api/runs/no-such-run/timeline", 404, "not found"},
		{"/api" + runPath(evilRun) + "/timeline?max_points=abc", 400, "max_points"},
		{"/api" + runPath(evilRun) + "/timeline?max_points=5", 400, "max_points"},
		{"/compare?" + url.Values{"model": {evilModel}, "by": {"colour"}}.Encode(), 400, "colour"},
		{"/compare?runs=no-such-run+other", 400, "unknown"},
		// Runs named are read alone: the unknown ones are named, in order.
		{"/compare?" + url.Values{"run": {evilRun, "gone", evilRun2, "nope"}}.Encode(), 400, "unknown run(s): [&#34;gone&#34; &#34;nope&#34;]"},
		{"/compare?" + url.Values{"run": {evilRun, evilRun}}.Encode(), 400, "named twice"},
		{"/compare?" + url.Values{"model": {evilModel}, "by": {"backend"}, "baseline": {"tpu"}}.Encode(), 400, "tpu"},
		{"/recommendations?min_confidence=2", 400, "min_confidence"},
		{"/runs?page=999999", 200, "runs-body"},
		{"/nope", 404, ""},
	} {
		resp, body := get(t, nil, c.base+tc.path)
		if resp.StatusCode != tc.code || !strings.Contains(strings.ToLower(body), strings.ToLower(tc.says)) {
			t.Errorf("GET %s: %s, want %d saying %q:\n%.400s", tc.path, resp.Status, tc.code, tc.says, body)
		}
	}
	if resp, _ := get(t, nil, c.base+"/runs"); resp.StatusCode != 200 {
		t.Errorf("after bad input: /runs %s", resp.Status)
	}
}

// TestPricesPage: offers imported through the API show on the Prices page
// with the service's cheapest and median per GPU-hour, and a GPU model's
// recommended offers with ?gpu=; a provider name with markup stays text.
func TestPricesPage(t *testing.T) {
	c := startCollector(t, nil)
	ps := trainmeterv1.NewPriceServiceClient(tu.Dial(t, c.srv.Addr().String()))
	if _, err := ps.ImportPrices(t.Context(), &trainmeterv1.ImportPricesRequest{Offers: []*trainmeterv1.PriceOffer{
		{Id: "o1", Provider: "p1", GpuName: "H100 SXM", NumGpus: 8, UsdPerHour: 28.8, Reliability: proto.Float64(0.99), Location: "EU"},
		{Id: "o2", Provider: `<b>p</b>`, GpuName: "H100 SXM", NumGpus: 1, UsdPerHour: 1.9, Location: "US"}, // reliability unknown
		{Id: "o3", Provider: "p2", GpuName: "A100 SXM4", NumGpus: 1, UsdPerHour: 1.1},
	}}); err != nil {
		t.Fatal(err)
	}
	want, err := ps.ListPrices(t.Context(), &trainmeterv1.ListPricesRequest{Gpu: "H100 SXM"})
	if err != nil || len(want.GetGpus()) != 1 {
		t.Fatalf("ListPrices: %v %v", err, want)
	}
	g := want.GetGpus()[0]
	for _, p := range []string{"/prices", "/prices?gpu=H100+SXM"} {
		resp, body := get(t, nil, c.base+p)
		if resp.StatusCode != 200 || strings.Contains(body, "<b>p</b>") || !strings.Contains(body, "&lt;b&gt;p&lt;/b&gt;") {
			t.Errorf("GET %s: %s, provider not shown escaped:\n%s", p, resp.Status, body)
		}
		for _, v := range []float64{g.GetCheapestUsdPerGpuHour(), g.GetMedianUsdPerGpuHour()} {
			if !strings.Contains(body, `data-value="`+strconv.FormatFloat(v, 'g', -1, 64)+`"`) {
				t.Errorf("GET %s lacks %v", p, v)
			}
		}
	}
	if len(g.GetRecommended()) > 0 {
		_, body := get(t, nil, c.base+"/prices?gpu=H100+SXM")
		if !strings.Contains(body, "Recommended offers") {
			t.Error("?gpu= does not list the recommended offers")
		}
		if !strings.Contains(body, "reliability 0.99,") || !strings.Contains(body, "reliability -,") {
			t.Errorf("recommended offers: want reliability 0.99 for o1 and - (unknown) for o2:\n%s", body)
		}
	}
}

// TestPricesPageWithEveryCatalogStale: when the only provider has failed
// for longer than the max offer age, the Prices page says that every
// catalog is stale instead of "No prices yet".
func TestPricesPageWithEveryCatalogStale(t *testing.T) {
	list := filepath.Join(t.TempDir(), "prices.csv")
	if err := os.WriteFile(list, []byte("gpu_name,num_gpus,dph_total\nL40S,2,1.8\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Now())
	c := startCollector(t, func(cfg *server.Config) {
		cfg.Clock = clk
		cfg.Prices = server.PriceConfig{Provider: "file", File: list, MaxOfferAge: time.Hour}
	})
	ps := trainmeterv1.NewPriceServiceClient(tu.Dial(t, c.srv.Addr().String()))
	if _, err := ps.FetchPrices(t.Context(), &trainmeterv1.FetchPricesRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, body := get(t, nil, c.base+"/prices"); !strings.Contains(body, "L40S") || strings.Contains(body, "warning:") {
		t.Fatalf("prices after a good fetch:\n%s", body)
	}
	if err := os.WriteFile(list, []byte("gpu_name,dph_total\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Hour)
	if _, err := ps.FetchPrices(t.Context(), &trainmeterv1.FetchPricesRequest{}); err == nil {
		t.Fatal("a fetch of an empty price list succeeded")
	}
	_, body := get(t, nil, c.base+"/prices")
	if !strings.Contains(body, "warning: every price catalog is stale") || strings.Contains(body, "No prices yet") || strings.Contains(body, ">L40S<") {
		t.Errorf("prices with every catalog stale:\n%s", body)
	}
}

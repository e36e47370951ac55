package console

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pg "github.com/trainmeter/trainmeter/collector/internal/page"
	"github.com/trainmeter/trainmeter/collector/internal/query"
	"github.com/trainmeter/trainmeter/collector/internal/query/compare"
	"github.com/trainmeter/trainmeter/collector/internal/report"
	"github.com/trainmeter/trainmeter/internal/money"
	"github.com/trainmeter/trainmeter/internal/protojsonout"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

type pages struct {
	c   *Console
	tpl *template.Template
}

// page is what every page template gets.
type page struct {
	Title  string
	Nav    string // the nav entry to highlight
	Script string // the page's own script under /static, if any
	Data   any
}

func (p *pages) render(w http.ResponseWriter, code int, name string, pg page) {
	var buf bytes.Buffer
	if err := p.tpl.ExecuteTemplate(&buf, name, pg); err != nil {
		p.c.log.Error("console template", "template", name, "err", err)
		http.Error(w, "console: could not render the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// httpError answers a script's request (data, a fragment) that failed.
func httpError(w http.ResponseWriter, err error) {
	code, msg := httpStatus(err)
	http.Error(w, msg, code)
}

func (p *pages) fail(w http.ResponseWriter, r *http.Request, nav string, err error) {
	code, msg := httpStatus(err)
	if code == http.StatusInternalServerError {
		p.c.log.Warn("console page", "path", r.URL.Path, "err", err)
	}
	p.render(w, code, "error.html", page{Title: http.StatusText(code), Nav: nav, Data: msg})
}

// --- login (only when the collector has query tokens) ---

type loginData struct {
	Next  string
	Error string
}

func (p *pages) login(w http.ResponseWriter, r *http.Request) {
	p.render(w, http.StatusOK, "login.html", page{Title: "Log in", Data: loginData{Next: safeNext(r.URL.Query().Get("next"))}})
}

// loginPost sets the login cookie for a read or admin token: only from the
// console's own pages (sameOrigin), with failed tries limited per client
// (loginLimiter), and back to a path on this console (safeNext).
func (p *pages) loginPost(w http.ResponseWriter, r *http.Request) {
	if err := sameOrigin(r); err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	tok := strings.TrimSpace(r.PostFormValue("token"))
	next := safeNext(r.PostFormValue("next"))
	a := p.c.cfg.Auth
	if a.QueryTokens() {
		client := clientOf(r)
		if d := p.c.logins.wait(client); d > 0 {
			s := retryAfter(d)
			w.Header().Set("Retry-After", strconv.Itoa(s))
			p.render(w, http.StatusTooManyRequests, "login.html", page{Title: "Log in", Data: loginData{Next: next,
				Error: fmt.Sprintf("Too many failed logins from this address: try again in %d s.", s)}})
			return
		}
		if err := a.Authorize(r.Context(), authMethod, tok); err != nil || tok == "" {
			p.c.logins.fail(client)
			p.c.log.Warn("console login refused", "client", client)
			p.render(w, http.StatusUnauthorized, "login.html", page{Title: "Log in", Data: loginData{Next: next, Error: "That token is not a read or admin token of this collector."}})
			return
		}
	}
	http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: tok, Path: "/", HttpOnly: true, Secure: p.c.cfg.TLS.Enabled(), SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (p *pages) logout(w http.ResponseWriter, r *http.Request) {
	if err := sameOrigin(r); err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: p.c.cfg.TLS.Enabled(), SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// --- Runs ---

// runsPageSize is the runs of one page of the runs table.
const runsPageSize = 100

type runsFilter struct {
	Model, Backend, Label, Status string
	Page                          int
}

func parseRunsFilter(r *http.Request) runsFilter {
	q := r.URL.Query()
	f := runsFilter{Model: q.Get("model"), Backend: q.Get("backend"), Label: q.Get("label"), Status: q.Get("status")}
	f.Page, _ = strconv.Atoi(q.Get("page"))
	f.Page = max(f.Page, 1)
	return f
}

// byMetadata reports whether f filters on what only a run's report has
// (model, backend, label), not on what the store selects runs by.
func (f runsFilter) byMetadata() bool { return f.Model != "" || f.Backend != "" || f.Label != "" }

func (f runsFilter) match(r *trainmeterv1.RunReport) bool {
	md := r.GetMetadata()
	if f.Model != "" && md.GetModel() != f.Model {
		return false
	}
	if f.Backend != "" && md.GetBackend() != f.Backend {
		return false
	}
	if (f.Status == "live" && r.GetEnded()) || (f.Status == "ended" && !r.GetEnded()) {
		return false
	}
	if f.Label != "" {
		k, v, hasValue := strings.Cut(f.Label, "=")
		got, ok := r.GetLabels()[k]
		if !ok || (hasValue && got != v) {
			return false
		}
	}
	return true
}

// Query is the filter as a query string (page left out); template.URL so
// that html/template keeps its & and = in a link (url.Values encoded it).
func (f runsFilter) Query() template.URL {
	v := url.Values{}
	for k, s := range map[string]string{"model": f.Model, "backend": f.Backend, "label": f.Label, "status": f.Status} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return template.URL(v.Encode()) // Encode sorts by key
}

type runRow struct {
	R      *trainmeterv1.RunReport
	Status string
	Spark  *sparkline
}

type runsData struct {
	Filter          runsFilter
	Rows            []runRow
	Total, Matching int
	Live            int
	Pages           int
	// First and Last are the positions (from 1) of the page's first and
	// last runs among the matching ones.
	First, Last int
	Prev, Next  int
}

// runsData lists the runs matching f, live runs first, each newest first
// (ties by run id), one page of them, with a power sparkline for each live
// run on the page. Without a model, backend or label filter it reads only
// the page's runs' reports: the store selects and orders the runs by
// their summaries (ListRuns live_only/ended_only, order by start, skip).
func (p *pages) runsData(ctx context.Context, f runsFilter) (*runsData, error) {
	d := &runsData{Filter: f}
	var page []*trainmeterv1.RunReport
	var err error
	if f.byMetadata() {
		page, err = p.runsMatching(ctx, d)
	} else {
		page, err = p.runsSelected(ctx, d)
	}
	if err != nil {
		return nil, err
	}
	if d.Filter.Page > 1 {
		d.Prev = d.Filter.Page - 1
	}
	if d.Filter.Page < d.Pages {
		d.Next = d.Filter.Page + 1
	}
	if len(page) > 0 {
		d.First = (d.Filter.Page-1)*runsPageSize + 1
		d.Last = d.First + len(page) - 1
	}
	for _, r := range page {
		row := runRow{R: r, Status: runStatus(r)}
		if !r.GetEnded() {
			row.Spark = p.sparkline(ctx, r)
		}
		d.Rows = append(d.Rows, row)
	}
	return d, nil
}

// pagesOf is the number of pages of n runs (at least one, empty).
func pagesOf(n int) int { return max(1, (n+runsPageSize-1)/runsPageSize) }

// runsSelected is the page d.Filter asks for (the last page when it asks
// for one past it) of the live runs then the ended ones, each newest
// first, reading only that page's reports; it sets d's counts and page.
func (p *pages) runsSelected(ctx context.Context, d *runsData) ([]*trainmeterv1.RunReport, error) {
	for {
		lo := (d.Filter.Page - 1) * runsPageSize
		wantLive, wantEnded := d.Filter.Status != "ended", d.Filter.Status != "live"
		n := 0
		if wantLive {
			n = runsPageSize
		}
		live, liveN, err := p.runsSlice(ctx, &trainmeterv1.ListRunsRequest{LiveOnly: true}, lo, n)
		if err != nil {
			return nil, err
		}
		n, skip := 0, 0
		if wantEnded {
			n = runsPageSize - len(live)
			if wantLive {
				skip = max(0, lo-liveN)
			} else {
				skip = lo
			}
		}
		ended, endedN, err := p.runsSlice(ctx, &trainmeterv1.ListRunsRequest{EndedOnly: true}, skip, n)
		if err != nil {
			return nil, err
		}
		d.Total, d.Live = liveN+endedN, liveN
		switch d.Filter.Status {
		case "live":
			d.Matching = liveN
		case "ended":
			d.Matching = endedN
		default:
			d.Matching = d.Total
		}
		d.Pages = pagesOf(d.Matching)
		if d.Filter.Page <= d.Pages {
			return append(live, ended...), nil
		}
		// A page past the end (runs deleted since the link was made, or
		// a typed page number): the last page instead.
		d.Filter.Page = d.Pages
	}
}

// runsSlice is n runs of the listing req (ordered by start, the newest
// first) from position skip on, and the listing's size; n = 0 reads only
// its size.
func (p *pages) runsSlice(ctx context.Context, req *trainmeterv1.ListRunsRequest, skip, n int) ([]*trainmeterv1.RunReport, int, error) {
	req.Order = trainmeterv1.RunOrder_RUN_ORDER_START_DESC
	req.Skip, req.PageSize = int32(skip), int32(n)
	if n == 0 {
		// A page past the end is empty and still has the size.
		req.Skip, req.PageSize = math.MaxInt32, 1
	}
	var out []*trainmeterv1.RunReport
	for {
		resp, err := p.c.cfg.Services.Query.ListRuns(ctx, req)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, resp.GetRuns()...)
		if len(out) >= n || resp.GetNextPageToken() == "" {
			return out[:min(len(out), n)], int(resp.GetTotalSize()), nil
		}
		// The collector ended the page early (its size budget).
		req.Skip, req.PageSize, req.PageToken = 0, int32(n-len(out)), resp.GetNextPageToken()
	}
}

// runsMatching is the page d.Filter asks for of the runs its model,
// backend or label filter matches, in runsSelected's order: those filters
// need every run's report.
func (p *pages) runsMatching(ctx context.Context, d *runsData) ([]*trainmeterv1.RunReport, error) {
	runs, err := p.allRuns(ctx)
	if err != nil {
		return nil, err
	}
	d.Total = len(runs)
	var match []*trainmeterv1.RunReport
	for _, r := range runs {
		if !r.GetEnded() {
			d.Live++
		}
		if d.Filter.match(r) {
			match = append(match, r)
		}
	}
	slices.SortStableFunc(match, func(a, b *trainmeterv1.RunReport) int {
		if a.GetEnded() != b.GetEnded() {
			if !a.GetEnded() {
				return -1
			}
			return 1
		}
		return cmp.Or(b.GetStart().AsTime().Compare(a.GetStart().AsTime()), cmp.Compare(a.GetRunId(), b.GetRunId()))
	})
	d.Matching = len(match)
	d.Pages = pagesOf(len(match))
	d.Filter.Page = min(d.Filter.Page, d.Pages)
	lo := (d.Filter.Page - 1) * runsPageSize
	return match[lo:min(len(match), lo+runsPageSize)], nil
}

// sparkWindow is how much of a live run's power its sparkline shows.
const sparkWindow = 10 * time.Minute

// sparkline is the run's total power over its last sparkWindow, or nil
// when it has no windows yet (or they cannot be read: the row still shows).
func (p *pages) sparkline(ctx context.Context, r *trainmeterv1.RunReport) *sparkline {
	from := p.c.cfg.Clock.Now().Add(-sparkWindow)
	if s := r.GetStart().AsTime(); s.After(from) {
		from = s
	}
	tl, err := p.c.cfg.Services.Query.Timeline(ctx, &trainmeterv1.TimelineRequest{
		RunId: r.GetRunId(), Series: []string{"power_w"}, MaxPoints: 60, From: timestamppb.New(from),
	})
	if err != nil || len(tl.GetSeries()) == 0 {
		return nil
	}
	return newSparkline(tl.GetSeries()[0])
}

func runStatus(r *trainmeterv1.RunReport) string {
	if !r.GetEnded() {
		return "live"
	}
	return report.EndStatus(r)
}

func (p *pages) runs(w http.ResponseWriter, r *http.Request) {
	d, err := p.runsData(r.Context(), parseRunsFilter(r))
	if err != nil {
		p.fail(w, r, "runs", err)
		return
	}
	p.render(w, http.StatusOK, "runs.html", page{Title: "Runs", Nav: "runs", Script: "runs.js", Data: d})
}

// runsRows is the table body alone, which the Runs page's script fetches
// every second: one rendering (and one escaping) for the first load and
// the live updates.
func (p *pages) runsRows(w http.ResponseWriter, r *http.Request) {
	d, err := p.runsData(r.Context(), parseRunsFilter(r))
	if err != nil {
		httpError(w, err)
		return
	}
	p.render(w, http.StatusOK, "runs_rows", page{Data: d})
}

// --- Run ---

type runData struct {
	R      *trainmeterv1.RunReport
	Status string
	Cards  []card
	// Fields are the report's fields as `trainmeter report --json` writes
	// them, in .proto order.
	Fields []protojsonout.Field
}

func (p *pages) runData(ctx context.Context, id string) (*runData, error) {
	resp, err := p.c.cfg.Services.Query.GetRun(ctx, &trainmeterv1.GetRunRequest{RunId: id})
	if err != nil {
		return nil, err
	}
	r := resp.GetRun()
	fields, err := protojsonout.Fields(r)
	if err != nil {
		return nil, err
	}
	return &runData{R: r, Status: runStatus(r), Cards: runCards(r), Fields: fields}, nil
}

// card is one figure of the Run page: Value is the report's exact number
// (data-value, "" when unknown), Text the figure as people read it, and
// Reason why a figure is unknown (it then reads "—", never 0).
type card struct {
	Name, Scope, Field string
	Value, Text        string
	Reason             string
}

// runCards are the Run page's figures. Energy, power, VRAM, wall time and
// tokens are 0 in the report when nothing was measured: a real run never
// has 0 of them, so the card says unknown and why.
func runCards(r *trainmeterv1.RunReport) []card {
	yet := ""
	if !r.GetEnded() {
		yet = " yet"
	}
	rates := "not measured" + yet
	if u := r.GetRatesUnavailable(); u != "" {
		rates = u
	}
	opt := func(name, scope, field string, v *float64, format func(float64) string, why string) card {
		if v == nil {
			return card{Name: name, Scope: scope, Field: field, Text: "—", Reason: why}
		}
		return card{Name: name, Scope: scope, Field: field, Value: val(*v), Text: format(*v)}
	}
	measured := func(name, scope, field string, v float64, why string) card {
		if v == 0 {
			return card{Name: name, Scope: scope, Field: field, Text: "—", Reason: why}
		}
		return card{Name: name, Scope: scope, Field: field, Value: val(v), Text: num(v)}
	}
	noPrice := "no price for " + cmp.Or(r.GetGpuName(), "its GPU") + " (Prices page)"
	tokens := card{Name: "tokens", Scope: "all ranks", Field: "tokens_processed", Text: "—", Reason: "the trainer reported none" + yet}
	if n := r.GetTokensProcessed(); n > 0 {
		tokens.Value, tokens.Text, tokens.Reason = strconv.FormatUint(n, 10), strconv.FormatUint(n, 10), ""
	}
	return []card{
		opt("J/token", "after warmup, all GPUs", "j_per_token", r.JPerToken, num, rates),
		opt("tok/s", "after warmup, all ranks", "tok_per_s", r.TokPerS, num, rates),
		measured("energy", "whole run, J", "energy_total_j", r.GetEnergyTotalJ(), "no energy measured"+yet),
		measured("avg power", "whole run, all GPUs, W", "avg_power_total_w", r.GetAvgPowerTotalW(), "no energy measured"+yet),
		measured("VRAM peak", "MiB, one GPU", "vram_peak_mb", r.GetVramPeakMb(), "not reported"+yet),
		opt("cost so far", "whole run, USD", "total_cost_usd", r.TotalCostUsd, money.Amount, noPrice),
		opt("projected cost", "at completion, USD", "projected_cost_usd", r.ProjectedCostUsd, money.Amount, noPrice),
		measured("wall time", "s", "wall_s", r.GetWallS(), "no window"+yet),
		tokens,
	}
}

func (p *pages) run(w http.ResponseWriter, r *http.Request) {
	d, err := p.runData(r.Context(), r.PathValue("id"))
	if err != nil {
		p.fail(w, r, "runs", err)
		return
	}
	p.render(w, http.StatusOK, "run.html", page{Title: "Run " + d.R.GetRunId(), Nav: "runs", Script: "run.js", Data: d})
}

// runSummary is the figures and report fields alone, which the Run page's
// script fetches every second while the run is live.
func (p *pages) runSummary(w http.ResponseWriter, r *http.Request) {
	d, err := p.runData(r.Context(), r.PathValue("id"))
	if err != nil {
		httpError(w, err)
		return
	}
	p.render(w, http.StatusOK, "run_summary", page{Data: d})
}

// timelineJSON is what the Run page's charts draw: the Timeline RPC's
// answer with times in Unix milliseconds as JSON numbers.
type timelineJSON struct {
	RunID       string         `json:"run_id"`
	StartMs     *int64         `json:"start_ms"`
	EndMs       *int64         `json:"end_ms"`
	WarmupEndMs *int64         `json:"warmup_end_ms"`
	Ended       bool           `json:"ended"`
	Series      []seriesJSON   `json:"series"`
	Events      []timelineItem `json:"events"`
}

type seriesJSON struct {
	Name string  `json:"name"`
	Unit string  `json:"unit"`
	T    []int64 `json:"t_unix_ms"`
	// Values has a null where windows are missing: a chart breaks its
	// line there (chartPoints).
	Values       []*float64 `json:"values"`
	SourcePoints uint32     `json:"source_points"`
}

type timelineItem struct {
	TMs  int64  `json:"t_unix_ms"`
	Kind string `json:"kind"`
	Node string `json:"node"`
	Text string `json:"text"`
}

func msPtr(ts *timestamppb.Timestamp) *int64 {
	if ts == nil {
		return nil
	}
	v := ts.AsTime().UnixMilli()
	return &v
}

func (p *pages) timeline(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	req := &trainmeterv1.TimelineRequest{RunId: id}
	if mp := r.URL.Query().Get("max_points"); mp != "" {
		n, err := strconv.ParseUint(mp, 10, 32)
		if err != nil {
			http.Error(w, "max_points: want a whole number", http.StatusBadRequest)
			return
		}
		req.MaxPoints = uint32(n)
	}
	tl, err := p.c.cfg.Services.Query.Timeline(r.Context(), req)
	if err != nil {
		httpError(w, err)
		return
	}
	run, err := p.c.cfg.Services.Query.GetRun(r.Context(), &trainmeterv1.GetRunRequest{RunId: id})
	if err != nil {
		httpError(w, err)
		return
	}
	out := timelineJSON{RunID: tl.GetRunId(), StartMs: msPtr(tl.GetStart()), EndMs: msPtr(tl.GetEnd()), WarmupEndMs: msPtr(tl.GetWarmupEnd()),
		Ended: run.GetRun().GetEnded(), Series: []seriesJSON{}, Events: []timelineItem{}}
	maxPts := cmp.Or(int(req.GetMaxPoints()), query.DefaultTimelinePoints)
	for _, s := range tl.GetSeries() {
		sj := seriesJSON{Name: s.GetName(), Unit: s.GetUnit(), SourcePoints: s.GetSourcePoints()}
		if out.StartMs != nil {
			sj.T, sj.Values = chartPoints(s, *out.StartMs, *out.EndMs, maxPts)
		}
		out.Series = append(out.Series, sj)
	}
	for _, e := range tl.GetEvents() {
		out.Events = append(out.Events, timelineItem{TMs: e.GetTime().AsTime().UnixMilli(), Kind: e.GetKind(), Node: e.GetNode(), Text: e.GetText()})
	}
	writeJSON(w, out)
}

// chartPoints is a series as a chart should draw it, within the run's
// [start, end] (Unix ms):
//
//   - A point stands for the second from its time on (the Timeline RPC
//     keys each point by its whole second). The run's first second may
//     start mid-second: its point is drawn at the run's start, not before.
//   - A GPU's point (power_w:NODE/gpuN) is its mean over the whole
//     one-second batch window; a window the run covers only in part (its
//     first and last) mixes in the GPU before or after the run, so it is
//     left out rather than drawn lower than the run's own power.
//   - Where windows are missing, a null: the chart breaks its line instead
//     of drawing one across time nothing was measured. Points come a second
//     apart; downsampled (min and max of each bucket of k points), two
//     points of one stretch lie at most 2k seconds apart.
func chartPoints(s *trainmeterv1.TimelineSeries, start, end int64, maxPts int) ([]int64, []*float64) {
	const second = 1000
	ts, vs := s.GetTUnixMs(), finite(s.GetValues())
	gap := int64(second)
	if n := int(s.GetSourcePoints()); len(ts) < n && maxPts >= 2 {
		k := (n + maxPts/2 - 1) / (maxPts / 2)
		gap = int64(2*k) * second
	}
	gpu := strings.HasPrefix(s.GetName(), "power_w:") && strings.Contains(s.GetName(), "/gpu")
	outT, outV := make([]int64, 0, len(ts)), make([]*float64, 0, len(ts))
	var prev int64
	for i, t := range ts {
		if gpu && (t < start || t+second > end) {
			continue
		}
		if len(outT) > 0 && t-prev > gap {
			outT, outV = append(outT, prev+second), append(outV, nil)
		}
		prev = t
		outT, outV = append(outT, max(t, start)), append(outV, &vs[i])
	}
	return outT, outV
}

// writeJSON answers a script: the JSON encoder escapes <, > and & in
// strings, so even a trainer's "</script>" stays data.
func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// --- Compare ---

type compareData struct {
	Form    compareForm
	Result  *trainmeterv1.CompareResponse
	Error   string
	ByKeys  []string
	Figures []compareFigure
	Scatter *scatter
}

type compareForm struct {
	Runs, Model, By, Baseline string
}

// compareFigure is one figure's bars: each group's mean and interval.
type compareFigure struct {
	Name, Unit string
	Bars       []bar
	Max        float64
}

type bar struct {
	Key   string
	Index int // the group's, for its colour
	Stat  *trainmeterv1.CompareStat
}

func (p *pages) compare(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := &compareData{Form: compareForm{Runs: q.Get("runs"), Model: q.Get("model"), By: q.Get("by"), Baseline: q.Get("baseline")}, ByKeys: compare.Keys}
	code := http.StatusOK
	// Runs typed in the form are separated by spaces or commas; a run id
	// with those in it comes as its own run= parameter (a link can carry any id).
	ids := append(strings.Fields(strings.ReplaceAll(d.Form.Runs, ",", " ")), q["run"]...)
	if len(ids) > 0 || d.Form.Model != "" {
		req := &trainmeterv1.CompareRequest{RunIds: ids, Model: d.Form.Model, By: d.Form.By, Baseline: d.Form.Baseline}
		res, err := p.c.cfg.Services.Query.Compare(r.Context(), req)
		if err != nil {
			code, d.Error = httpStatus(err)
		} else {
			d.Result = res
			d.Figures = compareFigures(res)
			d.Scatter = newScatter(res)
		}
	}
	p.render(w, code, "compare.html", page{Title: "Compare", Nav: "compare", Data: d})
}

func compareFigures(res *trainmeterv1.CompareResponse) []compareFigure {
	defs := []struct {
		name, unit string
		get        func(*trainmeterv1.CompareGroup) *trainmeterv1.CompareStat
	}{
		{"J/token", "J, after warmup, all GPUs", (*trainmeterv1.CompareGroup).GetJPerToken},
		{"tok/s", "after warmup, all ranks", (*trainmeterv1.CompareGroup).GetTokPerS},
		{"E10k_J", "J per 10,000 tokens, after warmup", (*trainmeterv1.CompareGroup).GetE10KJ},
		{"VRAM peak", "MiB per GPU, whole run", (*trainmeterv1.CompareGroup).GetVramPeakMb},
		{"$/Mtok", "USD per million tokens, whole run", (*trainmeterv1.CompareGroup).GetUsdPerMtok},
	}
	var out []compareFigure
	for _, def := range defs {
		f := compareFigure{Name: def.name, Unit: def.unit}
		for i, g := range res.GetGroups() {
			s := def.get(g)
			if s.GetN() == 0 {
				continue
			}
			f.Bars = append(f.Bars, bar{Key: g.GetKey(), Index: i, Stat: s})
			f.Max = max(f.Max, s.GetMean(), s.GetCiHigh())
		}
		if len(f.Bars) > 0 {
			out = append(out, f)
		}
	}
	return out
}

// --- Budgets, Prices, Recommendations, Nodes ---

type budgetsData struct {
	Budgets []*trainmeterv1.BudgetStatus
	Alerts  []*trainmeterv1.Alert
}

func (p *pages) budgets(w http.ResponseWriter, r *http.Request) {
	b, err := p.c.cfg.Services.Budgets.ListBudgets(r.Context(), &trainmeterv1.ListBudgetsRequest{})
	if err != nil {
		p.fail(w, r, "budgets", err)
		return
	}
	alerts, err := pg.All(func(tok string) ([]*trainmeterv1.Alert, string, error) {
		a, err := p.c.cfg.Services.Budgets.ListAlerts(r.Context(), &trainmeterv1.ListAlertsRequest{PageToken: tok})
		return a.GetAlerts(), a.GetNextPageToken(), err
	})
	if err != nil {
		p.fail(w, r, "budgets", err)
		return
	}
	// Newest first, and a page's worth: the CLI's `alerts` has them all.
	slices.SortStableFunc(alerts, func(x, y *trainmeterv1.Alert) int { return y.GetTime().AsTime().Compare(x.GetTime().AsTime()) })
	alerts = alerts[:min(len(alerts), 200)]
	p.render(w, http.StatusOK, "budgets.html", page{Title: "Budgets", Nav: "budgets", Data: budgetsData{Budgets: b.GetBudgets(), Alerts: alerts}})
}

func (p *pages) prices(w http.ResponseWriter, r *http.Request) {
	req := &trainmeterv1.ListPricesRequest{Gpu: r.URL.Query().Get("gpu")}
	resp, err := p.c.cfg.Services.Prices.ListPrices(r.Context(), req)
	if err != nil {
		p.fail(w, r, "prices", err)
		return
	}
	p.render(w, http.StatusOK, "prices.html", page{Title: "Prices", Nav: "prices", Data: struct {
		GPU  string
		Resp *trainmeterv1.ListPricesResponse
	}{req.Gpu, resp}})
}

func (p *pages) recommendations(w http.ResponseWriter, r *http.Request) {
	var minConf float64
	if s := r.URL.Query().Get("min_confidence"); s != "" {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v < 0 || v > 1 {
			p.fail(w, r, "recommendations", fmt.Errorf("%w: min_confidence: want a number from 0 to 1", errBadRequest))
			return
		}
		minConf = v
	}
	resp, err := p.c.cfg.Services.Recommend.Recommend(r.Context(), &trainmeterv1.RecommendRequest{MinConfidence: minConf})
	if err != nil {
		p.fail(w, r, "recommendations", err)
		return
	}
	p.render(w, http.StatusOK, "recommendations.html", page{Title: "Recommendations", Nav: "recommendations", Data: struct {
		MinConfidence float64
		Resp          *trainmeterv1.RecommendResponse
	}{minConf, resp}})
}

// idlePeriod is the period of the Nodes page's idle share.
const idlePeriod = 24 * time.Hour

type nodeRow struct {
	N    *trainmeterv1.NodeStatus
	U    *trainmeterv1.NodeUsage
	Idle float64
	Has  bool
}

func (p *pages) nodes(w http.ResponseWriter, r *http.Request) {
	nodes, err := pg.All(func(tok string) ([]*trainmeterv1.NodeStatus, string, error) {
		resp, err := p.c.cfg.Services.Query.ListNodes(r.Context(), &trainmeterv1.ListNodesRequest{PageToken: tok})
		return resp.GetNodes(), resp.GetNextPageToken(), err
	})
	if err != nil {
		p.fail(w, r, "nodes", err)
		return
	}
	now := p.c.cfg.Clock.Now()
	usage := map[string]*trainmeterv1.NodeUsage{}
	// Idle share where the usage can be computed; the nodes show without it.
	if u, err := p.c.cfg.Services.Query.Usage(r.Context(), &trainmeterv1.UsageRequest{Since: timestamppb.New(now.Add(-idlePeriod)), Until: timestamppb.New(now)}); err == nil {
		for _, n := range u.GetNodes() {
			usage[n.GetNode()] = n
		}
	}
	var rows []nodeRow
	for _, n := range nodes {
		row := nodeRow{N: n, U: usage[n.GetNode()]}
		if row.U.GetGpuSeconds() > 0 {
			row.Idle, row.Has = row.U.GetIdleGpuSeconds()/row.U.GetGpuSeconds(), true
		}
		rows = append(rows, row)
	}
	p.render(w, http.StatusOK, "nodes.html", page{Title: "Nodes", Nav: "nodes", Data: struct {
		Rows []nodeRow
		Now  time.Time
	}{rows, now}})
}

// allRuns is every run, read from ListRuns a page at a time, in run id
// order (the pages sort them as they show them).
func (p *pages) allRuns(ctx context.Context) ([]*trainmeterv1.RunReport, error) {
	return pg.All(func(tok string) ([]*trainmeterv1.RunReport, string, error) {
		resp, err := p.c.cfg.Services.Query.ListRuns(ctx, &trainmeterv1.ListRunsRequest{PageToken: tok})
		return resp.GetRuns(), resp.GetNextPageToken(), err
	})
}

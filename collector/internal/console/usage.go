package console

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/report"
	"github.com/trainmeter/trainmeter/collector/internal/when"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// The Usage page is `trainmeter usage` in a browser: the Usage RPC's rows
// and node totals over a period, its CSV, and a bar per day stacked by
// group (the same RPC over each day of the period).

// maxChartDays bounds the per-day chart: bars of a few pixels beyond.
const maxChartDays = 62

// chartGroups is how many groups the chart stacks by name; the rest is
// "other" (the table has them all).
const chartGroups = 7

type usageForm struct {
	By           []string
	Since, Until string // as typed (the CLI's forms)
	Chart        string // usd, gpu_hours, kwh
}

// Query is the form as a query string (template.URL keeps its & and =).
func (f usageForm) values() url.Values {
	v := url.Values{"by": f.By}
	if f.Since != "" {
		v.Set("since", f.Since)
	}
	if f.Until != "" {
		v.Set("until", f.Until)
	}
	if f.Chart != "" && f.Chart != "usd" {
		v.Set("chart", f.Chart)
	}
	return v
}

type usageData struct {
	Form         usageForm
	Splits       []string
	Since, Until time.Time
	Resp         *trainmeterv1.UsageResponse
	Host, Lost   bool
	CSV          string
	Chart        *dayChart
	ByText       string
}

// parseWhen reads since/until as `trainmeter usage` does (package when).
func parseWhen(name, s string, now time.Time) (time.Time, error) {
	t, err := when.Parse(s, now)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %s %q: %w", errBadRequest, name, s, err)
	}
	return t, nil
}

// parseUsage reads the page's query: by (repeated or comma-separated;
// default node), since (default: the first of this month, UTC), until
// (default: now) and the chart's figure.
func (p *pages) parseUsage(r *http.Request) (usageForm, time.Time, time.Time, error) {
	q := r.URL.Query()
	f := usageForm{Since: q.Get("since"), Until: q.Get("until"), Chart: q.Get("chart")}
	for _, b := range q["by"] {
		for _, k := range strings.Split(b, ",") {
			if k = strings.TrimSpace(k); k != "" {
				f.By = append(f.By, k)
			}
		}
	}
	if len(f.By) == 0 {
		f.By = []string{"node"}
	}
	for _, b := range f.By {
		if err := checkUsageBy(b); err != nil {
			return f, time.Time{}, time.Time{}, err
		}
	}
	switch f.Chart {
	case "", "usd", "gpu_hours", "kwh":
	default:
		return f, time.Time{}, time.Time{}, fmt.Errorf("%w: chart %q: use usd, gpu_hours or kwh", errBadRequest, f.Chart)
	}
	now := p.c.cfg.Clock.Now()
	since, err := parseWhen("since", f.Since, now)
	if err != nil {
		return f, since, time.Time{}, err
	}
	until, err := parseWhen("until", f.Until, now)
	if err != nil {
		return f, since, until, err
	}
	if f.Since == "" {
		since = monthStart(now)
	}
	if f.Until == "" {
		until = now
	}
	if !since.Before(until) {
		return f, since, until, fmt.Errorf("%w: since (%s) must be before until (%s)", errBadRequest, since.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339))
	}
	return f, since, until, nil
}

func (p *pages) usageCall(ctx context.Context, by []string, since, until time.Time) (*trainmeterv1.UsageResponse, error) {
	return p.c.cfg.Services.Query.Usage(ctx, &trainmeterv1.UsageRequest{Since: timestamppb.New(since), Until: timestamppb.New(until), By: by})
}

func (p *pages) usage(w http.ResponseWriter, r *http.Request) {
	f, since, until, err := p.parseUsage(r)
	if err != nil {
		p.fail(w, r, "usage", err)
		return
	}
	ctx := r.Context()
	// With the per-day chart, one call: per_day leaves the period's rows
	// and node totals as they are and adds the days.
	req := &trainmeterv1.UsageRequest{Since: timestamppb.New(since), Until: timestamppb.New(until), By: f.By, PerDay: chartDays(since, until) <= maxChartDays}
	resp, err := p.c.cfg.Services.Query.Usage(ctx, req)
	if err != nil {
		p.fail(w, r, "usage", err)
		return
	}
	// The splits offered are the label keys of the period's runs (the
	// response has them): reading every run for them cost more than the
	// period's usage.
	d := &usageData{Form: f, Splits: append([]string{"gpu"}, splitsOfKeys(resp.GetLabelKeys())...), Since: since, Until: until, Resp: resp, ByText: strings.Join(f.By, ",")}
	v := f.values()
	// The CSV link names the period as the page resolved it, so that the
	// file holds what the page shows even a minute later.
	v.Set("since", since.UTC().Format(time.RFC3339Nano))
	v.Set("until", until.UTC().Format(time.RFC3339Nano))
	v.Del("chart")
	d.CSV = "/usage.csv?" + v.Encode()
	for _, n := range resp.GetNodes() {
		d.Host = d.Host || n.GetHostEnergyJ() > 0
		d.Lost = d.Lost || n.GetLostBatches() > 0
	}
	d.Chart = dayChartOf(f, resp, since, until)
	p.render(w, http.StatusOK, "usage.html", page{Title: "Usage", Nav: "usage", Data: d})
}

// usageCSV is the page's rows as `trainmeter usage --csv` writes them.
func (p *pages) usageCSV(w http.ResponseWriter, r *http.Request) {
	f, since, until, err := p.parseUsage(r)
	if err != nil {
		httpError(w, err)
		return
	}
	resp, err := p.usageCall(r.Context(), f.By, since, until)
	if err != nil {
		httpError(w, err)
		return
	}
	var buf bytes.Buffer
	if err := report.WriteUsageCSV(&buf, resp); err != nil {
		httpError(w, err)
		return
	}
	w.Header().Set("Content-Type", "text/csv; charset=utf-8")
	w.Header().Set("Content-Disposition", `attachment; filename="usage.csv"`)
	_, _ = w.Write(buf.Bytes())
}

// dayChart is a stacked bar per day, drawn on the server as SVG (no
// script, so the strict CSP and an offline browser show it as is).
type dayChart struct {
	Metric, Unit string
	Note         string // why the chart is not drawn, or what it falls back to
	Days         []dayBar
	Legend       []usageLegendItem
	Ticks        []tick
	W, H         float64
	Points       int // segments with a value: 0 means an empty chart
}

type dayBar struct {
	Label    string // MM-DD, "" where labels are thinned
	X, W     float64
	Segs     []seg
	Total    float64
	Link     string
	Title    string
	LabelX   float64
	HasLabel bool
}

type seg struct {
	Class      string
	Y, H       float64
	Key, Value string
}

// usageLegendItem is a stacked series: its CSS class and group key.
type usageLegendItem struct{ Class, Key string }

// Chart geometry (SVG user units; the SVG scales to its box).
const (
	chartW, chartH           = 1000.0, 240.0
	chartLeft, chartBottom   = 64.0, 22.0
	chartTop, chartRightEdge = 8.0, 8.0
)

// dayChartOf draws the UTC days of a per_day Usage answer (each day's
// rows as a request for that day alone would answer) and stacks each day's rows: the period's first chartGroups groups by name in
// the table's order, the rest as "other", idle rows as "idle".
func dayChartOf(f usageForm, resp *trainmeterv1.UsageResponse, since, until time.Time) *dayChart {
	c := &dayChart{Metric: cmp.Or(f.Chart, "usd"), W: chartW, H: chartH}
	var priced = true
	for _, r := range resp.GetRows() {
		priced = priced && r.CostUsd != nil
	}
	if c.Metric == "usd" && !priced {
		c.Metric, c.Note = "gpu_hours", "GPU-hours: some rows have no price, so $ per day would be short."
	}
	c.Unit = map[string]string{"usd": "USD", "gpu_hours": "GPU-hours", "kwh": "kWh (GPUs)"}[c.Metric]
	value := func(r *trainmeterv1.UsageRow) float64 {
		switch c.Metric {
		case "usd":
			return r.GetCostUsd()
		case "kwh":
			return r.GetEnergyJ() / 3.6e6
		}
		return r.GetGpuSeconds() / 3600
	}
	first := since.UTC().Truncate(24 * time.Hour)
	days := chartDays(since, until)
	if days > maxChartDays {
		c.Note = fmt.Sprintf("No chart per day beyond %d days: narrow since and until.", maxChartDays)
		return c
	}
	// The groups by name, in the table's order (by cost where priced).
	rows := slices.Clone(resp.GetRows())
	slices.SortStableFunc(rows, func(a, b *trainmeterv1.UsageRow) int {
		if a.GetIdle() != b.GetIdle() {
			if a.GetIdle() {
				return 1
			}
			return -1
		}
		return cmp.Compare(value(b), value(a))
	})
	class := map[string]string{}
	for _, r := range rows {
		k := segKey(f.By, r)
		if _, ok := class[k]; ok || k == "idle" {
			continue
		}
		if len(class) < chartGroups {
			class[k] = "s" + strconv.Itoa(len(class))
			c.Legend = append(c.Legend, usageLegendItem{class[k], k})
		}
	}
	byDay := map[int64]*trainmeterv1.UsageDay{}
	for _, d := range resp.GetDays() {
		byDay[d.GetSince().AsTime().UTC().Truncate(24*time.Hour).Unix()] = d
	}
	hasOther, hasIdle := false, false
	plotW := chartW - chartLeft - chartRightEdge
	plotH := chartH - chartTop - chartBottom
	step := plotW / float64(days)
	every := max(1, int(math.Ceil(float64(days)/16)))
	var top float64
	for i := range days {
		d0 := first.Add(time.Duration(i) * 24 * time.Hour)
		s, u := maxTime(d0, since), minTime(d0.Add(24*time.Hour), until)
		day := byDay[d0.Unix()]
		sums := map[string]float64{}
		for _, r := range day.GetRows() {
			k := segKey(f.By, r)
			if _, ok := class[k]; !ok && k != "idle" {
				k, hasOther = "other", true
			}
			hasIdle = hasIdle || k == "idle"
			sums[k] += value(r)
		}
		b := dayBar{X: chartLeft + float64(i)*step + step*0.1, W: step * 0.8, LabelX: chartLeft + float64(i)*step + step/2}
		if i%every == 0 {
			b.Label, b.HasLabel = d0.Format("01-02"), true
		}
		v := f.values()
		v.Set("since", s.Format(time.RFC3339))
		v.Set("until", u.Format(time.RFC3339))
		b.Link = "/usage?" + v.Encode()
		for _, l := range append(slices.Clone(c.Legend), usageLegendItem{"s-other", "other"}, usageLegendItem{"s-idle", "idle"}) {
			x := sums[l.Key]
			if x <= 0 {
				continue
			}
			b.Segs = append(b.Segs, seg{Class: l.Class, Key: l.Key, Value: num(x)})
			b.Total += x
			// Numbers carried for the height below, once the scale is known.
			b.Segs[len(b.Segs)-1].H = x
		}
		b.Title = d0.Format("2006-01-02") + ": " + num(b.Total) + " " + c.Unit
		top = max(top, b.Total)
		c.Days = append(c.Days, b)
	}
	if hasOther {
		c.Legend = append(c.Legend, usageLegendItem{"s-other", "other"})
	}
	if hasIdle {
		c.Legend = append(c.Legend, usageLegendItem{"s-idle", "idle"})
	}
	scale := niceCeil(top)
	for i := range c.Days {
		y := chartTop + plotH
		for j := range c.Days[i].Segs {
			sg := &c.Days[i].Segs[j]
			h := 0.0
			if scale > 0 {
				h = plotH * sg.H / scale
			}
			y -= h
			sg.Y, sg.H = y, h
			c.Points++
		}
	}
	for _, fr := range []float64{0, 0.5, 1} {
		c.Ticks = append(c.Ticks, tick{Pos: chartTop + plotH*(1-fr), Label: num(scale * fr)})
	}
	return c
}

// chartDays is how many UTC days [since, until) touches.
func chartDays(since, until time.Time) int {
	return int(math.Ceil(until.Sub(since.UTC().Truncate(24*time.Hour)).Hours() / 24))
}

// segKey is the chart's name for a row: its keys, or "idle".
func segKey(by []string, r *trainmeterv1.UsageRow) string {
	if r.GetIdle() {
		return "idle"
	}
	return usageKey(strings.Join(by, ","), r)
}

// niceCeil is the smallest of 1, 2, 2.5 or 5 × 10^k at or above v.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 0
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

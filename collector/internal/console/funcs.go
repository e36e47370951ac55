package console

import (
	"fmt"
	"html/template"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/numfmt"
	"github.com/trainmeter/trainmeter/collector/internal/report"
	"github.com/trainmeter/trainmeter/internal/buildinfo"
	"github.com/trainmeter/trainmeter/internal/money"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// funcs are the templates' helpers. Numbers are shown rounded for reading
// (num) and carried at full precision in a data-value attribute (val), the
// exact float64 `trainmeter report --json` prints.
var funcs = template.FuncMap{
	"num":       num,
	"val":       val,
	"optnum":    optNum,
	"optval":    optVal,
	"pct":       func(v float64) string { return num(v*100) + " %" },
	"signed":    func(v float64) string { return fmt.Sprintf("%+.1f%%", v) },
	"usd":       money.Amount, // an amount, rounded as `trainmeter report` rounds it
	"rate":      money.Rate,   // a unit price ($ per GPU-hour)
	"when":      report.Stamp,
	"ago":       ago,
	"mib":       func(mib uint64) string { return strconv.FormatUint(mib, 10) },
	"version":   func() string { return version() },
	"pvalue":    pvalue,
	"barw":      barWidth,
	"px":        px,
	"add1":      func(a, b float64) float64 { return a + b },
	"neg":       func(a float64) float64 { return -a },
	"add":       func(a, b int) int { return a + b },
	"join":      strings.Join,
	"runList":   runList,
	"lower":     strings.ToLower,
	"labels":    labels,
	"halfWidth": func(s *trainmeterv1.CompareStat) string { return numfmt.Sig((s.GetCiHigh()-s.GetCiLow())/2, 2) }, // as `compare` writes it
	"hundred":   func(v float64) float64 { return v * 100 },
	"trends":    trends,
	"seg":       url.PathEscape,
	"navItems":  func() []navItem { return nav },
	"statuses":  func() []string { return []string{"", "live", "ended"} },
}

// version is the binary's version (a test sets another). Templates use it
// as it is: html/template encodes it where it goes into a URL, so it must
// not be encoded here too.
var version = buildinfo.Version

// maxRunList is how many run ids runList names.
const maxRunList = 20

// runList names a group's runs for a tooltip: the first maxRunList, then
// how many more (a model's group can hold thousands).
func runList(ids []string) string {
	if len(ids) <= maxRunList {
		return strings.Join(ids, " ")
	}
	return strings.Join(ids[:maxRunList], " ") + fmt.Sprintf(" … and %d more", len(ids)-maxRunList)
}

// num writes a figure as the CLI's tables do (numfmt.Num).
func num(v float64) string { return numfmt.Num(v) }

// val is v at full precision, as encoding/json writes a float64.
func val(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// optNum is num of an optional figure; "-" when it is unknown.
func optNum(v *float64) string {
	if v == nil {
		return "-"
	}
	return num(*v)
}

// optVal is val of an optional figure; "" when it is unknown.
func optVal(v *float64) string {
	if v == nil {
		return ""
	}
	return val(*v)
}

func pvalue(d *trainmeterv1.CompareDiff) string {
	if d.PValue == nil {
		return "-"
	}
	return strconv.FormatFloat(d.GetPValue(), 'g', 3, 64)
}

func ago(ts *timestamppb.Timestamp, now time.Time) string {
	if ts == nil {
		return "never"
	}
	return max(0, now.Sub(ts.AsTime()).Round(time.Second)).String() + " ago"
}

// barWidth is a bar's length in percent of the figure's largest value.
func barWidth(v, max float64) string {
	if max <= 0 || v <= 0 || math.IsNaN(v) {
		return "0"
	}
	return strconv.FormatFloat(math.Min(100, 100*v/max), 'f', 2, 64)
}

// labels is a run's labels as "k=v" words, sorted.
func labels(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// finite replaces NaN and ±Inf, which JSON cannot carry, with 0; the
// Timeline RPC does not produce them, this only keeps an answer valid.
func finite(vs []float64) []float64 {
	for i, v := range vs {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			vs[i] = 0
		}
	}
	return vs
}

// sparkline is an SVG polyline of a series, drawn on the server: no script
// and no chart per row for a table of live runs.
type sparkline struct {
	Points     string
	Last, Peak float64
}

const sparkW, sparkH = 120.0, 24.0

func newSparkline(s *trainmeterv1.TimelineSeries) *sparkline {
	ts, vs := s.GetTUnixMs(), s.GetValues()
	if len(vs) == 0 {
		return nil
	}
	t0, t1 := ts[0], ts[len(ts)-1]
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range vs {
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	lo = math.Min(lo, 0)
	var b strings.Builder
	for i, v := range vs {
		x := sparkW
		if t1 > t0 {
			x = sparkW * float64(ts[i]-t0) / float64(t1-t0)
		}
		y := sparkH / 2
		if hi > lo {
			y = sparkH - 1 - (sparkH-2)*(v-lo)/(hi-lo)
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.1f,%.1f", x, y)
	}
	if len(vs) == 1 {
		fmt.Fprintf(&b, " 0,%.1f", sparkH/2)
	}
	return &sparkline{Points: b.String(), Last: vs[len(vs)-1], Peak: hi}
}

type navItem struct{ Path, Name string }

var nav = []navItem{{"runs", "Runs"}, {"usage", "Usage"}, {"compare", "Compare"}, {"budgets", "Budgets"}, {"prices", "Prices"}, {"recommendations", "Recommendations"}, {"nodes", "Nodes"}}

// trendWindows are the Prices page's trend columns.
var trendWindows = []string{"24h", "7d", "30d"}

// trends is a GPU's price trend for each of trendWindows (zero when the
// collector has none for a window).
func trends(g *trainmeterv1.GpuPrice) []*trainmeterv1.PriceTrend {
	out := make([]*trainmeterv1.PriceTrend, len(trendWindows))
	for i, w := range trendWindows {
		out[i] = &trainmeterv1.PriceTrend{Window: w}
		for _, t := range g.GetTrends() {
			if t.GetWindow() == w {
				out[i] = t
			}
		}
	}
	return out
}

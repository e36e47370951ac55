package console

import (
	"math"
	"strconv"

	"github.com/trainmeter/trainmeter/collector/internal/numfmt"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// The Compare page's charts are SVG drawn here, on the server: no script,
// text that stays text (labels, values, titles for a screen reader), and
// presentation attributes (fill, x, y) rather than inline styles, which the
// CSP forbids.

// groupColors are the groups' colours, in the order of the groups
// (Okabe-Ito: told apart with the common colour blindnesses, each readable
// on white).
var groupColors = []string{"#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#999999"}

func groupColor(i int) string { return groupColors[i%len(groupColors)] }

// Bar chart geometry, in SVG user units (the chart scales to its box,
// keeping its aspect, so text is never stretched).
const (
	barChartW  = 420.0
	barLabelW  = 120.0 // the group's name, right-aligned before its bar
	barValueW  = 110.0 // the mean and interval, after the bars
	barRowH    = 24.0
	barH       = 14.0
	barKeyRune = 18 // a longer key is cut, whole in its <title>
)

// barRow is one group's bar: its length, its 95 % CI whisker and its
// labels, in SVG units.
type barRow struct {
	Key, Label, Color string
	Y, Mid, W         float64
	HasCI             bool
	X1, X2            float64 // the whisker's ends
	Value, CI         string
}

func (f compareFigure) Width() float64  { return barChartW }
func (f compareFigure) Height() float64 { return float64(len(f.Bars))*barRowH + 4 }
func (f compareFigure) X0() float64     { return barLabelW }

// Rows lays out f's bars: lengths relative to the largest mean or CI end.
func (f compareFigure) Rows() []barRow {
	plot := barChartW - barLabelW - barValueW
	x := func(v float64) float64 {
		if f.Max <= 0 || v <= 0 || math.IsNaN(v) {
			return barLabelW
		}
		return barLabelW + plot*math.Min(1, v/f.Max)
	}
	out := make([]barRow, len(f.Bars))
	for i, b := range f.Bars {
		y := float64(i)*barRowH + 4
		r := barRow{Key: b.Key, Label: cut(b.Key, barKeyRune), Color: groupColor(b.Index), Y: y, Mid: y + barH/2, W: x(b.Stat.GetMean()) - barLabelW, Value: num(b.Stat.GetMean())}
		if b.Stat.CiLow != nil {
			r.HasCI, r.X1, r.X2 = true, x(b.Stat.GetCiLow()), x(b.Stat.GetCiHigh())
			r.CI = "± " + numfmt.Sig((b.Stat.GetCiHigh()-b.Stat.GetCiLow())/2, 2)
		}
		out[i] = r
	}
	return out
}

func cut(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// scatter is each run's tok/s (x) against its J/token (y), coloured by
// group: which group is faster and which is cheaper in energy, at a glance.
type scatter struct {
	W, H, Left, Right, Top, Bottom float64
	XTicks, YTicks                 []tick
	Points                         []scatterPoint
	Groups                         []legendItem
	Missing                        int // runs without both rates
	// Shown of Total runs with both rates are drawn: fewer when thinned.
	Shown, Total int
}

// Thinned is whether the scatter draws fewer runs than have both rates.
func (s *scatter) Thinned() bool { return s.Shown < s.Total }

type tick struct {
	Pos   float64
	Label string
}

type scatterPoint struct {
	Run, Group, Color string
	X, Y              float64
	Title             string
}

type legendItem struct{ Key, Color string }

// maxScatterPoints bounds the runs a scatter draws (a model's comparison
// can hold every run of the fleet): past it each group keeps an even share
// of its runs (thinScatter), so the page stays small and each group's
// cloud keeps its place and its spread.
const maxScatterPoints = 500

// scatterRun is one run a scatter places.
type scatterRun struct {
	run       string
	tok, jpt  float64
	group     int
	groupName string
}

// newScatter places the runs of res's groups, from each group's points
// (the rates of its runs' reports); nil when fewer than two runs have both
// rates.
func newScatter(res *trainmeterv1.CompareResponse) *scatter {
	s := &scatter{W: 640, H: 320, Left: 64, Right: 16, Top: 28, Bottom: 40}
	groups := res.GetGroups()
	byGroup := make([][]scatterRun, len(groups))
	for i, g := range groups {
		s.Groups = append(s.Groups, legendItem{Key: g.GetKey(), Color: groupColor(i)})
		for _, p := range g.GetPoints() {
			if p.TokPerS == nil || p.JPerToken == nil {
				s.Missing++
				continue
			}
			byGroup[i] = append(byGroup[i], scatterRun{p.GetRunId(), p.GetTokPerS(), p.GetJPerToken(), i, g.GetKey()})
			s.Total++
		}
	}
	if s.Total < 2 {
		return nil
	}
	xmax, ymax := 0.0, 0.0
	var pts []scatterRun
	for _, rs := range byGroup {
		for _, p := range rs {
			xmax, ymax = math.Max(xmax, p.tok), math.Max(ymax, p.jpt)
		}
		if s.Total > maxScatterPoints {
			rs = thinScatter(rs, max(1, maxScatterPoints/len(groups)))
		}
		pts = append(pts, rs...)
	}
	s.Shown = len(pts)
	xs, xStep := niceTicks(xmax)
	ys, yStep := niceTicks(ymax)
	xTop, yTop := xs[len(xs)-1], ys[len(ys)-1]
	pw, ph := s.W-s.Left-s.Right, s.H-s.Top-s.Bottom
	px := func(v float64) float64 { return s.Left + pw*v/xTop }
	py := func(v float64) float64 { return s.Top + ph*(1-v/yTop) }
	for _, v := range xs {
		s.XTicks = append(s.XTicks, tick{px(v), numfmt.Sig(v, sigOf(xStep, v))})
	}
	for _, v := range ys {
		s.YTicks = append(s.YTicks, tick{py(v), numfmt.Sig(v, sigOf(yStep, v))})
	}
	for _, p := range pts {
		s.Points = append(s.Points, scatterPoint{Run: p.run, Group: p.groupName, Color: groupColor(p.group), X: px(p.tok), Y: py(p.jpt),
			Title: p.run + " (" + p.groupName + "): " + num(p.tok) + " tok/s, " + num(p.jpt) + " J/token"})
	}
	return s
}

// thinScatter keeps about n of a group's runs, the same ones on every
// request: n evenly spaced in the group's order (by start for a model's
// runs, so every period keeps its share), and the runs at the group's
// extremes (fastest, slowest, most and least J/token) so that the cloud's
// spread stays what it is.
func thinScatter(rs []scatterRun, n int) []scatterRun {
	if len(rs) <= n {
		return rs
	}
	keep := make([]bool, len(rs))
	for i := range n {
		keep[i*len(rs)/n] = true
	}
	lo, hi, jlo, jhi := 0, 0, 0, 0
	for i, r := range rs {
		if r.tok < rs[lo].tok {
			lo = i
		}
		if r.tok > rs[hi].tok {
			hi = i
		}
		if r.jpt < rs[jlo].jpt {
			jlo = i
		}
		if r.jpt > rs[jhi].jpt {
			jhi = i
		}
	}
	keep[lo], keep[hi], keep[jlo], keep[jhi] = true, true, true, true
	var out []scatterRun
	for i, r := range rs {
		if keep[i] {
			out = append(out, r)
		}
	}
	return out
}

// niceTicks are 0 to at least max in steps of 1, 2 or 5 × 10^k, about five.
func niceTicks(max float64) ([]float64, float64) {
	if max <= 0 {
		max = 1
	}
	raw := max / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for i := 0; ; i++ {
		v := float64(i) * step
		out = append(out, v)
		if v >= max {
			break
		}
	}
	return out, step
}

// sigOf is how many significant digits write v exactly on a grid of step.
func sigOf(step, v float64) int {
	if v == 0 {
		return 1
	}
	return max(1, int(math.Floor(math.Log10(math.Abs(v))))-int(math.Floor(math.Log10(step)))+1)
}

// px writes an SVG coordinate.
func px(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

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
}

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

// newScatter places the runs of res's groups, read from runs; nil when
// fewer than two runs have both rates.
func newScatter(res *trainmeterv1.CompareResponse, runs map[string]*trainmeterv1.RunReport) *scatter {
	s := &scatter{W: 640, H: 320, Left: 64, Right: 16, Top: 28, Bottom: 40}
	type pt struct {
		run, group, color string
		tok, jpt          float64
	}
	var pts []pt
	for i, g := range res.GetGroups() {
		s.Groups = append(s.Groups, legendItem{Key: g.GetKey(), Color: groupColor(i)})
		for _, id := range g.GetRunIds() {
			r := runs[id]
			if r == nil || r.TokPerS == nil || r.JPerToken == nil {
				s.Missing++
				continue
			}
			pts = append(pts, pt{id, g.GetKey(), groupColor(i), r.GetTokPerS(), r.GetJPerToken()})
		}
	}
	if len(pts) < 2 {
		return nil
	}
	xmax, ymax := 0.0, 0.0
	for _, p := range pts {
		xmax, ymax = math.Max(xmax, p.tok), math.Max(ymax, p.jpt)
	}
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
		s.Points = append(s.Points, scatterPoint{Run: p.run, Group: p.group, Color: p.color, X: px(p.tok), Y: py(p.jpt),
			Title: p.run + " (" + p.group + "): " + num(p.tok) + " tok/s, " + num(p.jpt) + " J/token"})
	}
	return s
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

package console

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// manyRunsCompare is a comparison of a model's 4,005 runs in three groups
// of 3,000, 1,000 and 5 runs, each run with its rates but one in b without
// J/token; in a, one run is the fastest and another the hungriest by far.
func manyRunsCompare() *trainmeterv1.CompareResponse {
	res := &trainmeterv1.CompareResponse{By: "backend", Baseline: "a"}
	for _, g := range []struct {
		key string
		n   int
	}{{"a", 3000}, {"b", 1000}, {"c", 5}} {
		cg := &trainmeterv1.CompareGroup{Key: g.key, JPerToken: &trainmeterv1.CompareStat{Mean: 1, N: uint32(g.n)}, TokPerS: &trainmeterv1.CompareStat{Mean: 100, N: uint32(g.n)}}
		for i := range g.n {
			id := fmt.Sprintf("%s-%04d", g.key, i)
			tok, jpt := 100+float64(i%97), 1+float64(i%13)/10
			switch id {
			case "a-1234":
				tok = 900
			case "a-2345":
				jpt = 7
			}
			p := &trainmeterv1.CompareRunPoint{RunId: id, TokPerS: proto.Float64(tok), JPerToken: proto.Float64(jpt)}
			if id == "b-0007" {
				p.JPerToken = nil
			}
			cg.RunIds = append(cg.RunIds, id)
			cg.Points = append(cg.Points, p)
		}
		res.Groups = append(res.Groups, cg)
	}
	return res
}

// TestScatterThinsManyRuns: a scatter of thousands of runs draws at most
// an even share of each group (a small group whole), the same runs on
// every request, keeps each group's extremes and its axes' range, and the
// page says how many runs it shows of how many.
func TestScatterThinsManyRuns(t *testing.T) {
	res := manyRunsCompare()
	s := newScatter(res)
	if s.Total != 4004 || s.Missing != 1 || !s.Thinned() {
		t.Fatalf("scatter of %d runs (%d missing), thinned %v: want 4004 runs with both rates, 1 missing", s.Total, s.Missing, s.Thinned())
	}
	per := map[string][]string{}
	for _, p := range s.Points {
		per[p.Group] = append(per[p.Group], p.Run)
	}
	share := maxScatterPoints / 3
	if n := len(per["a"]); n < share || n > share+4 {
		t.Errorf("group a draws %d runs, want its share %d (+ its extremes)", n, share)
	}
	if n := len(per["b"]); n < share || n > share+4 {
		t.Errorf("group b draws %d runs, want its share %d (+ its extremes)", n, share)
	}
	if n := len(per["c"]); n != 5 {
		t.Errorf("group c draws %d runs, want all 5", n)
	}
	if s.Shown != len(s.Points) || s.Shown > maxScatterPoints+3*4 {
		t.Errorf("shown %d, %d points: want one count, at most %d", s.Shown, len(s.Points), maxScatterPoints+12)
	}
	for _, id := range []string{"a-1234", "a-2345"} {
		if !slices.Contains(per["a"], id) {
			t.Errorf("thinned scatter leaves out %s, an extreme of its group", id)
		}
	}
	// Evenly spread in the group's order: a's first and last hundred runs
	// each keep about their share.
	early, late := 0, 0
	for _, id := range per["a"] {
		var i int
		fmt.Sscanf(id, "a-%d", &i)
		if i < 300 {
			early++
		}
		if i >= 2700 {
			late++
		}
	}
	if early < share/10-1 || late < share/10-1 {
		t.Errorf("group a keeps %d of its first 300 runs and %d of its last 300: want about %d each", early, late, share/10)
	}
	if top := s.XTicks[len(s.XTicks)-1].Label; top != "1000" {
		t.Errorf("x axis ends at %s, want 1000 (the fastest run, 900 tok/s)", top)
	}
	again := newScatter(manyRunsCompare())
	if !slices.EqualFunc(s.Points, again.Points, func(a, b scatterPoint) bool { return a == b }) {
		t.Error("two requests draw different runs")
	}

	tpl, err := parseTemplates()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	d := &compareData{Form: compareForm{Model: "m", By: "backend"}, Result: res, Figures: compareFigures(res), Scatter: s}
	if err := tpl.ExecuteTemplate(&buf, "compare.html", page{Title: "Compare", Nav: "compare", Data: d}); err != nil {
		t.Fatal(err)
	}
	body := buf.String()
	if n := len(regexp.MustCompile(`<circle class="run" `).FindAllString(body, -1)); n != s.Shown {
		t.Errorf("page draws %d runs, want %d", n, s.Shown)
	}
	if want := fmt.Sprintf("showing %d of 4004 runs", s.Shown); !strings.Contains(body, want) {
		t.Errorf("page does not say %q", want)
	}
	if !strings.Contains(body, `title="a-0000 a-0001`) || !strings.Contains(body, "… and 2980 more") {
		t.Error("group a's run count's tooltip: want its first runs and how many more")
	}
	if len(body) > 200_000 {
		t.Errorf("compare page of 4,005 runs is %d bytes, want it under 200 kB", len(body))
	}
}

// TestScatterWhole: a scatter of a few runs draws every one and says
// nothing of thinning.
func TestScatterWhole(t *testing.T) {
	res := manyRunsCompare()
	res.Groups = res.Groups[2:]
	res.Groups = append(res.Groups, &trainmeterv1.CompareGroup{Key: "d", Points: []*trainmeterv1.CompareRunPoint{{RunId: "d-1", TokPerS: proto.Float64(5), JPerToken: proto.Float64(2)}}})
	s := newScatter(res)
	if s.Thinned() || s.Shown != 6 || len(s.Points) != 6 {
		t.Errorf("scatter of 6 runs: shown %d, %d points, thinned %v", s.Shown, len(s.Points), s.Thinned())
	}
}

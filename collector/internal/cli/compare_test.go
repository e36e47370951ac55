package cli

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// TestCompareCommand feeds a real collector (gRPC on loopback, BadgerDB in
// a temp dir) two backends' runs and checks that `compare` agrees with
// `report --json` of the same runs.
func TestCompareCommand(t *testing.T) {
	srv := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), GPUPricePerHour: 3.6, Clock: tu.Clock()},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	addr := srv.Addr().String()
	a := tu.Connect(t, tu.Dial(t, addr), "n1", "boot")
	seq := uint64(0)
	// bnb: 100 J per 1 s window and about 100 tokens; unsloth: 60 J and
	// about 150 tokens. Each run's tokens differ a little so that the
	// groups have a spread.
	feedOf := func(run, model, backend string, at float64, tokens uint64, joules float64, ends bool) {
		for s := range 5 {
			sec := at + float64(s)
			var evs []*trainmeterv1.RunEvent
			if s == 0 {
				st := tu.Start(run, sec, model)
				st.GetRunStart().Metadata.Backend = backend
				evs = append(evs, st)
			}
			if s == 4 && ends {
				evs = append(evs, tu.End(run, sec+1))
			}
			seq++
			a.MustAck(tu.Batch(seq, sec, []*trainmeterv1.RunWindow{tu.Window(run, sec, tokens, joules)}, evs...))
		}
	}
	feed := func(run, backend string, at float64, tokens uint64, joules float64) {
		feedOf(run, "m", backend, at, tokens, joules, true)
	}
	feed("b1", "bnb", 0, 100, 100)
	feed("b2", "bnb", 10, 110, 100)
	feed("b3", "bnb", 20, 95, 100)
	feed("u1", "unsloth", 30, 150, 60)
	feed("u2", "unsloth", 40, 160, 60)
	// Neither another model's run nor a live run of m is compared.
	feedOf("o1", "other", "bnb", 50, 100, 100, true)
	feedOf("l1", "m", "bnb", 60, 100, 100, false)

	out, err := run(t, nil, "compare", "--model", "m", "--by", "backend", "--json", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	var cmp struct {
		Baseline string `json:"baseline"`
		Groups   []struct {
			Key       string   `json:"key"`
			RunIDs    []string `json:"run_ids"`
			JPerToken struct {
				Mean  float64
				CiLow *float64 `json:"ci_low"`
			} `json:"j_per_token"`
			TokPerS struct{ Mean float64 } `json:"tok_per_s"`
			Points  []struct {
				RunID     string   `json:"run_id"`
				TokPerS   *float64 `json:"tok_per_s"`
				JPerToken *float64 `json:"j_per_token"`
			} `json:"points"`
		} `json:"groups"`
		Rows []struct {
			Key             string `json:"key"`
			EnergySavingPct struct {
				Value  float64  `json:"value"`
				PValue *float64 `json:"p_value"`
			} `json:"energy_saving_pct"`
			Speedup struct {
				Value float64 `json:"value"`
			} `json:"speedup"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &cmp); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if cmp.Baseline != "bnb" || len(cmp.Groups) != 2 || len(cmp.Rows) != 1 || cmp.Rows[0].Key != "unsloth" {
		t.Fatalf("%s", out)
	}
	// The same figures from `report --json`, run by run.
	report := func(id string) map[string]any {
		rep, err := run(t, nil, "report", id, "--json", "--collector", addr)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(rep), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	mean := func(ids []string, field string) float64 {
		var sum float64
		for _, id := range ids {
			sum += report(id)[field].(float64)
		}
		return sum / float64(len(ids))
	}
	// Each group's points are its runs, in order, with their reports' rates.
	for _, g := range cmp.Groups {
		var ids []string
		for _, p := range g.Points {
			ids = append(ids, p.RunID)
			m := report(p.RunID)
			if p.TokPerS == nil || p.JPerToken == nil || *p.TokPerS != m["tok_per_s"] || *p.JPerToken != m["j_per_token"] {
				t.Errorf("group %s point %s: tok/s %v J/token %v, want the report's %v, %v", g.Key, p.RunID, p.TokPerS, p.JPerToken, m["tok_per_s"], m["j_per_token"])
			}
		}
		if strings.Join(ids, ",") != strings.Join(g.RunIDs, ",") {
			t.Errorf("group %s points of %v, want its runs %v", g.Key, ids, g.RunIDs)
		}
	}
	jb, ju := mean([]string{"b1", "b2", "b3"}, "j_per_token"), mean([]string{"u1", "u2"}, "j_per_token")
	tb, tu2 := mean([]string{"b1", "b2", "b3"}, "tok_per_s"), mean([]string{"u1", "u2"}, "tok_per_s")
	if g := cmp.Groups[0]; strings.Join(g.RunIDs, ",") != "b1,b2,b3" || math.Abs(g.JPerToken.Mean-jb) > 1e-9 || g.JPerToken.CiLow == nil {
		t.Errorf("bnb group %+v, want J/token mean %v from the reports", g, jb)
	}
	if g := cmp.Groups[1]; strings.Join(g.RunIDs, ",") != "u1,u2" || math.Abs(g.JPerToken.Mean-ju) > 1e-9 || math.Abs(g.TokPerS.Mean-tu2) > 1e-9 {
		t.Errorf("unsloth group %+v, want J/token %v tok/s %v", g, ju, tu2)
	}
	row := cmp.Rows[0]
	if math.Abs(row.EnergySavingPct.Value-(1-ju/jb)*100) > 1e-9 || math.Abs(row.Speedup.Value-tu2/tb) > 1e-9 {
		t.Errorf("row %+v, want saving %v %% speedup %v", row, (1-ju/jb)*100, tu2/tb)
	}
	if p := row.EnergySavingPct.PValue; p == nil || *p > 0.01 {
		t.Errorf("energy saving p-value %v: two clearly apart groups", p)
	}

	table, err := run(t, nil, "compare", "b1", "u1", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"b1 (baseline)", "(n=1)", "warning: group u1 has one run: no confidence interval or p-value"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	csvOut, err := run(t, nil, "compare", "--model", "m", "--by", "backend", "--baseline", "unsloth", "--csv", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(strings.NewReader(csvOut)).ReadAll()
	if err != nil || len(recs) != 3 || recs[2][0] != "unsloth" || recs[2][1] != "true" || recs[1][4] == "" {
		t.Errorf("csv %v %v:\n%s", recs, err, csvOut)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"compare", "b1", "nope"}, `unknown run(s): ["nope"]`},
		{[]string{"compare", "--model", "m", "--by", "colour"}, `cannot group by "colour"`},
		{[]string{"compare", "--model", "m", "--by", "backend", "--baseline", "x"}, `no group "x" to use as the baseline; the groups are bnb, unsloth`},
	} {
		if _, err := run(t, nil, append(tc.args, "--collector", addr)...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestSig: the compare table writes figures by numfmt's rule (the
// console's too): whole numbers whole, no exponent, no trailing zeros.
func TestSig(t *testing.T) {
	for v, want := range map[float64]string{19812.3: "19812", 0.025981: "0.02598", 240.4: "240", 1.5: "1.5", 53000: "53000", 0: "0", 1e-9: "1e-09"} {
		n := 4
		if v == 240.4 || v == 53000 {
			n = 2
		}
		if got := sig(v, n); got != want {
			t.Errorf("sig(%v, %d) = %s, want %s", v, n, got, want)
		}
	}
}

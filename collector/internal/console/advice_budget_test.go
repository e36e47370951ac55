package console_test

import (
	"context"
	"html"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// seedPlateau ingests one ended run of the evil model whose validation
// loss plateaus after epoch 2: patience (2 evaluations) runs out at epoch
// 4 and it trains epochs 5 and 6 for nothing, an early-stopping
// recommendation with savings in dollars and joules.
func (c *collector) seedPlateau(t *testing.T) {
	t.Helper()
	a := tu.Connect(t, tu.Dial(t, c.srv.Addr().String()), "node-1", "boot")
	defer a.Close()
	start := tu.Start(evilRun, 10, evilModel)
	start.GetRunStart().PlannedEpochs = 10
	for i, loss := range []float64{2, 1.5, 1.5, 1.5, 1.5, 1.5} {
		sec := 10 + float64(i)
		evs := []*trainmeterv1.RunEvent{{Event: &trainmeterv1.RunEvent_Eval{Eval: &trainmeterv1.Eval{
			RunId: evilRun, Time: tu.TS(sec + 0.5), Epoch: proto.Int64(int64(i + 1)), ValLoss: proto.Float64(loss)}}}}
		if i == 0 {
			evs = append([]*trainmeterv1.RunEvent{start}, evs...)
		}
		if i == 5 {
			evs = append(evs, tu.End(evilRun, sec+1))
		}
		a.MustAck(tu.Batch(uint64(i+1), sec, []*trainmeterv1.RunWindow{tu.Window(evilRun, sec, 1000, 100)}, evs...))
	}
}

// cellValues are the data-value attributes of a page's table with id, in
// the order a reader sees them.
func cellValues(t *testing.T, page, id string) []string {
	t.Helper()
	table := regexp.MustCompile(`(?s)<table id="` + id + `">.*?</table>`).FindString(page)
	if table == "" {
		t.Fatalf("no table #%s:\n%s", id, page)
	}
	var out []string
	for _, m := range regexp.MustCompile(`data-value="([^"]*)"`).FindAllStringSubmatch(table, -1) {
		out = append(out, m[1])
	}
	return out
}

func fmtVal(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// TestRecommendationsPageShowsTheServicesAnswer: a stored run that trained
// past its plateau gets the optimizer's early-stopping advice, and the
// Recommendations page shows every recommendation the RecommendService
// returns with its savings and confidence to the last digit, the totals,
// and the run id and model as text, never markup.
func TestRecommendationsPageShowsTheServicesAnswer(t *testing.T) {
	c := startCollector(t, nil)
	c.seedPlateau(t)
	rs := trainmeterv1.NewRecommendServiceClient(tu.Dial(t, c.srv.Addr().String()))
	want, err := rs.Recommend(t.Context(), &trainmeterv1.RecommendRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var early *trainmeterv1.Recommendation
	for _, r := range want.GetRecommendations() {
		if r.GetKind() == "early_stopping" {
			early = r
		}
	}
	if early == nil || early.GetSavingsUsd() <= 0 || early.GetSavingsJ() <= 0 {
		t.Fatalf("setup: no early-stopping advice with savings: %v", want)
	}

	resp, page := get(t, nil, c.base+"/recommendations")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /recommendations: %s\n%s", resp.Status, page)
	}
	var cells []string
	for _, r := range want.GetRecommendations() {
		cells = append(cells, fmtVal(r.GetSavingsUsd()), fmtVal(r.GetSavingsJ()), fmtVal(r.GetConfidence()))
	}
	if got := cellValues(t, page, "recommendations"); strings.Join(got, " ") != strings.Join(cells, " ") {
		t.Errorf("recommendation rows' savings and confidence %q, RecommendService %q", got, cells)
	}
	for _, v := range []float64{want.GetTotalSavingsUsd(), want.GetTotalSavingsJ()} {
		if v == 0 || !strings.Contains(page, `data-value="`+fmtVal(v)+`"`) {
			t.Errorf("page lacks the total savings %v", v)
		}
	}
	for _, s := range []string{early.GetTitle(), early.GetAction(), evilModel} {
		if !strings.Contains(page, html.EscapeString(s)) {
			t.Errorf("page lacks %q, escaped", s)
		}
	}
	if !strings.Contains(page, `href="`+runPath(evilRun)+`"`) && !strings.Contains(page, `href="/runs/r%3cscript%3ealert%28%22run%22%29%3c%2fscript%3e%27%22"`) {
		t.Errorf("the run's link is not one escaped path segment:\n%s", page)
	}
	for _, evil := range []string{evilRun, evilModel, "<script"} {
		if strings.Contains(page, evil) {
			t.Errorf("the raw trainer value %q is in the page", evil)
		}
	}
	if bad := unsafeMarkup(page); len(bad) > 0 {
		t.Errorf("markup that could run a script: %q", bad)
	}

	// A confidence above every recommendation's leaves the table empty.
	_, page = get(t, nil, c.base+"/recommendations?min_confidence=0.99")
	if got := cellValues(t, page, "recommendations"); len(got) != 0 || !strings.Contains(page, "No recommendations at this confidence") {
		t.Errorf("min_confidence 0.99: rows %q", got)
	}
}

// TestBudgetsPageShowsTheAlerts: a budget the stored run overspends fires
// its threshold alerts, and the Budgets page lists every alert the
// BudgetService returns, newest first, with its scope (the evil model's
// name) as text.
func TestBudgetsPageShowsTheAlerts(t *testing.T) {
	clk := clock.NewFake(tu.Now())
	c := startCollector(t, func(cfg *server.Config) {
		cfg.Clock = clk
		cfg.Budget.EvalInterval = time.Second
	})
	c.seedPlateau(t) // $2/GPU-hour × 6 GPU-seconds = $0.00333
	bc := trainmeterv1.NewBudgetServiceClient(tu.Dial(t, c.srv.Addr().String()))
	if _, err := bc.SetBudget(t.Context(), &trainmeterv1.SetBudgetRequest{Scope: "model:" + evilModel, LimitUsd: 0.001}); err != nil {
		t.Fatal(err)
	}
	// The second tick is taken only after the first tick's evaluation
	// finished: its alerts are stored.
	clk.Advance(time.Second)
	clk.Advance(time.Second)
	want, err := bc.ListAlerts(context.Background(), &trainmeterv1.ListAlertsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(want.GetAlerts()) == 0 {
		t.Fatal("setup: the overspent budget fired no alert")
	}

	resp, page := get(t, nil, c.base+"/budgets")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /budgets: %s\n%s", resp.Status, page)
	}
	rows := regexp.MustCompile(`<tr class="sev-[^"]*"><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td></tr>`).FindAllStringSubmatch(page, -1)
	if len(rows) != len(want.GetAlerts()) {
		t.Fatalf("%d alert rows, BudgetService %d:\n%s", len(rows), len(want.GetAlerts()), page)
	}
	shown := map[string]bool{}
	for _, r := range rows {
		shown[html.UnescapeString(r[1]+"|"+r[3]+"|"+r[2]+"|"+r[4]+"|"+r[5])] = true
		if r[4] != html.EscapeString("model:"+evilModel) {
			t.Errorf("alert row's scope %q is not the escaped budget scope", r[4])
		}
	}
	for _, a := range want.GetAlerts() {
		if k := a.GetTime().AsTime().UTC().Format(time.RFC3339) + "|" + a.GetSeverity() + "|" + a.GetKind() + "|" + a.GetScope() + "|" + a.GetMessage(); !shown[k] || a.GetMessage() == "" {
			t.Errorf("alert %q not on the page", k)
		}
	}
	for i := 1; i < len(rows); i++ {
		if rows[i][1] > rows[i-1][1] {
			t.Errorf("alerts not newest first: %s after %s", rows[i][1], rows[i-1][1])
		}
	}
	if strings.Contains(page, evilModel) {
		t.Error("the raw model name is in the page")
	}
	if bad := unsafeMarkup(page); len(bad) > 0 {
		t.Errorf("markup that could run a script: %q", bad)
	}
}

package pgstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/loadgen"
	"github.com/trainmeter/trainmeter/collector/internal/pgstore"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/query"
	"github.com/trainmeter/trainmeter/collector/internal/report"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/pgtest"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// sqlTolerance is how near a float a view or panel shows must be to what
// the query service answers: the rollups add a day's windows in another
// order than usage does (relative, and absolute near 0).
const sqlTolerance = 1e-9

func near(a, b float64) bool {
	return math.Abs(a-b) <= sqlTolerance*max(1, math.Abs(a), math.Abs(b))
}

// nearPtr: both unknown, or both known and near.
func nearPtr(a, b *float64) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return near(*a, *b)
}

func show(p *float64) string {
	if p == nil {
		return "NULL"
	}
	return fmt.Sprint(*p)
}

// sqlStream loads, through the real ingest server, a stream over two UTC
// days: runs with users, labels and a priority on three nodes (one on two
// nodes with host energy), warmup, raw samples, an invalid counter,
// duplicates and reordering, a loss record, evaluations, a run without a
// user or team, a live run deleted and sent more data, a run repriced and
// the fleet repriced since a time. The leader's roll-up (rollbehind.go)
// runs once part way, so that the daily usage holds records ingest added
// (late ones), records the roll-up added, and records deleted or repriced
// on either side of it, and once at the end. It returns the query service.
func sqlStream(t *testing.T, dbURL string) *query.Server {
	tariff, err := cost.ParseTariff([]byte(`{default: off, bands: {off: 0.1, peak: 0.3}, rules: [{from: "12:00", to: "12:01", band: peak}]}`))
	if err != nil {
		t.Fatal(err)
	}
	pricing := aggregate.Pricing{GPUPricePerHour: 2.5, NodeGPUPricePerHour: map[string]float64{"node-b": 3.1},
		Tariff: tariff, GridGCO2PerKWh: 400, PriorityMultipliers: map[string]float64{"high": 1.5}}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ps, err := pgstore.Open(context.Background(), dbURL, pgstore.Options{Logger: quiet, Clock: tu.Clock(), EnergyBands: tariff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ps.Close() })
	c := serveCollector(t, "PostgreSQL", ps, pricing)
	connect := func(node, boot string) func(*trainmeterv1.Batch) {
		a := tu.ConnectHello(t, c.conn, &trainmeterv1.Hello{Node: node, BootId: boot, AgentVersion: "test", GpuBackend: "sim",
			Gpus: []*trainmeterv1.GpuInfo{
				{Index: 0, Name: "Sim H100", MemoryTotalMib: 81559, HasEnergyCounter: true},
				{Index: 1, Name: "Sim H100", MemoryTotalMib: 81559, HasEnergyCounter: true},
			}})
		return func(b *trainmeterv1.Batch) {
			t.Helper()
			r, err := a.Send(b)
			if err != nil || r.GetAck().GetSeq() != b.GetSeq() {
				t.Fatalf("%s batch %d: %v %v", node, b.GetSeq(), r, err)
			}
		}
	}
	a := connect("node-a", "boot-1")
	for s := 1; s <= 7; s++ {
		b := batch(uint64(s), s, "r1", s == 1, "alice", "vision")
		switch s {
		case 2:
			b.RunWindows[0].Phase = trainmeterv1.Phase_PHASE_WARMUP
		case 3:
			b.GpuWindows[1].CounterOk = false
			b.RunWindows[0].CounterOk = false
		case 7:
			withEnd(withEval(b, "r1", 7, 0.61), "r1", 7)
		}
		if s == 5 {
			continue // lost: its loss record comes with 6
		}
		if s == 6 {
			b.Losses = []*trainmeterv1.DataLoss{{RunId: "r1", Batches: 1, Tokens: 65536, EnergyJ: 1100, GpuSeconds: 2, Reason: "spool full"}}
		}
		a(b)
	}
	a(batch(4, 4, "r1", false, "", "")) // a duplicate
	// The day before (23:00 UTC): r5, no user, no team.
	for s := 1; s <= 4; s++ {
		b := batch(uint64(20+s), s-13*3600, "r5", s == 1, "", "")
		if s == 4 {
			withEnd(b, "r5", s-13*3600)
		}
		a(b)
	}
	nb, nc := connect("node-b", "b1"), connect("node-c", "c1")
	for s := 1; s <= 8; s++ {
		for _, send := range []func(*trainmeterv1.Batch){nb, nc} {
			b := batch(uint64(s), s, "r2", s == 1, "bob", "nlp")
			if s == 1 {
				b.RunEvents[0].GetRunStart().Labels["priority"] = "high"
			}
			withHost(b, "r2")
			if s == 8 {
				withEnd(withEval(b, "r2", 8, 0.64), "r2", 8)
			}
			send(b)
		}
	}
	ctx := context.Background()
	rollUp := func(until time.Time) {
		t.Helper()
		if err := ps.RollUp(ctx, until, true); err != nil {
			t.Fatal(err)
		}
	}
	rollUp(at(10))
	// node-b idle after r2 (its GPUs' idle time and energy).
	for s := 13; s <= 14; s++ {
		b := loadgen.MakeBatch(uint64(s), at(s), time.Second, "", 2, false)
		b.RunWindows, b.RunEvents = nil, nil
		for _, gw := range b.GpuWindows {
			gw.IdleGpuSeconds, gw.IdleEnergyCounterJ, gw.IdleEnergyIntegratedJ = gw.GetGpuSeconds(), gw.GetEnergyCounterJ(), gw.GetEnergyIntegratedJ()
		}
		nb(b)
	}
	for s := 9; s <= 12; s++ {
		b := batch(uint64(s), s, "r3", s == 9, "carol", "vision")
		if s == 12 {
			withEnd(withEval(b, "r3", 12, 0.58), "r3", 12)
		}
		nb(b)
	}
	for s := 9; s <= 11; s++ {
		nc(batch(uint64(s), s, "r4", s == 9, "dave", "nlp"))
	}
	if _, err := c.q.DeleteRun(ctx, &trainmeterv1.DeleteRunRequest{RunId: "r4", Force: true}); err != nil {
		t.Fatal(err)
	}
	for s := 12; s <= 13; s++ {
		nc(batch(uint64(s), s, "r4", false, "", ""))
	}
	if _, err := c.q.Reprice(ctx, &trainmeterv1.RepriceRequest{RunId: "r2", UsdPerGpuHour: 4, Reason: "contract"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.q.Reprice(ctx, &trainmeterv1.RepriceRequest{Since: timestamppb.New(at(10)), UsdPerGpuHour: 3.3, Reason: "new rate"}); err != nil {
		t.Fatal(err)
	}
	rollUp(at(2 * 86400))
	return c.q
}

// figures is a usage row's or a panel row's figures.
type figures struct {
	gpuS, energyJ float64
	cost          *float64
	runs          int64
}

func (f figures) String() string {
	return fmt.Sprintf("%v GPU-s, %v J, $%s, %d runs", f.gpuS, f.energyJ, show(f.cost), f.runs)
}

func (f figures) near(g figures) bool {
	return near(f.gpuS, g.gpuS) && near(f.energyJ, g.energyJ) && nearPtr(f.cost, g.cost) && (f.runs < 0 || g.runs < 0 || f.runs == g.runs)
}

// usageKey is a usage row's key as SQL groups it: its keys, and idle
// (with its node) or deleted.
func usageKey(r *trainmeterv1.UsageRow) string {
	k := strings.Join(r.GetKeys(), "|")
	switch {
	case r.GetIdle():
		return k + "|idle " + r.GetIdleNode()
	case r.GetDeleted():
		return k + "|deleted"
	}
	return k
}

// days are the stream's two UTC days.
var sqlDays = []time.Time{time.Date(2025, 2, 28, 0, 0, 0, 0, time.UTC), time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)}

func usageDay(t *testing.T, q *query.Server, day time.Time, by ...string) *trainmeterv1.UsageResponse {
	t.Helper()
	u, err := q.Usage(context.Background(), &trainmeterv1.UsageRequest{By: by,
		Since: timestamppb.New(day), Until: timestamppb.New(day.AddDate(0, 0, 1))})
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// SQL keys for usage_day's rows as usage groups them.
const (
	sqlKind = `CASE kind WHEN 'idle' THEN '|idle ' || node WHEN 'deleted' THEN '|deleted' ELSE '' END`
	sqlNone = `CASE kind WHEN 'idle' THEN '(idle)' WHEN 'deleted' THEN '(deleted)' ELSE `
)

var sqlBy = map[string]string{
	"node":       `node`,
	"user":       sqlNone + `coalesce(user_name, 'uid ' || uid, '(unlabeled)') END`,
	"model":      sqlNone + `coalesce(nullif(model, ''), '(unlabeled)') END`,
	"label:team": sqlNone + `coalesce(nullif(labels ->> 'team', ''), '(unlabeled)') END`,
}

// TestSQLViews loads a realistic stream through pgstore and checks every
// view against the query service the CLI reads: run_report against every
// run's report --json (exact: the columns are the report's figures), and
// usage_day and usage_day_node against usage --json for each UTC day, by
// node, user, model and label, idle and deleted runs apart (within
// sqlTolerance), rows and nodes alike.
func TestSQLViews(t *testing.T) {
	dbURL := pgtest.DB(t)
	q := sqlStream(t, dbURL)
	ctx := context.Background()
	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(ctx) })

	ids, sawDeleted, sawIdle := checkViews(t, q, db, sqlDays)
	if len(ids) != 4 {
		t.Errorf("run_report holds %v; want r1, r2, r3, r5", ids)
	}
	r2, err := q.GetRun(ctx, &trainmeterv1.GetRunRequest{RunId: "r2"})
	if err != nil {
		t.Fatal(err)
	}
	if r := r2.GetRun(); r.GetNodes() != 2 || r.GetRepricedAt() == nil || r.TotalCostUsd == nil || r.JPerToken == nil {
		t.Errorf("r2: %d nodes, repriced %v, cost %s, J/token %s: the stream no longer exercises what it should", r.GetNodes(), r.GetRepricedAt(), show(r.TotalCostUsd), show(r.JPerToken))
	}
	r5, err := q.GetRun(ctx, &trainmeterv1.GetRunRequest{RunId: "r5"})
	if err != nil {
		t.Fatal(err)
	}
	var user *string
	if err := db.QueryRow(ctx, `SELECT user_name FROM run_report WHERE run_id = 'r5'`).Scan(&user); err != nil || user != nil || r5.GetRun().GetUser() != "" {
		t.Errorf("r5: user_name %v (%v), want NULL (no user)", user, err)
	}
	if !sawDeleted || !sawIdle {
		t.Errorf("usage: deleted rows %v, idle rows %v; the stream is to have both", sawDeleted, sawIdle)
	}
}

// checkViews checks every view against the query service q: run_report
// against every run's report --json (exact: the columns are the report's
// figures), and usage_day and usage_day_node against usage --json for
// each UTC day of days, by node, user, model and label, idle and deleted
// runs apart (within sqlTolerance), rows and nodes alike. It returns the
// runs and whether usage had deleted and idle rows.
func checkViews(t *testing.T, q *query.Server, db *pgx.Conn, days []time.Time) (ids []string, sawDeleted, sawIdle bool) {
	t.Helper()
	ctx := context.Background()
	// run_report: one row a run, report --json's figures.
	list, err := q.ListRuns(ctx, &trainmeterv1.ListRunsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list.GetRuns() {
		ids = append(ids, r.GetRunId())
	}
	rows, err := db.Query(ctx, `SELECT run_id FROM run_report ORDER BY run_id`)
	if err != nil {
		t.Fatal(err)
	}
	viewIDs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, viewIDs) {
		t.Errorf("run_report holds %v, runs --json %v", viewIDs, ids)
	}
	for _, id := range ids {
		resp, err := q.GetRun(ctx, &trainmeterv1.GetRunRequest{RunId: id})
		if err != nil {
			t.Fatal(err)
		}
		r := resp.GetRun()
		var (
			user, model, gpuName                                 *string
			uid                                                  *int64
			labels                                               map[string]string
			startNS, endNS                                       *int64
			start, end                                           *time.Time
			status                                               string
			ended, incomplete                                    bool
			gpus, nodes                                          int32
			tokens                                               int64
			wallS, energyJ, energyTotalJ, energyKWh, gpuHours    float64
			costUSD, energyCostUSD, totalCostUSD, jPerToken, co2 *float64
		)
		err = db.QueryRow(ctx, `SELECT user_name, uid, model, gpu_name, labels, start_ns, end_ns, start_time, end_time, status, ended, incomplete,
			gpus, nodes, tokens, wall_s, energy_j, energy_total_j, energy_kwh, gpu_hours, cost_usd, energy_cost_usd, total_cost_usd, j_per_token, co2_kg
			FROM run_report WHERE run_id = $1`, id).Scan(&user, &uid, &model, &gpuName, &labels, &startNS, &endNS, &start, &end, &status, &ended, &incomplete,
			&gpus, &nodes, &tokens, &wallS, &energyJ, &energyTotalJ, &energyKWh, &gpuHours, &costUSD, &energyCostUSD, &totalCostUSD, &jPerToken, &co2)
		if err != nil {
			t.Fatalf("run_report %s: %v", id, err)
		}
		str := func(p *string) string {
			if p == nil {
				return ""
			}
			return *p
		}
		same := func(what string, got, want any) {
			t.Helper()
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("run_report %s: %s %v, report --json %v", id, what, got, want)
			}
		}
		same("tokens", tokens, r.GetTokensProcessed())
		same("user_name", str(user), r.GetUser())
		same("uid", *uid, r.GetUid())
		same("model", str(model), r.GetMetadata().GetModel())
		same("gpu_name", str(gpuName), r.GetGpuName())
		same("labels", labels, r.GetLabels())
		same("start_ns", *startNS, r.GetStart().AsTime().UnixNano())
		same("end_ns", *endNS, r.GetEnd().AsTime().UnixNano())
		same("start_time", start.UTC().Truncate(time.Microsecond), r.GetStart().AsTime().Truncate(time.Microsecond))
		same("end_time", end.UTC().Truncate(time.Microsecond), r.GetEnd().AsTime().Truncate(time.Microsecond))
		same("status", status, report.EndStatus(r))
		same("ended", ended, r.GetEnded())
		same("incomplete", incomplete, r.GetIncomplete())
		same("gpus", gpus, r.GetGpus())
		same("nodes", nodes, r.GetNodes())
		// Floats: the report's own figures, stored as float8: exact.
		same("wall_s", wallS, r.GetWallS())
		same("energy_j", energyJ, r.GetEnergyJ())
		same("energy_total_j", energyTotalJ, r.GetEnergyTotalJ())
		same("energy_kwh", energyKWh, r.GetEnergyTotalJ()/3.6e6)
		same("gpu_hours", gpuHours, r.GetGpuHours())
		same("cost_usd", show(costUSD), show(r.CostUsd))
		same("energy_cost_usd", show(energyCostUSD), show(r.EnergyCostUsd))
		same("total_cost_usd", show(totalCostUSD), show(r.TotalCostUsd))
		same("j_per_token", show(jPerToken), show(r.JPerToken))
		same("co2_kg", show(co2), show(r.Co2Kg))
	}

	// usage_day: usage --json for each day, in each grouping.
	for _, day := range days {
		for _, by := range []string{"node", "user", "model", "label:team"} {
			want := map[string]figures{}
			for _, r := range usageDay(t, q, day, by).GetRows() {
				want[usageKey(r)] = figures{r.GetGpuSeconds(), r.GetEnergyJ(), r.CostUsd, int64(r.GetRuns())}
				sawDeleted = sawDeleted || r.GetDeleted()
				sawIdle = sawIdle || r.GetIdle()
			}
			got := map[string]figures{}
			rows, err := db.Query(ctx, `SELECT `+sqlBy[by]+` || `+sqlKind+`, sum(gpu_seconds), sum(energy_j),
				CASE WHEN bool_and(cost_usd IS NOT NULL) THEN sum(cost_usd) END,
				count(DISTINCT coalesce(run_id, 'deleted:' || deletion))
				FROM usage_day WHERE day = $1 GROUP BY 1`, day)
			if err != nil {
				t.Fatal(err)
			}
			var k string
			var f figures
			if _, err := pgx.ForEachRow(rows, []any{&k, &f.gpuS, &f.energyJ, &f.cost, &f.runs}, func() error {
				got[k] = f
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			compareFigures(t, fmt.Sprintf("usage_day %s by %s", day.Format(time.DateOnly), by), got, want)
		}
		// usage_day_node: the nodes' totals.
		want := map[string]figures{}
		for _, n := range usageDay(t, q, day).GetNodes() {
			want[n.GetNode()] = figures{n.GetGpuSeconds(), n.GetEnergyJ(), nil, -1}
			want[n.GetNode()+" idle"] = figures{n.GetIdleGpuSeconds(), n.GetIdleEnergyJ(), nil, -1}
			want[n.GetNode()+" host"] = figures{n.GetHostEnergyJ(), n.GetIdleHostEnergyJ(), nil, -1}
		}
		got := map[string]figures{}
		rows, err := db.Query(ctx, `SELECT node, gpu_hours, energy_j, idle_gpu_hours, idle_energy_j, host_energy_j, idle_host_energy_j
			FROM usage_day_node WHERE day = $1`, day)
		if err != nil {
			t.Fatal(err)
		}
		var node string
		var gh, e, igh, ie, he, ihe float64
		if _, err := pgx.ForEachRow(rows, []any{&node, &gh, &e, &igh, &ie, &he, &ihe}, func() error {
			got[node] = figures{gh * 3600, e, nil, -1}
			got[node+" idle"] = figures{igh * 3600, ie, nil, -1}
			got[node+" host"] = figures{he, ihe, nil, -1}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		compareFigures(t, "usage_day_node "+day.Format(time.DateOnly), got, want)
	}
	return ids, sawDeleted, sawIdle
}

func compareFigures(t *testing.T, what string, got, want map[string]figures) {
	t.Helper()
	if len(want) == 0 {
		t.Errorf("%s: usage has no rows", what)
	}
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			t.Errorf("%s: no row %q (usage: %v)", what, k, w)
		case !g.near(w):
			t.Errorf("%s %q: %v, usage %v", what, k, g, w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: row %q (%v) that usage does not have", what, k, g)
		}
	}
}

// grafanaDashboard is the part of a dashboard JSON the test reads.
type grafanaDashboard struct {
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query string `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		Title      string `json:"title"`
		Datasource struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			RawSQL string `json:"rawSql"`
		} `json:"targets"`
	} `json:"panels"`
}

// grafanaSQL is a panel's SQL as Grafana's PostgreSQL data source sends it
// for a time range and the label variable's value.
func grafanaSQL(sql string, from, to time.Time, label string) string {
	return strings.NewReplacer("${label}", label, "$label", label).Replace(
		grafanaTimeFilter(sql, from, to))
}

func grafanaTimeFilter(sql string, from, to time.Time) string {
	for {
		i := strings.Index(sql, "$__timeFilter(")
		if i < 0 {
			return sql
		}
		j := strings.Index(sql[i:], ")")
		col := sql[i+len("$__timeFilter(") : i+j]
		sql = sql[:i] + fmt.Sprintf("%s BETWEEN '%s' AND '%s'", col, from.Format(time.RFC3339), to.Format(time.RFC3339)) + sql[i+j+1:]
	}
}

// TestPostgresDashboard runs every panel of the PostgreSQL dashboard on the
// stream of TestSQLViews, over the stream's two days, and checks what each
// shows against the query service: cost by user, GPU-hours by label and
// energy by node per day against usage --json, the nodes' table against
// usage's nodes, the runs table against report --json, the total against
// usage's rows.
func TestPostgresDashboard(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "grafana", "trainmeter-postgres-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Query
	}
	if vars["datasource"] != "grafana-postgresql-datasource" || vars["label"] != "team" {
		t.Errorf("variables %v: want a PostgreSQL datasource variable and label (team)", vars)
	}
	dbURL := pgtest.DB(t)
	q := sqlStream(t, dbURL)
	ctx := context.Background()
	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(ctx) })
	from, to := sqlDays[0], sqlDays[1].Add(24*time.Hour-time.Nanosecond)

	// usage --json per day, by a grouping, with idle rows of all nodes as
	// one (the panels name idle once): key "day|key".
	perDay := func(by string, keyOf func(r *trainmeterv1.UsageRow) string) map[string]figures {
		out := map[string]figures{}
		for _, day := range sqlDays {
			for _, r := range usageDay(t, q, day, by).GetRows() {
				k := day.Format(time.DateOnly) + "|" + keyOf(r)
				f := out[k]
				f.gpuS += r.GetGpuSeconds()
				f.energyJ += r.GetEnergyJ()
				f.runs = -1
				if _, seen := out[k]; !seen {
					f.cost = r.CostUsd
				} else if f.cost != nil && r.CostUsd != nil {
					f.cost = proto.Float64(*f.cost + r.GetCostUsd())
				} else {
					f.cost = nil
				}
				out[k] = f
			}
		}
		return out
	}
	first := func(r *trainmeterv1.UsageRow) string { return r.GetKeys()[0] }
	byNodeIdle := func(r *trainmeterv1.UsageRow) string {
		if r.GetIdle() {
			return r.GetKeys()[0] + " (idle)"
		}
		return r.GetKeys()[0]
	}
	seen := map[string]bool{}
	for _, p := range d.Panels {
		if p.Datasource.Type != "grafana-postgresql-datasource" || p.Datasource.UID != "${datasource}" || len(p.Targets) != 1 {
			t.Errorf("panel %q: datasource %v, %d targets; want the datasource variable, one target", p.Title, p.Datasource, len(p.Targets))
			continue
		}
		sql := grafanaSQL(p.Targets[0].RawSQL, from, to, vars["label"])
		rows, err := db.Query(ctx, sql)
		if err != nil {
			t.Errorf("panel %q: %v\n%s", p.Title, err, sql)
			continue
		}
		got, err := pgx.CollectRows(rows, pgx.RowToMap)
		if err != nil {
			t.Errorf("panel %q: %v\n%s", p.Title, err, sql)
			continue
		}
		if len(got) == 0 {
			t.Errorf("panel %q: no rows", p.Title)
			continue
		}
		seen[p.Title] = true
		// timeSeries is a time_series panel's rows as "day|metric".
		timeSeries := func(col string, scale float64) map[string]figures {
			out := map[string]figures{}
			for _, r := range got {
				k := r["time"].(time.Time).UTC().Format(time.DateOnly) + "|" + r["metric"].(string)
				f := figures{runs: -1}
				switch col {
				case "cost_usd":
					if v, ok := r[col].(float64); ok {
						f.cost = &v
					}
				case "gpu_hours":
					f.gpuS = r[col].(float64) * scale
				case "energy_kwh":
					f.energyJ = r[col].(float64) * scale
				}
				out[k] = f
			}
			return out
		}
		only := func(m map[string]figures, col string) map[string]figures {
			for k, f := range m {
				switch col {
				case "cost_usd":
					f.gpuS, f.energyJ = 0, 0
				case "gpu_hours":
					f.energyJ, f.cost = 0, nil
				case "energy_kwh":
					f.gpuS, f.cost = 0, nil
				}
				m[k] = f
			}
			return m
		}
		switch p.Title {
		case "Cost by user per day":
			compareFigures(t, p.Title, timeSeries("cost_usd", 1), only(perDay("user", first), "cost_usd"))
		case "GPU-hours by label per day":
			compareFigures(t, p.Title, timeSeries("gpu_hours", 3600), only(perDay("label:team", first), "gpu_hours"))
		case "Energy by node per day":
			compareFigures(t, p.Title, timeSeries("energy_kwh", 3.6e6), only(perDay("node", byNodeIdle), "energy_kwh"))
		case "Nodes: GPU-hours, idle and cost":
			want, gotN := map[string]figures{}, map[string]figures{}
			for _, day := range sqlDays {
				u := usageDay(t, q, day)
				for _, n := range u.GetNodes() {
					f := want[n.GetNode()]
					f.gpuS += n.GetGpuSeconds()
					f.energyJ += n.GetIdleGpuSeconds()
					f.runs = -1
					want[n.GetNode()] = f
				}
			}
			for _, r := range got {
				gotN[r["node"].(string)] = figures{gpuS: r["gpu_hours"].(float64) * 3600, energyJ: r["idle_gpu_hours"].(float64) * 3600, runs: -1}
			}
			compareFigures(t, p.Title, gotN, want)
		case "Runs":
			if len(got) != 4 {
				t.Errorf("%s: %d rows, want the 4 runs", p.Title, len(got))
			}
			for _, row := range got {
				resp, err := q.GetRun(ctx, &trainmeterv1.GetRunRequest{RunId: row["run_id"].(string)})
				if err != nil {
					t.Fatal(err)
				}
				r := resp.GetRun()
				cost, _ := row["total_cost_usd"].(float64)
				if row["tokens"].(int64) != int64(r.GetTokensProcessed()) || row["energy_j"].(float64) != r.GetEnergyJ() ||
					row["gpu_hours"].(float64) != r.GetGpuHours() || cost != r.GetTotalCostUsd() {
					t.Errorf("%s %s: %v; report --json: %d tokens, %v J, %v GPU-h, $%v", p.Title, r.GetRunId(), row,
						r.GetTokensProcessed(), r.GetEnergyJ(), r.GetGpuHours(), r.GetTotalCostUsd())
				}
			}
		case "Total cost":
			var total float64
			for _, day := range sqlDays {
				for _, r := range usageDay(t, q, day).GetRows() {
					total += r.GetCostUsd()
				}
			}
			if c, ok := got[0]["cost_usd"].(float64); !ok || !near(c, total) {
				t.Errorf("%s: %v, usage's rows add to %v", p.Title, got[0]["cost_usd"], total)
			}
		default:
			t.Errorf("panel %q: no check in this test: add one", p.Title)
		}
	}
	if len(seen) != len(d.Panels) {
		t.Errorf("%d of %d panels answered", len(seen), len(d.Panels))
	}
}

package console

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pg "github.com/trainmeter/trainmeter/collector/internal/page"
	"github.com/trainmeter/trainmeter/collector/internal/query"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// The home page (fleet overview) reads the same services as the CLI:
// Usage (`trainmeter usage`) for the fleet now and the spend, ListRuns
// (`runs`) for live and costly runs, ListBudgets and ListAlerts (`budget
// list`, `alerts`). It only picks, sorts and sums their rows for display.

func init() {
	funcs["hours"] = func(s float64) float64 { return s / 3600 }
	funcs["kwh"] = func(j float64) float64 { return j / 3.6e6 }
	funcs["usageKey"] = usageKey
	funcs["runStatus"] = runStatus
	funcs["periods"] = func(s ...*spend) []*spend { return s }
	funcs["list"] = func(s ...string) []string { return s }
}

// nowWindow is the span "now" on the home page covers: each node's GPU
// time and energy over the last minute (batches arrive every few seconds,
// so the minute is covered but for the last batch in flight).
const nowWindow = time.Minute

// homeListLen bounds the home page's lists; each links to its full page.
const homeListLen = 8

// atRisk is the share of a budget (spent or projected) from which the home
// page lists it: the budgets' warning threshold (docs/budgets.md).
const atRisk = 0.75

// gpuNow is one GPU over the last nowWindow.
type gpuNow struct {
	Name       string // node/index
	Busy       bool   // runs used most of its time
	RunSeconds float64
	IdleSecs   float64
}

// nodeNow is one node over the last nowWindow.
type nodeNow struct {
	Node      string
	Connected bool
	GPUs      []gpuNow
	Busy      int
	// PowerW is the node's GPU power over the window (energy ÷ the time
	// its GPUs covered); Has false when it sent nothing in the window.
	PowerW float64
	Has    bool
}

// spend is the Usage RPC's answer over one period, split one way.
type spend struct {
	Name         string // "this month", "last 24 h"
	Since, Until time.Time
	Rows         []*trainmeterv1.UsageRow
	GPUSeconds   float64 // the nodes' totals
	EnergyJ      float64
	IdleSeconds  float64
	IdleShare    float64
	HasIdle      bool
	CostUSD      float64
	CostKnown    bool
	Link         string // the same on /usage
}

type homeData struct {
	Now        time.Time
	By         string   // the split: "label:team", "user", ...
	Splits     []string // the splits offered
	Nodes      []nodeNow
	BusyGPUs   int
	GPUs       int
	PowerW     float64
	Month, Day *spend
	Budgets    []*trainmeterv1.BudgetStatus
	Live       []*trainmeterv1.RunReport
	LiveTotal  int
	Costliest  []*trainmeterv1.RunReport
	Alerts     []*trainmeterv1.Alert
	AlertTotal int
	Errors     []string // parts that could not be read (the rest shows)
}

// monthStart is the first instant of t's month, UTC (budgets' monthly
// periods are UTC months too).
func monthStart(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// usageLink is /usage for a period and a split.
func usageLink(by string, since, until time.Time) string {
	v := url.Values{"by": {by}, "since": {since.UTC().Format(time.RFC3339)}}
	if !until.IsZero() {
		v.Set("until", until.UTC().Format(time.RFC3339))
	}
	return "/usage?" + v.Encode()
}

func (p *pages) home(w http.ResponseWriter, r *http.Request) {
	d, err := p.homeData(r.Context(), r.URL.Query().Get("by"))
	if err != nil {
		p.fail(w, r, "home", err)
		return
	}
	p.render(w, http.StatusOK, "home.html", page{Title: "Fleet", Nav: "home", Data: d})
}

func (p *pages) homeData(ctx context.Context, by string) (*homeData, error) {
	now := p.c.cfg.Clock.Now()
	d := &homeData{Now: now, By: by}
	if d.By != "" {
		if err := checkUsageBy(d.By); err != nil {
			return nil, err
		}
	}
	// The services' calls are independent, so they run at once: the runs,
	// the fleet now, and the two periods' spend. The split offered by
	// default is label:team when the month's runs carry a team label (the
	// month's Usage answer says which label keys they carry), else user:
	// the spend is asked by label:team first and again by user when no
	// run of the month has a team.
	var (
		wg               sync.WaitGroup
		runsErr, nErr    error
		monthErr, dayErr error
		monthKeys        []string
	)
	ms := monthStart(now)
	periods := func(by string) {
		wg.Go(func() { d.Month, monthKeys, monthErr = p.spend(ctx, "this month", by, ms, now) })
		wg.Go(func() { d.Day, _, dayErr = p.spend(ctx, "last 24 h", by, now.Add(-24*time.Hour), now) })
	}
	wg.Go(func() { runsErr = p.homeRuns(ctx, d, ms) })
	wg.Go(func() { nErr = p.fleetNow(ctx, d, now) })
	guess := cmp.Or(d.By, "label:team")
	periods(guess)
	wg.Wait()
	if err := cmp.Or(runsErr, monthErr, dayErr); err != nil {
		return nil, err
	}
	if nErr != nil {
		d.Errors = append(d.Errors, "fleet now: "+nErr.Error())
	}
	d.Splits = splitsOfKeys(monthKeys)
	if d.By == "" {
		d.By = "label:team"
		if !slices.Contains(d.Splits, "label:team") {
			d.By = "user"
			periods(d.By)
			wg.Wait()
			if err := cmp.Or(monthErr, dayErr); err != nil {
				return nil, err
			}
		}
	}
	if !slices.Contains(d.Splits, d.By) {
		d.Splits = append(d.Splits, d.By)
	}
	if b, err := p.c.cfg.Services.Budgets.ListBudgets(ctx, &trainmeterv1.ListBudgetsRequest{}); err != nil {
		d.Errors = append(d.Errors, "budgets: "+err.Error())
	} else {
		for _, s := range b.GetBudgets() {
			if max(s.GetRatio(), s.GetProjectedRatio()) >= atRisk {
				d.Budgets = append(d.Budgets, s)
			}
		}
		slices.SortStableFunc(d.Budgets, func(a, b *trainmeterv1.BudgetStatus) int {
			return cmp.Compare(max(b.GetRatio(), b.GetProjectedRatio()), max(a.GetRatio(), a.GetProjectedRatio()))
		})
	}
	alerts, err := pg.All(func(tok string) ([]*trainmeterv1.Alert, string, error) {
		a, err := p.c.cfg.Services.Budgets.ListAlerts(ctx, &trainmeterv1.ListAlertsRequest{PageToken: tok})
		return a.GetAlerts(), a.GetNextPageToken(), err
	})
	if err != nil {
		d.Errors = append(d.Errors, "alerts: "+err.Error())
	}
	slices.SortStableFunc(alerts, func(x, y *trainmeterv1.Alert) int { return y.GetTime().AsTime().Compare(x.GetTime().AsTime()) })
	d.AlertTotal = len(alerts)
	d.Alerts = alerts[:min(len(alerts), homeListLen)]
	return d, nil
}

// splitsOfKeys is the groupings the home page and /usage offer: every
// label key the period's runs carry (label:team first when there is one),
// user, model and node.
func splitsOfKeys(keys []string) []string {
	var labels []string
	for _, k := range keys {
		labels = append(labels, "label:"+k)
	}
	slices.SortFunc(labels, func(a, b string) int {
		if (a == "label:team") != (b == "label:team") {
			if a == "label:team" {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return append(labels, "user", "model", "node")
}

// fleetNow fills the nodes' GPUs busy or idle and their power over the
// last nowWindow, from the Usage RPC by GPU.
func (p *pages) fleetNow(ctx context.Context, d *homeData, now time.Time) error {
	nodes, err := pg.All(func(tok string) ([]*trainmeterv1.NodeStatus, string, error) {
		resp, err := p.c.cfg.Services.Query.ListNodes(ctx, &trainmeterv1.ListNodesRequest{PageToken: tok})
		return resp.GetNodes(), resp.GetNextPageToken(), err
	})
	if err != nil {
		return err
	}
	u, err := p.c.cfg.Services.Query.Usage(ctx, &trainmeterv1.UsageRequest{
		Since: timestamppb.New(now.Add(-nowWindow)), Until: timestamppb.New(now), By: []string{"gpu"},
	})
	if err != nil {
		return err
	}
	run, idle := map[string]float64{}, map[string]float64{}
	for _, row := range u.GetRows() {
		if len(row.GetKeys()) != 1 {
			continue
		}
		if row.GetIdle() {
			idle[row.GetKeys()[0]] += row.GetGpuSeconds()
		} else {
			run[row.GetKeys()[0]] += row.GetGpuSeconds()
		}
	}
	totals := map[string]*trainmeterv1.NodeUsage{}
	for _, n := range u.GetNodes() {
		totals[n.GetNode()] = n
	}
	for _, n := range nodes {
		nn := nodeNow{Node: n.GetNode(), Connected: n.GetConnected()}
		for _, g := range n.GetGpus() {
			key := n.GetNode() + "/" + strconv.FormatUint(uint64(g.GetIndex()), 10)
			gn := gpuNow{Name: key, RunSeconds: run[key], IdleSecs: idle[key]}
			gn.Busy = gn.RunSeconds > 0 && gn.RunSeconds >= gn.IdleSecs
			if gn.Busy {
				nn.Busy++
			}
			nn.GPUs = append(nn.GPUs, gn)
		}
		if t := totals[n.GetNode()]; t.GetGpuSeconds() > 0 && len(n.GetGpus()) > 0 {
			nn.PowerW = t.GetEnergyJ() / (t.GetGpuSeconds() / float64(len(n.GetGpus())))
			nn.Has = true
			d.PowerW += nn.PowerW
		}
		d.BusyGPUs += nn.Busy
		d.GPUs += len(nn.GPUs)
		d.Nodes = append(d.Nodes, nn)
	}
	return nil
}

// spend is the Usage RPC over [since, until) split by by, with the nodes'
// totals, idle's share and the rows' cost summed (unknown when a row's is).
func (p *pages) spend(ctx context.Context, name, by string, since, until time.Time) (*spend, []string, error) {
	u, err := p.c.cfg.Services.Query.Usage(ctx, &trainmeterv1.UsageRequest{
		Since: timestamppb.New(since), Until: timestamppb.New(until), By: []string{by},
	})
	if err != nil {
		return nil, nil, err
	}
	s := &spend{Name: name, Since: since, Until: until, Rows: u.GetRows(), CostKnown: true, Link: usageLink(by, since, until)}
	for _, n := range u.GetNodes() {
		s.GPUSeconds += n.GetGpuSeconds()
		s.EnergyJ += n.GetEnergyJ()
		s.IdleSeconds += n.GetIdleGpuSeconds()
	}
	if s.GPUSeconds > 0 {
		s.IdleShare, s.HasIdle = s.IdleSeconds/s.GPUSeconds, true
	}
	for _, r := range s.Rows {
		if r.CostUsd == nil {
			s.CostKnown = false
		}
		s.CostUSD += r.GetCostUsd()
	}
	// Costliest first; idle and deleted rows keep their place at the end.
	slices.SortStableFunc(s.Rows, func(a, b *trainmeterv1.UsageRow) int {
		if a.GetIdle() != b.GetIdle() || a.GetDeleted() != b.GetDeleted() {
			return 0
		}
		return cmp.Compare(b.GetCostUsd(), a.GetCostUsd())
	})
	return s, u.GetLabelKeys(), nil
}

// homeRuns fills the live runs (newest first) and the costliest runs of
// the month (any run live or ended since the month began; its whole cost,
// unknown left out). The collector selects both (ListRuns live_only;
// active_since with the cost order), so only those runs are read.
func (p *pages) homeRuns(ctx context.Context, d *homeData, ms time.Time) error {
	live, err := pg.All(func(tok string) ([]*trainmeterv1.RunReport, string, error) {
		resp, err := p.c.cfg.Services.Query.ListRuns(ctx, &trainmeterv1.ListRunsRequest{LiveOnly: true, PageToken: tok})
		return resp.GetRuns(), resp.GetNextPageToken(), err
	})
	if err != nil {
		return err
	}
	costly, err := p.c.cfg.Services.Query.ListRuns(ctx, &trainmeterv1.ListRunsRequest{
		ActiveSince: timestamppb.New(ms), Order: trainmeterv1.RunOrder_RUN_ORDER_COST_DESC, PageSize: homeListLen,
	})
	if err != nil {
		return err
	}
	slices.SortStableFunc(live, func(a, b *trainmeterv1.RunReport) int {
		return cmp.Or(b.GetStart().AsTime().Compare(a.GetStart().AsTime()), cmp.Compare(a.GetRunId(), b.GetRunId()))
	})
	// The collector orders by each run's cost as of its last batch; the
	// page shows (and orders by) the cost of the reports it got.
	month := slices.DeleteFunc(costly.GetRuns(), func(r *trainmeterv1.RunReport) bool { return r.TotalCostUsd == nil })
	slices.SortStableFunc(month, func(a, b *trainmeterv1.RunReport) int {
		return cmp.Or(cmp.Compare(b.GetTotalCostUsd(), a.GetTotalCostUsd()), cmp.Compare(a.GetRunId(), b.GetRunId()))
	})
	d.LiveTotal = len(live)
	d.Live = live[:min(len(live), homeListLen)]
	d.Costliest = month[:min(len(month), homeListLen)]
	return nil
}

// checkUsageBy refuses a grouping the Usage RPC would refuse, as a bad
// request, before any call.
func checkUsageBy(by string) error {
	switch {
	case by == "node", by == "gpu", by == "model", by == "user":
		return nil
	case strings.HasPrefix(by, "label:") && len(by) > len("label:"):
		return nil
	}
	return fmt.Errorf("%w: by %q: use node, gpu, model, user or label:KEY", errBadRequest, by)
}

// usageKey is a usage row's keys as a page shows them: an idle row names
// its node (as `trainmeter usage` does).
func usageKey(by string, r *trainmeterv1.UsageRow) string {
	k := strings.Join(r.GetKeys(), " · ")
	hw := slices.Contains(strings.Split(by, ","), "node") || slices.Contains(strings.Split(by, ","), "gpu")
	switch {
	case r.GetDeleted() && hw:
		return k + " (deleted)"
	case r.GetIdle() && hw:
		return k + " " + query.IdleKey
	case r.GetIdle():
		return k + " " + r.GetIdleNode()
	}
	return k
}

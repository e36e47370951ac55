package server_test

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trainmeter/trainmeter/collector/internal/query"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// usageBatch is one second of a node with two GPUs at 300 W: GPU 0 shared
// by runs a (2/3) and b (1/3), GPU 1 idle or used by run c.
func usageBatch(seq uint64, sec float64, gpu1Run string) *trainmeterv1.Batch {
	share := func(run string, g uint32, f float64, shared bool) *trainmeterv1.RunWindow {
		w := tu.Window(run, sec, 10, 300*f)
		w.Gpus = []uint32{g}
		w.GpuSeconds = f
		sh := &trainmeterv1.GpuShare{Gpu: g, EnergyCounterJ: 300 * f, CounterOk: true, EnergyIntegratedJ: 300 * f, GpuSeconds: f}
		w.ShareMethod, w.MaxSharingRuns = "exclusive", 1
		if shared {
			sh.SharedGpuSeconds, w.SharedGpuSeconds = 1, 1
			w.ShareMethod, w.MaxSharingRuns = "utilization", 2
		}
		w.GpuShares = []*trainmeterv1.GpuShare{sh}
		return w
	}
	ws := []*trainmeterv1.RunWindow{share("a", 0, 2.0/3, true), share("b", 0, 1.0/3, true)}
	gpu1 := &trainmeterv1.GpuWindow{Gpu: 1, EnergyCounterJ: 300, CounterOk: true, EnergyIntegratedJ: 300, GpuSeconds: 1, Samples: 20}
	if gpu1Run != "" {
		ws = append(ws, share(gpu1Run, 1, 1, false))
	} else {
		gpu1.IdleGpuSeconds, gpu1.IdleEnergyCounterJ, gpu1.IdleEnergyIntegratedJ = 1, 300, 300
	}
	b := tu.Batch(seq, sec, ws)
	b.GpuWindows = []*trainmeterv1.GpuWindow{
		{Gpu: 0, EnergyCounterJ: 300, CounterOk: true, EnergyIntegratedJ: 300, GpuSeconds: 1, Samples: 20},
		gpu1,
	}
	return b
}

func startAs(run string, sec float64, model, user, team string) *trainmeterv1.RunEvent {
	e := tu.Start(run, sec, model)
	rs := e.GetRunStart()
	rs.User, rs.Uid = user, 1000
	if team != "" {
		rs.Labels = map[string]string{"team": team}
	}
	return e
}

func TestUsageRowsAddUpToTheNodes(t *testing.T) {
	srv := start(t, server.Config{GPUPricePerHour: usageGPUPrice, EnergyPricePerKWh: usageEnergyPrice})
	conn := tu.Dial(t, srv.Addr().String())
	q := trainmeterv1.NewQueryServiceClient(conn)
	n1 := tu.Connect(t, conn, "node-1", "boot-a")
	first := usageBatch(1, 0, "")
	first.RunEvents = []*trainmeterv1.RunEvent{startAs("a", 0, "llama", "alice", "nlp"), startAs("b", 0, "llama", "bob", "")}
	n1.MustAck(first)
	n1.MustAck(usageBatch(2, 1, ""))
	n2 := tu.Connect(t, conn, "node-2", "boot-b")
	b := usageBatch(1, 1, "c")
	// node-2 runs ranks of a and b (they share its GPU 0) and all of c.
	b.RunEvents = []*trainmeterv1.RunEvent{startAs("a", 1, "llama", "alice", "nlp"), startAs("b", 1, "llama", "bob", ""),
		startAs("c", 1, "bert", "carol", "vision")}
	n2.MustAck(b)

	usage := func(by ...string) *trainmeterv1.UsageResponse {
		t.Helper()
		resp, err := q.Usage(t.Context(), &trainmeterv1.UsageRequest{By: by})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	var nodeS, nodeJ float64
	resp := usage()
	for _, n := range resp.GetNodes() {
		nodeS += n.GetGpuSeconds()
		nodeJ += n.GetEnergyJ()
	}
	// 3 node-seconds x 2 GPUs at 300 W.
	if math.Abs(nodeS-6) > 1e-9 || math.Abs(nodeJ-1800) > 1e-6 {
		t.Fatalf("node totals %.3f GPU-s, %.3f J; want 6, 1800", nodeS, nodeJ)
	}
	// The label keys of the period's runs: the groupings that split it.
	if k := resp.GetLabelKeys(); len(k) != 1 || k[0] != "team" {
		t.Errorf("label keys %q, want [team]", k)
	}
	for _, by := range [][]string{{"node"}, {"gpu"}, {"model"}, {"user"}, {"label:team"}, {"node", "user"}} {
		resp := usage(by...)
		checkUsageConserved(t, resp)
		var s, j, share, usd float64
		idle := map[string]float64{}
		rows := map[string]*trainmeterv1.UsageRow{}
		for _, r := range resp.GetRows() {
			s += r.GetGpuSeconds()
			j += r.GetEnergyJ()
			share += r.GetEnergyShare()
			usd += r.GetCostUsd()
			if r.GetIdle() {
				idle[r.GetIdleNode()] += r.GetGpuSeconds()
			}
			rows[strings.Join(r.GetKeys(), "|")+"|"+r.GetIdleNode()] = r
		}
		if math.Abs(s-nodeS) > 1e-9 || math.Abs(j-nodeJ) > 1e-6 || math.Abs(share-1) > 1e-9 {
			t.Errorf("by %v: rows %.6f GPU-s, %.6f J, energy shares %.6f; nodes %.6f GPU-s, %.6f J", by, s, j, share, nodeS, nodeJ)
		}
		// node-1's GPU 1 idled 2 s; node-2 had no idle GPU time.
		if math.Abs(idle["node-1"]-2) > 1e-9 || idle["node-2"] != 0 {
			t.Errorf("by %v: idle %v", by, idle)
		}
		// 6 GPU-s at $3.6/h plus 1800 J at $0.2/kWh.
		if want := 6*0.001 + 1800/3.6e6*0.2; math.Abs(usd-want) > 1e-9 {
			t.Errorf("by %v: cost %.9f, want %.9f", by, usd, want)
		}
		switch by[0] {
		case "user":
			if r := rows["alice|"]; r == nil || math.Abs(r.GetGpuSeconds()-2) > 1e-9 || r.GetRuns() != 1 {
				t.Errorf("alice: %v", r)
			}
			if r := rows["(idle)|node-1"]; r == nil {
				t.Errorf("no idle row for node-1: %v", rows)
			}
		case "label:team":
			// b has no team label.
			if r := rows["(unlabeled)|"]; r == nil || math.Abs(r.GetGpuSeconds()-1) > 1e-9 {
				t.Errorf("unlabeled: %v", r)
			}
		case "gpu":
			if r := rows["node-1/0|"]; r == nil || math.Abs(r.GetEnergyJ()-600) > 1e-6 || r.GetRuns() != 2 {
				t.Errorf("node-1/0: %v", r)
			}
		}
	}

	// The period selects windows by their start.
	resp, err := q.Usage(t.Context(), &trainmeterv1.UsageRequest{Since: tu.TS(1), Until: tu.TS(2)})
	if err != nil {
		t.Fatal(err)
	}
	var s float64
	for _, r := range resp.GetRows() {
		s += r.GetGpuSeconds()
	}
	if math.Abs(s-4) > 1e-9 {
		t.Errorf("[1 s, 2 s): %.3f GPU-s, want 4", s)
	}
	_, err = q.Usage(t.Context(), &trainmeterv1.UsageRequest{By: []string{"team"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "label:KEY") {
		t.Errorf("bad --by: %v", err)
	}
}

// A node whose agent dropped batches: usage shows what they held for the
// node (every GPU, CPU+DRAM, with the idle parts) beside its totals, once
// (a re-sent carrier, an in-doubt record of a batch that arrived: not
// again), in the period the dropped data began in.
func TestUsageShowsTheNodesDroppedBatches(t *testing.T) {
	srv := start(t, server.Config{})
	conn := tu.Dial(t, srv.Addr().String())
	q := trainmeterv1.NewQueryServiceClient(conn)
	n := tu.Connect(t, conn, "node-1", "boot-a")
	n.MustAck(usageBatch(1, 0, ""))
	// Batches 2..4 (seconds 1..3) were dropped; 2 and 3 for sure, 4 after
	// it was sent, and the in-doubt record of batch 1, which arrived.
	carrier := usageBatch(5, 4, "")
	carrier.NodeLosses = []*trainmeterv1.DataLoss{
		{Batches: 2, EnergyJ: 1200, GpuSeconds: 4, HostEnergyJ: 90, IdleEnergyJ: 600, IdleGpuSeconds: 2, IdleHostEnergyJ: 30,
			Reason: "spool full", FirstWindowStart: tu.TS(1)},
		{Batches: 1, EnergyJ: 600, GpuSeconds: 2, HostEnergyJ: 45, IdleEnergyJ: 300, IdleGpuSeconds: 1, IdleHostEnergyJ: 15,
			Reason: "spool full", Seq: 4, WindowStart: tu.TS(3), FirstWindowStart: tu.TS(3)},
		{Batches: 1, EnergyJ: 600, GpuSeconds: 2, HostEnergyJ: 45, IdleEnergyJ: 300, IdleGpuSeconds: 1, IdleHostEnergyJ: 15,
			Reason: "spool full", Seq: 1, WindowStart: tu.TS(0), FirstWindowStart: tu.TS(0)},
	}
	n.MustAck(carrier)
	n.MustAck(carrier) // re-sent: deduplicated with the batch

	usage := func(req *trainmeterv1.UsageRequest) *trainmeterv1.NodeUsage {
		t.Helper()
		resp, err := q.Usage(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetNodes()) != 1 {
			t.Fatalf("nodes %v", resp.GetNodes())
		}
		return resp.GetNodes()[0]
	}
	got := usage(&trainmeterv1.UsageRequest{})
	if got.GetLostBatches() != 3 || got.GetLostEnergyJ() != 1800 || got.GetLostGpuSeconds() != 6 || got.GetLostHostEnergyJ() != 135 ||
		got.GetLostIdleEnergyJ() != 900 || got.GetLostIdleGpuSeconds() != 3 || got.GetLostIdleHostEnergyJ() != 45 {
		t.Errorf("node's lost figures: %v", got)
	}
	// The figures themselves are what arrived: batches 1 and 5.
	if got.GetEnergyJ() != 1200 || got.GetGpuSeconds() != 4 {
		t.Errorf("node totals %v J, %v GPU-s; want the 1200 and 4 that arrived", got.GetEnergyJ(), got.GetGpuSeconds())
	}
	// From second 2 on: only the loss that began at second 3.
	got = usage(&trainmeterv1.UsageRequest{Since: tu.TS(2)})
	if got.GetLostBatches() != 1 || got.GetLostEnergyJ() != 600 || got.GetLostIdleHostEnergyJ() != 15 {
		t.Errorf("since second 2, the node's lost figures: %v", got)
	}
}

// Usage charged at one GPU price and one energy price: the dollars of a
// node are its GPU time and energy at them.
const (
	usageGPUPrice    = 3.6 // $/GPU-hour: $0.001 a GPU-second
	usageEnergyPrice = 0.2 // $/kWh
)

// usageNodeOf is the node a row belongs to where the rows are grouped by
// node or GPU ("" otherwise): an idle row's node, or the node its key names.
func usageNodeOf(resp *trainmeterv1.UsageResponse, r *trainmeterv1.UsageRow) string {
	if r.GetIdle() {
		return r.GetIdleNode()
	}
	for i, b := range resp.GetBy() {
		switch b {
		case "node":
			return r.GetKeys()[i]
		case "gpu":
			k := r.GetKeys()[i]
			return k[:strings.LastIndex(k, "/")]
		}
	}
	return ""
}

// checkUsageConserved: the rows add up to the nodes' totals in GPU-seconds,
// joules and dollars (at usageGPUPrice and usageEnergyPrice), over all
// nodes and, where the rows are grouped by node or GPU, node by node; the
// idle rows add up to the nodes' idle figures.
func checkUsageConserved(t *testing.T, resp *trainmeterv1.UsageResponse) {
	t.Helper()
	type fig struct{ s, j, usd, idleS, idleJ float64 }
	rows, nodes := map[string]*fig{}, map[string]*fig{}
	var all, allNodes fig
	perNode := false
	for _, r := range resp.GetRows() {
		if r.CostUsd == nil {
			t.Errorf("by %v: row %v has no cost", resp.GetBy(), r.GetKeys())
		}
		all.s += r.GetGpuSeconds()
		all.j += r.GetEnergyJ()
		all.usd += r.GetCostUsd()
		n := usageNodeOf(resp, r)
		perNode = perNode || (n != "" && !r.GetIdle())
		if rows[n] == nil {
			rows[n] = &fig{}
		}
		f := rows[n]
		f.s += r.GetGpuSeconds()
		f.j += r.GetEnergyJ()
		f.usd += r.GetCostUsd()
		if r.GetIdle() {
			f.idleS += r.GetGpuSeconds()
			f.idleJ += r.GetEnergyJ()
		}
	}
	for _, n := range resp.GetNodes() {
		f := &fig{n.GetGpuSeconds(), n.GetEnergyJ(), n.GetGpuSeconds()/3600*usageGPUPrice + n.GetEnergyJ()/3.6e6*usageEnergyPrice,
			n.GetIdleGpuSeconds(), n.GetIdleEnergyJ()}
		nodes[n.GetNode()] = f
		allNodes.s += f.s
		allNodes.j += f.j
		allNodes.usd += f.usd
	}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }
	if !near(all.s, allNodes.s) || !near(all.j, allNodes.j) || !near(all.usd, allNodes.usd) {
		t.Errorf("by %v: rows %.6f GPU-s, %.6f J, $%.9f; nodes %.6f GPU-s, %.6f J, $%.9f",
			resp.GetBy(), all.s, all.j, all.usd, allNodes.s, allNodes.j, allNodes.usd)
	}
	for name, n := range nodes {
		f := rows[name]
		if f == nil {
			f = &fig{}
		}
		if !near(f.idleS, n.idleS) || !near(f.idleJ, n.idleJ) {
			t.Errorf("by %v: %s's idle rows %.6f GPU-s, %.6f J; its idle %.6f GPU-s, %.6f J", resp.GetBy(), name, f.idleS, f.idleJ, n.idleS, n.idleJ)
		}
		if perNode && (!near(f.s, n.s) || !near(f.j, n.j) || !near(f.usd, n.usd)) {
			t.Errorf("by %v: %s's rows %.6f GPU-s, %.6f J, $%.9f; the node %.6f GPU-s, %.6f J, $%.9f",
				resp.GetBy(), name, f.s, f.j, f.usd, n.s, n.j, n.usd)
		}
	}
}

// wideBatch is one second of node-1: GPU 0 at 300 W shared equally by runs
// wide and narrow (narrow ""), GPU 0's half idle), GPU 1 at 200 W wide's
// alone. wide's window has two GPU shares: 150 J and 200 J, not 350 J each.
func wideBatch(seq uint64, sec float64, narrow string) *trainmeterv1.Batch {
	wide := tu.Window("wide", sec, 10, 350)
	wide.Gpus, wide.GpuSeconds, wide.SharedGpuSeconds = []uint32{0, 1}, 1.5, 1
	wide.ShareMethod, wide.MaxSharingRuns = "equal", 2
	wide.GpuShares = []*trainmeterv1.GpuShare{
		{Gpu: 0, EnergyCounterJ: 150, CounterOk: true, EnergyIntegratedJ: 150, GpuSeconds: 0.5, SharedGpuSeconds: 1},
		{Gpu: 1, EnergyCounterJ: 200, CounterOk: true, EnergyIntegratedJ: 200, GpuSeconds: 1},
	}
	ws := []*trainmeterv1.RunWindow{wide}
	gpu0 := &trainmeterv1.GpuWindow{Gpu: 0, EnergyCounterJ: 300, CounterOk: true, EnergyIntegratedJ: 300, GpuSeconds: 1, Samples: 20}
	if narrow != "" {
		w := tu.Window(narrow, sec, 10, 150)
		w.GpuSeconds, w.SharedGpuSeconds, w.ShareMethod, w.MaxSharingRuns = 0.5, 1, "equal", 2
		w.GpuShares = []*trainmeterv1.GpuShare{{Gpu: 0, EnergyCounterJ: 150, CounterOk: true, EnergyIntegratedJ: 150, GpuSeconds: 0.5, SharedGpuSeconds: 1}}
		ws = append(ws, w)
	} else {
		gpu0.IdleGpuSeconds, gpu0.IdleEnergyCounterJ, gpu0.IdleEnergyIntegratedJ = 0.5, 150, 150
	}
	b := tu.Batch(seq, sec, ws)
	b.GpuWindows = []*trainmeterv1.GpuWindow{gpu0,
		{Gpu: 1, EnergyCounterJ: 200, CounterOk: true, EnergyIntegratedJ: 200, GpuSeconds: 1, Samples: 20}}
	return b
}

// A run on two GPUs, one of them shared with another run, and a node whose
// agent came back from 5 s of downtime with no run on its GPU: grouped any
// way, the rows add up to the nodes in GPU-seconds, joules and dollars,
// node by node where grouped by node or GPU. Each GPU share is booked its
// own energy (not its window's), and the downtime's idle GPU time is idle.
func TestUsageRowsAddUpAcrossGPUSharesAndDowntime(t *testing.T) {
	srv := start(t, server.Config{GPUPricePerHour: usageGPUPrice, EnergyPricePerKWh: usageEnergyPrice})
	conn := tu.Dial(t, srv.Addr().String())
	q := trainmeterv1.NewQueryServiceClient(conn)
	n1 := tu.Connect(t, conn, "node-1", "boot-a")
	first := wideBatch(1, 0, "narrow")
	first.RunEvents = []*trainmeterv1.RunEvent{startAs("wide", 0, "llama", "alice", "nlp"), startAs("narrow", 0, "bert", "bob", "")}
	n1.MustAck(first)
	n1.MustAck(wideBatch(2, 1, "narrow"))
	// node-2's agent was down 5 s before its first window: 100 W, no run.
	n2 := tu.Connect(t, conn, "node-2", "boot-b")
	b := tu.Batch(1, 1, nil)
	b.GpuWindows = []*trainmeterv1.GpuWindow{{Gpu: 0, EnergyCounterJ: 100, CounterOk: true, EnergyIntegratedJ: 100, GpuSeconds: 1, Samples: 20,
		IdleGpuSeconds: 1, IdleEnergyCounterJ: 100, IdleEnergyIntegratedJ: 100,
		DowntimeGpuSeconds: 5, DowntimeEnergyCounterJ: 500, DowntimeIdleGpuSeconds: 5, DowntimeIdleEnergyCounterJ: 500}}
	n2.MustAck(b)

	usage := func(by ...string) *trainmeterv1.UsageResponse {
		t.Helper()
		resp, err := q.Usage(t.Context(), &trainmeterv1.UsageRequest{By: by})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	nodes := map[string]*trainmeterv1.NodeUsage{}
	for _, n := range usage().GetNodes() {
		nodes[n.GetNode()] = n
	}
	// node-1: 2 s of two GPUs, 500 W; node-2: 6 s of one GPU at 100 W, idle.
	if n := nodes["node-1"]; n.GetGpuSeconds() != 4 || n.GetEnergyJ() != 1000 || n.GetIdleGpuSeconds() != 0 {
		t.Fatalf("node-1: %v", n)
	}
	if n := nodes["node-2"]; n.GetGpuSeconds() != 6 || n.GetEnergyJ() != 600 || n.GetIdleGpuSeconds() != 6 || n.GetIdleEnergyJ() != 600 {
		t.Fatalf("node-2: %v", n)
	}
	for _, by := range [][]string{{"node"}, {"gpu"}, {"model"}, {"user"}, {"label:team"}, {"node", "user"}, {"user", "gpu"}} {
		resp := usage(by...)
		checkUsageConserved(t, resp)
		rows := map[string]*trainmeterv1.UsageRow{}
		for _, r := range resp.GetRows() {
			rows[strings.Join(r.GetKeys(), "|")+"|"+r.GetIdleNode()] = r
		}
		switch strings.Join(by, ",") {
		case "gpu":
			// GPU 0: wide's and narrow's halves; GPU 1: wide's alone.
			if r := rows["node-1/0|"]; r == nil || r.GetEnergyJ() != 600 || r.GetGpuSeconds() != 2 || r.GetRuns() != 2 {
				t.Errorf("node-1/0: %v", r)
			}
			if r := rows["node-1/1|"]; r == nil || r.GetEnergyJ() != 400 || r.GetGpuSeconds() != 2 || r.GetRuns() != 1 {
				t.Errorf("node-1/1: %v", r)
			}
		case "user":
			if r := rows["alice|"]; r == nil || r.GetEnergyJ() != 700 || r.GetGpuSeconds() != 3 {
				t.Errorf("alice (wide): %v", r)
			}
			// The downtime is idle time like any other.
			if r := rows["(idle)|node-2"]; r == nil || r.GetGpuSeconds() != 6 || r.GetEnergyJ() != 600 || math.Abs(r.GetCostUsd()-(6*0.001+600/3.6e6*0.2)) > 1e-12 {
				t.Errorf("node-2's idle: %v", r)
			}
		}
	}
}

// Deleting a run removes its record, not the energy its node used: usage
// keeps the run's GPU time, energy and cost as a "(deleted)" row, so the
// rows still add up to the nodes, and the node's dollars are what they
// were. Both ways of deleting: an ended run (narrow), and a live run
// (wide, --force) whose agent goes on sending its windows afterwards.
func TestUsageKeepsDeletedRunsAsDeletedRows(t *testing.T) {
	srv := start(t, server.Config{GPUPricePerHour: usageGPUPrice, EnergyPricePerKWh: usageEnergyPrice})
	conn := tu.Dial(t, srv.Addr().String())
	q := trainmeterv1.NewQueryServiceClient(conn)
	n1 := tu.Connect(t, conn, "node-1", "boot-a")
	first := wideBatch(1, 0, "narrow")
	first.RunEvents = []*trainmeterv1.RunEvent{startAs("wide", 0, "llama", "alice", "nlp"), startAs("narrow", 0, "bert", "bob", "")}
	n1.MustAck(first)
	n1.MustAck(wideBatch(2, 1, "narrow"))
	third := wideBatch(3, 2, "narrow")
	third.RunEvents = []*trainmeterv1.RunEvent{tu.End("narrow", 3)}
	n1.MustAck(third)
	// node-2 keeps its run.
	n2 := tu.Connect(t, conn, "node-2", "boot-b")
	kept := usageBatch(1, 0, "kept")
	kept.RunEvents = []*trainmeterv1.RunEvent{startAs("a", 0, "llama", "alice", "nlp"), startAs("b", 0, "llama", "bob", ""), startAs("kept", 0, "bert", "carol", "")}
	n2.MustAck(kept)

	usage := func(by ...string) *trainmeterv1.UsageResponse {
		t.Helper()
		resp, err := q.Usage(t.Context(), &trainmeterv1.UsageRequest{By: by})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	nodeUSD := func(resp *trainmeterv1.UsageResponse) map[string]float64 {
		out := map[string]float64{}
		for _, r := range resp.GetRows() {
			out[usageNodeOf(resp, r)] += r.GetCostUsd()
		}
		return out
	}
	before := nodeUSD(usage("node"))

	if _, err := q.DeleteRun(t.Context(), &trainmeterv1.DeleteRunRequest{RunId: "narrow"}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.DeleteRun(t.Context(), &trainmeterv1.DeleteRunRequest{RunId: "wide", Force: true}); err != nil {
		t.Fatal(err)
	}
	after := nodeUSD(usage("node"))
	for n, usd := range before {
		if math.Abs(after[n]-usd) > 1e-12 {
			t.Errorf("%s's rows $%.9f after the deletes, $%.9f before", n, after[n], usd)
		}
	}
	// wide's agent goes on: a second more of it after its deletion.
	n1.MustAck(wideBatch(4, 3, ""))

	for _, by := range [][]string{{"node"}, {"gpu"}, {"model"}, {"user"}, {"label:team"}, {"node", "user"}} {
		checkUsageConserved(t, usage(by...))
	}
	// The deleted rows: narrow's 3 s of half GPU 0, wide's 4 s of half GPU
	// 0 and all GPU 1; no row names either run.
	deleted := func(by string) map[string]*trainmeterv1.UsageRow {
		out := map[string]*trainmeterv1.UsageRow{}
		for _, r := range usage(by).GetRows() {
			if r.GetDeleted() {
				out[strings.Join(r.GetKeys(), "|")] = r
			} else if !r.GetIdle() && r.GetKeys()[0] == "node-1" {
				t.Errorf("by %s: a run's row on node-1: %v", by, r)
			}
		}
		return out
	}
	want := func(by, key string, s, j float64, runs uint32) {
		t.Helper()
		r := deleted(by)[key]
		if r == nil || math.Abs(r.GetGpuSeconds()-s) > 1e-9 || math.Abs(r.GetEnergyJ()-j) > 1e-6 || r.GetRuns() != runs || r.GetIdle() ||
			math.Abs(r.GetCostUsd()-(s/3600*usageGPUPrice+j/3.6e6*usageEnergyPrice)) > 1e-12 {
			t.Errorf("by %s: deleted row %q %v; want %g GPU-s, %g J, %d runs", by, key, r, s, j, runs)
		}
	}
	want("node", "node-1", 7.5, 1850, 2)
	want("gpu", "node-1/0", 3.5, 1050, 2)
	want("gpu", "node-1/1", 4, 800, 1)
	want("user", query.DeletedKey, 7.5, 1850, 2)
	if d := deleted("node"); len(d) != 1 {
		t.Errorf("deleted rows by node: %v", d)
	}
}

// TestUsageSharesAreTheSameOnEveryQuery: the shares divide by the nodes'
// totals, whose floating-point sum depends on the order of its terms (0.1 +
// 0.2 + 0.3 is not 0.3 + 0.2 + 0.1): summed in node order, every query, on
// every collector, answers the same to the bit.
func TestUsageSharesAreTheSameOnEveryQuery(t *testing.T) {
	srv := start(t, server.Config{})
	conn := tu.Dial(t, srv.Addr().String())
	q := trainmeterv1.NewQueryServiceClient(conn)
	for i, e := range []float64{0.1, 0.2, 0.3, 0.7, 1.1, 0.01, 3.3, 0.03} {
		b := tu.Batch(1, 0, nil)
		b.GpuWindows = []*trainmeterv1.GpuWindow{{Gpu: 0, EnergyCounterJ: e, CounterOk: true, EnergyIntegratedJ: e, GpuSeconds: 1 + e, Samples: 20,
			IdleGpuSeconds: 1 + e, IdleEnergyCounterJ: e, IdleEnergyIntegratedJ: e}}
		tu.Connect(t, conn, fmt.Sprintf("node-%d", i), "boot").MustAck(b)
	}
	var first string
	for range 50 {
		resp, err := q.Usage(t.Context(), &trainmeterv1.UsageRequest{By: []string{"node"}})
		if err != nil {
			t.Fatal(err)
		}
		var shares []string
		for _, r := range resp.Rows {
			shares = append(shares, fmt.Sprintf("%v %b %b", r.Keys, r.GetGpuShare(), r.GetEnergyShare()))
		}
		if got := strings.Join(shares, "\n"); first == "" {
			first = got
		} else if got != first {
			t.Fatalf("shares differ between two queries:\n%s\nthen\n%s", first, got)
		}
	}
}

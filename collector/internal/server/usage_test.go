package server_test

import (
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	srv := start(t, server.Config{GPUPricePerHour: 3.6, EnergyPricePerKWh: 0.2})
	conn := tu.Dial(t, srv.Addr().String())
	q := trainmeterv1.NewQueryServiceClient(conn)
	n1 := tu.Connect(t, conn, "node-1", "boot-a")
	first := usageBatch(1, 0, "")
	first.RunEvents = []*trainmeterv1.RunEvent{startAs("a", 0, "llama", "alice", "nlp"), startAs("b", 0, "llama", "bob", "")}
	n1.MustAck(first)
	n1.MustAck(usageBatch(2, 1, ""))
	n2 := tu.Connect(t, conn, "node-2", "boot-b")
	b := usageBatch(1, 1, "c")
	b.RunEvents = []*trainmeterv1.RunEvent{startAs("a", 1, "llama", "alice", "nlp"), startAs("c", 1, "bert", "carol", "vision")}
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
	for _, by := range [][]string{{"node"}, {"gpu"}, {"model"}, {"user"}, {"label:team"}, {"node", "user"}} {
		resp := usage(by...)
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

package pgstore_test

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/ingest"
	"github.com/trainmeter/trainmeter/collector/internal/loadgen"
	"github.com/trainmeter/trainmeter/collector/internal/pgstore"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/query"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/pgtest"
	"github.com/trainmeter/trainmeter/internal/protojsonout"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// collector is one store behind the real ingest server (gRPC on loopback)
// and the query service the CLI reads, with the ingest server's live node
// status, as the collector wires them.
type collector struct {
	name string
	conn *grpc.ClientConn
	q    *query.Server
}

func serveCollector(t *testing.T, name string, st interface {
	storage.Store
	SetPricer(aggregate.Pricer)
}, pricing aggregate.Pricing) *collector {
	t.Helper()
	st.SetPricer(pricing)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ing := ingest.New(st, nil)
	ing.SetClock(tu.Clock())
	gs := grpc.NewServer()
	trainmeterv1.RegisterIngestServiceServer(gs, ing)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(func() {
		ing.Close()
		gs.Stop()
	})
	return &collector{name: name, conn: tu.Dial(t, lis.Addr().String()), q: query.New(st, ing, pricing)}
}

// twin is one agent stream (node, boot) opened to both collectors: every
// batch goes to both, and their answers must be the same.
type twin struct {
	t      *testing.T
	node   string
	agents [2]*tu.Agent
}

func (d *diff) connect(node, boot string) *twin {
	h := &trainmeterv1.Hello{Node: node, BootId: boot, AgentVersion: "test", GpuBackend: "sim",
		Gpus: []*trainmeterv1.GpuInfo{
			{Index: 0, Name: "Sim H100", MemoryTotalMib: 81559, HasEnergyCounter: true},
			{Index: 1, Name: "Sim H100", MemoryTotalMib: 81559, HasEnergyCounter: true},
		}}
	tw := &twin{t: d.t, node: node}
	for i, c := range d.cs {
		tw.agents[i] = tu.ConnectHello(d.t, c.conn, proto.Clone(h).(*trainmeterv1.Hello))
	}
	return tw
}

// send sends b to both collectors and fails unless they answer alike and,
// unless rejected, with an ack.
func (tw *twin) send(b *trainmeterv1.Batch) {
	tw.t.Helper()
	var resp [2]*trainmeterv1.StreamResponse
	for i, a := range tw.agents {
		r, err := a.Send(proto.Clone(b).(*trainmeterv1.Batch))
		if err != nil {
			tw.t.Fatalf("%s batch %d: %v", tw.node, b.GetSeq(), err)
		}
		resp[i] = r
	}
	if !proto.Equal(resp[0], resp[1]) {
		tw.t.Errorf("%s batch %d: BadgerDB answered %v, PostgreSQL %v", tw.node, b.GetSeq(), resp[0], resp[1])
	}
	if resp[0].GetAck().GetSeq() != b.GetSeq() {
		tw.t.Fatalf("%s batch %d: not acked: %v", tw.node, b.GetSeq(), resp[0])
	}
}

type diff struct {
	t  *testing.T
	cs [2]*collector
}

// both calls fn on each collector's query service and fails unless the
// answers, rendered as the CLI's --json renders them, are byte-identical
// (errors: the same message).
func both[M proto.Message](d *diff, what string, fn func(q *query.Server) (M, error)) M {
	d.t.Helper()
	var out [2]string
	var first M
	for i, c := range d.cs {
		m, err := fn(c.q)
		if err != nil {
			out[i] = "error: " + err.Error()
		} else {
			b, err := protojsonout.Indented(m)
			if err != nil {
				d.t.Fatal(err)
			}
			out[i] = string(b)
		}
		if i == 0 {
			first = m
		}
	}
	if out[0] != out[1] {
		d.t.Errorf("%s differs: %s", what, firstDiff(out[0], out[1]))
	}
	return first
}

// firstDiff shows where a and b part: the first line that differs, with
// the lines before it.
func firstDiff(a, b string) string {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	i := 0
	for i < len(la) && i < len(lb) && la[i] == lb[i] {
		i++
	}
	ctx := strings.Join(la[max(0, i-4):i], "\n")
	line := func(l []string) string {
		if i < len(l) {
			return l[i]
		}
		return "(end)"
	}
	return fmt.Sprintf("at line %d, after\n%s\nBadgerDB:   %s\nPostgreSQL: %s", i+1, ctx, line(la), line(lb))
}

// at is the stream's time base: second s of it.
func at(s int) time.Time { return tu.T0.Add(time.Duration(s) * time.Second) }

// batch is what the agent on a node of 2 GPUs sends for second s of run:
// loadgen's realistic batch (GPU, host and run windows), with the run's
// start carrying a user and labels when first.
func batch(seq uint64, s int, run string, first bool, user, team string) *trainmeterv1.Batch {
	b := loadgen.MakeBatch(seq, at(s), time.Second, run, 2, first)
	if first {
		rs := b.RunEvents[0].GetRunStart()
		rs.User, rs.Labels = user, map[string]string{"team": team}
	}
	return b
}

// withEval adds an evaluation of run at second s (accuracy: efficiency
// scores compare runs of one model by it).
func withEval(b *trainmeterv1.Batch, run string, s int, acc float64) *trainmeterv1.Batch {
	b.RunEvents = append(b.RunEvents, &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_Eval{Eval: &trainmeterv1.Eval{
		RunId: run, Time: timestamppb.New(at(s)), Accuracy: proto.Float64(acc), ValLoss: proto.Float64(1 - acc)}}})
	return b
}

// withHost adds the node's RAPL energy over b's window, shared by run.
func withHost(b *trainmeterv1.Batch, run string) *trainmeterv1.Batch {
	b.HostEnergy = append(b.HostEnergy, &trainmeterv1.HostEnergy{Start: b.WindowStart, End: b.WindowEnd,
		CpuEnergyJ: 180, DramEnergyJ: 40, DramOk: true, IdleCpuEnergyJ: 20,
		Runs: []*trainmeterv1.HostEnergyShare{{RunId: run, CpuEnergyJ: 160, DramEnergyJ: 40, Share: 1, Split: "exclusive"}}})
	return b
}

func withEnd(b *trainmeterv1.Batch, run string, s int) *trainmeterv1.Batch {
	b.RunEvents = append(b.RunEvents, &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunEnd{RunEnd: &trainmeterv1.RunEnd{
		RunId: run, Time: timestamppb.New(at(s)), EndStatus: "ok"}}})
	return b
}

// TestDifferential feeds one agent stream, through the real ingest server,
// to a BadgerDB collector and to a PostgreSQL one, both pricing by node,
// tariff band and priority: loadgen's realistic batches (2 GPUs, host
// windows) with a warmup window, raw samples, an invalid energy counter,
// RAPL host energy shares and evaluations; duplicates (on one stream and
// on a reconnected one), batches out of order, loss records (run and node)
// and an in-doubt batch arriving after its loss record, an agent restart
// (a second boot of one node, its sequence from 1 again), a run on two
// nodes, a live run deleted and then sent more data, a run repriced and a
// fleet repriced since a time. Both answer every batch alike, and every
// run's report (report --json), the run listing, the nodes' stored status, timelines, compare and
// usage in several groupings and periods are byte-identical as the CLI's
// --json renders them.
func TestDifferential(t *testing.T) {
	tariff, err := cost.ParseTariff([]byte(`{default: off, bands: {off: 0.1, peak: 0.3}, rules: [{from: "12:00", to: "12:01", band: peak}]}`))
	if err != nil {
		t.Fatal(err)
	}
	pricing := aggregate.Pricing{GPUPricePerHour: 2.5, NodeGPUPricePerHour: map[string]float64{"node-b": 3.1},
		Tariff: tariff, GridGCO2PerKWh: 400, PriorityMultipliers: map[string]float64{"high": 1.5}}
	clk := tu.Clock()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	bs, err := store.Open(t.TempDir(), store.Options{Logger: quiet, Clock: clk, EnergyBands: tariff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bs.Close() })
	ps, err := pgstore.Open(context.Background(), pgtest.DB(t), pgstore.Options{Logger: quiet, Clock: clk, EnergyBands: tariff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ps.Close() })
	d := &diff{t: t, cs: [2]*collector{serveCollector(t, "BadgerDB", bs, pricing), serveCollector(t, "PostgreSQL", ps, pricing)}}

	// node-a, boot 1: run r1 (alice, team vision).
	a1 := d.connect("node-a", "boot-1")
	a1.send(batch(1, 1, "r1", true, "alice", "vision"))
	for s := 2; s <= 4; s++ {
		bb := batch(uint64(s), s, "r1", false, "", "")
		switch s {
		case 2:
			bb.RunWindows[0].Phase = trainmeterv1.Phase_PHASE_WARMUP
		case 3:
			loadgen.AddRawSamples(bb, 20)
		case 4:
			bb.GpuWindows[1].CounterOk = false
			bb.RunWindows[0].CounterOk = false
		}
		a1.send(bb)
	}
	a1.send(batch(3, 3, "r1", false, "", "")) // an ack lost: resent
	// Out of order: 6 and 7 before 5 (a spool replayed after a reconnect).
	a1r := d.connect("node-a", "boot-1")
	a1r.send(batch(2, 2, "r1", false, "", "")) // resent on the new stream
	a1r.send(batch(6, 6, "r1", false, "", ""))
	a1r.send(batch(7, 7, "r1", false, "", ""))
	a1r.send(batch(5, 5, "r1", false, "", ""))
	// Batch 10 carries the losses: 8 never sent (spool full), and 9 sent
	// but unacked (in doubt): the collector does not hold it when the
	// record arrives, so it counts as lost, and its late arrival adds its
	// windows as well. The node's loss is its record of batch 8.
	b := batch(10, 10, "r1", false, "", "")
	b.Losses = []*trainmeterv1.DataLoss{
		{RunId: "r1", Batches: 1, Tokens: 65536, EnergyJ: 1100, GpuSeconds: 2, Reason: "spool full"},
		{RunId: "r1", Batches: 1, Tokens: 65536, EnergyJ: 1100, GpuSeconds: 2, Reason: "spool full", Seq: 9, WindowStart: timestamppb.New(at(8))},
	}
	b.NodeLosses = []*trainmeterv1.DataLoss{{Batches: 1, EnergyJ: 1100, GpuSeconds: 2, Reason: "spool full", FirstWindowStart: timestamppb.New(at(7))}}
	a1r.send(b)
	a1r.send(batch(9, 9, "r1", false, "", "")) // the in-doubt batch after all
	a1r.send(b)                                // and the loss batch again
	a1r.send(withEval(batch(12, 12, "r1", false, "", ""), "r1", 12, 0.61))

	// node-a restarts: boot 2, seq from 1, the same run goes on and ends.
	a2 := d.connect("node-a", "boot-2")
	for s := 14; s <= 18; s++ {
		bb := batch(uint64(s-13), s, "r1", false, "", "")
		if s == 18 {
			withEnd(bb, "r1", 18)
		}
		a2.send(bb)
	}
	a2.send(batch(2, 15, "r1", false, "", "")) // a late duplicate of boot 2

	// r2 on two nodes (bob, team nlp, priority high), node-b also resends
	// and reorders; r3 after it on node-b.
	nb, nc := d.connect("node-b", "b1"), d.connect("node-c", "c1")
	for s := 1; s <= 8; s++ {
		for _, tw := range []*twin{nb, nc} {
			bb := batch(uint64(s), s, "r2", s == 1, "bob", "nlp")
			if s == 1 {
				bb.RunEvents[0].GetRunStart().Labels["priority"] = "high"
			}
			withHost(bb, "r2")
			if s == 8 {
				withEnd(withEval(bb, "r2", 8, 0.64), "r2", 8)
			}
			if tw == nb && s == 4 {
				continue // sent after 6
			}
			tw.send(bb)
			if tw == nb && s == 6 {
				tw.send(batch(4, 4, "r2", false, "", ""))
				tw.send(bb)
			}
		}
	}
	for s := 9; s <= 12; s++ {
		bb := batch(uint64(s), s, "r3", s == 9, "carol", "vision")
		if s == 12 {
			withEnd(withEval(bb, "r3", 12, 0.58), "r3", 12)
		}
		nb.send(bb)
	}

	// r4 on node-c is deleted while live, then more of it arrives (usage
	// keeps it as the deleted run's).
	for s := 9; s <= 11; s++ {
		nc.send(batch(uint64(s), s, "r4", s == 9, "dave", "nlp"))
	}
	both(d, "delete-run --force r4", func(q *query.Server) (*trainmeterv1.DeleteRunResponse, error) {
		return q.DeleteRun(context.Background(), &trainmeterv1.DeleteRunRequest{RunId: "r4", Force: true})
	})
	for s := 12; s <= 13; s++ {
		nc.send(batch(uint64(s), s, "r4", false, "", ""))
	}

	// Reprice: one run, then every run since a time.
	both(d, "reprice --run r2", func(q *query.Server) (*trainmeterv1.RepriceResponse, error) {
		return q.Reprice(context.Background(), &trainmeterv1.RepriceRequest{RunId: "r2", UsdPerGpuHour: 4, Reason: "contract"})
	})
	both(d, "reprice --since", func(q *query.Server) (*trainmeterv1.RepriceResponse, error) {
		return q.Reprice(context.Background(), &trainmeterv1.RepriceRequest{Since: timestamppb.New(at(10)), UsdPerGpuHour: 3.3, Reason: "new rate"})
	})

	// Every run's report, as report --json prints it.
	list := both(d, "runs --json", func(q *query.Server) (*trainmeterv1.ListRunsResponse, error) {
		return q.ListRuns(context.Background(), &trainmeterv1.ListRunsRequest{})
	})
	var ids []string
	for _, r := range list.GetRuns() {
		ids = append(ids, r.GetRunId())
	}
	if len(ids) != 3 {
		t.Errorf("runs %v, want r1, r2, r3 (r4 deleted)", ids)
	}
	selectedRuns(d, list.GetRuns())
	for _, id := range append(ids, "r4") {
		r := both(d, "report "+id+" --json", func(q *query.Server) (*trainmeterv1.GetRunResponse, error) {
			return q.GetRun(context.Background(), &trainmeterv1.GetRunRequest{RunId: id})
		}).GetRun()
		// What the stream was to exercise, so that agreement is not vacuous.
		switch id {
		case "r1":
			if !r.GetIncomplete() || r.GetLostBatches() != 2 || r.GetNodes() != 1 {
				t.Errorf("r1: incomplete %v, lost %d batches, %d nodes; want a loss of 2 batches on 1 node", r.GetIncomplete(), r.GetLostBatches(), r.GetNodes())
			}
		case "r2":
			if r.GetNodes() != 2 || r.GetRepricedAt() == nil || r.EfficiencyScore == nil || r.CpuEnergyJ == nil {
				t.Errorf("r2: %d nodes, repriced at %v, efficiency %v, CPU energy %v; want 2 nodes, repriced, scored, with host energy",
					r.GetNodes(), r.GetRepricedAt(), r.EfficiencyScore, r.CpuEnergyJ)
			}
		}
	}

	for _, id := range ids {
		both(d, "timeline "+id, func(q *query.Server) (*trainmeterv1.TimelineResponse, error) {
			return q.Timeline(context.Background(), &trainmeterv1.TimelineRequest{RunId: id})
		})
	}
	// Nodes, but for last_seq: BadgerDB writes a node's status at most
	// every 10 s of its clock (group commit), PostgreSQL with every batch,
	// and the ingest server's live sequence overrides the stored one only
	// when greater, so the two may show different recent sequences.
	both(d, "nodes --json", func(q *query.Server) (*trainmeterv1.ListNodesResponse, error) {
		r, err := q.ListNodes(context.Background(), &trainmeterv1.ListNodesRequest{})
		for _, n := range r.GetNodes() {
			n.LastSeq = 0
		}
		return r, err
	})
	both(d, "compare", func(q *query.Server) (*trainmeterv1.CompareResponse, error) {
		return q.Compare(context.Background(), &trainmeterv1.CompareRequest{RunIds: ids})
	})

	// Usage, as usage --json prints it.
	sawDeleted := false
	for _, by := range [][]string{nil, {"user"}, {"model"}, {"gpu"}, {"label:team"}, {"label:priority", "node"}, {"node", "user"}} {
		for _, p := range [][2]int{{0, 0}, {5, 11}, {12, 0}} {
			req := &trainmeterv1.UsageRequest{By: by}
			if p[0] != 0 {
				req.Since = timestamppb.New(at(p[0]))
			}
			if p[1] != 0 {
				req.Until = timestamppb.New(at(p[1]))
			}
			u := both(d, fmt.Sprintf("usage by %v since %d until %d", by, p[0], p[1]), func(q *query.Server) (*trainmeterv1.UsageResponse, error) {
				return q.Usage(context.Background(), req)
			})
			if len(u.GetRows()) == 0 {
				t.Errorf("usage %v: no rows", req)
			}
			for _, r := range u.GetRows() {
				sawDeleted = sawDeleted || r.GetDeleted()
			}
		}
	}
}

// selectedRuns: ListRuns filtered (live_only, active_since) and ordered
// by cost, a page of one run at a time, gives the same on both stores, and
// what every run's report says: the runs the filter keeps, the costliest
// first, unknown cost last.
func selectedRuns(d *diff, all []*trainmeterv1.RunReport) {
	d.t.Helper()
	for _, c := range []struct {
		name string
		req  *trainmeterv1.ListRunsRequest
		keep func(r *trainmeterv1.RunReport) bool
	}{
		{"--live", &trainmeterv1.ListRunsRequest{LiveOnly: true}, func(r *trainmeterv1.RunReport) bool { return !r.GetEnded() }},
		{"--active-since 10s --by-cost", &trainmeterv1.ListRunsRequest{ActiveSince: timestamppb.New(at(10)), Order: trainmeterv1.RunOrder_RUN_ORDER_COST_DESC},
			func(r *trainmeterv1.RunReport) bool { return !r.GetEnded() || !r.GetEnd().AsTime().Before(at(10)) }},
		{"--by-cost", &trainmeterv1.ListRunsRequest{Order: trainmeterv1.RunOrder_RUN_ORDER_COST_DESC}, func(*trainmeterv1.RunReport) bool { return true }},
	} {
		var want []string
		var kept []*trainmeterv1.RunReport
		for _, r := range all {
			if c.keep(r) {
				kept = append(kept, r)
			}
		}
		if c.req.GetOrder() == trainmeterv1.RunOrder_RUN_ORDER_COST_DESC {
			slices.SortStableFunc(kept, func(a, b *trainmeterv1.RunReport) int {
				if (a.TotalCostUsd == nil) != (b.TotalCostUsd == nil) {
					return cmp.Compare(boolInt(a.TotalCostUsd == nil), boolInt(b.TotalCostUsd == nil))
				}
				return cmp.Or(cmp.Compare(b.GetTotalCostUsd(), a.GetTotalCostUsd()), cmp.Compare(a.GetRunId(), b.GetRunId()))
			})
		}
		for _, r := range kept {
			want = append(want, r.GetRunId())
		}
		var got []string
		c.req.PageSize = 1
		for page := 0; page < 10; page++ {
			resp := both(d, "runs "+c.name, func(q *query.Server) (*trainmeterv1.ListRunsResponse, error) {
				return q.ListRuns(context.Background(), c.req)
			})
			for _, r := range resp.GetRuns() {
				got = append(got, r.GetRunId())
			}
			if c.req.PageToken = resp.GetNextPageToken(); c.req.PageToken == "" {
				break
			}
		}
		if !slices.Equal(got, want) {
			d.t.Errorf("runs %s: %v, want %v", c.name, got, want)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

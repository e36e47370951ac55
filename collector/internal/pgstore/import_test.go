package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/fold"
	"github.com/trainmeter/trainmeter/collector/internal/ingest"
	"github.com/trainmeter/trainmeter/collector/internal/loadgen"
	"github.com/trainmeter/trainmeter/collector/internal/pgstore"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/query"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/pgtest"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// TestImport writes a realistic store with a BadgerDB collector (the real
// ingest server; runs on two nodes, an agent restart, duplicates and
// reordering, run and node loss records, raw samples, a live run deleted
// then sent more data, reprices, the collector's own records), closes it,
// exports it from the reopened data directory (as `trainmeter migrate`
// does) into an empty PostgreSQL database, and compares every run's
// report, the listing, timelines, the nodes' status (last_seq included),
// usage in several groupings and periods, and every record, byte for byte,
// between query servers over the two. Then both take the same further
// batches (an old batch resent, which both find Duplicate, more of the
// deleted run, a new run) and still agree; a second import is refused.
// The SQL views over the moved data agree with report --json and usage
// --json (checkViews), and past a raw retention that drops the moved
// day's raw partitions, usage answers from the rollups as BadgerDB does
// from its raw records (within sqlTolerance).
func TestImport(t *testing.T) {
	tariff, err := cost.ParseTariff([]byte(`{default: off, bands: {off: 0.1, peak: 0.3}, rules: [{from: "12:00", to: "12:01", band: peak}]}`))
	if err != nil {
		t.Fatal(err)
	}
	pricing := aggregate.Pricing{GPUPricePerHour: 2.5, NodeGPUPricePerHour: map[string]float64{"node-b": 3.1},
		Tariff: tariff, GridGCO2PerKWh: 400, PriorityMultipliers: map[string]float64{"high": 1.5}}
	clk := tu.Clock()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	// Raw records kept less long than dedup marks: every batch leaves both
	// its r/ record and its b/ mark, which the import merges. Both outlive
	// the wall clock that badger expires them by.
	// At most 2 runs live on a node: the live runs move too.
	limits := fold.Limits{MaxLiveRunsPerNode: 2}
	bo := store.Options{Logger: quiet, Clock: clk, EnergyBands: tariff, RawRetention: 20000 * time.Hour, DedupRetention: 30000 * time.Hour, Limits: limits}
	bs, err := store.Open(dir, bo)
	if err != nil {
		t.Fatal(err)
	}
	records := map[string]map[string][]byte{
		"budgets": {"team\x00vision": []byte(`{"usd": 100}`), "user\x00bob": []byte(`{"usd": 5}`)},
		"alerts":  {"a1": []byte("fired"), "a2": {0, 1, 2, 0xff}},
		"advice":  {"r1\x00001": []byte("raise the batch size")},
		"prices":  {"2025-03-01": []byte("h100 2.5")},
	}
	for ns, kv := range records {
		if err := bs.PutRecords(ns, kv); err != nil {
			t.Fatal(err)
		}
	}
	writeStream(t, bs, pricing)
	if err := bs.Close(); err != nil {
		t.Fatal(err)
	}

	bs, err = store.Open(dir, bo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bs.Close() })
	url := pgtest.DB(t)
	ps, err := pgstore.Open(context.Background(), url, pgstore.Options{Logger: quiet, Clock: clk, EnergyBands: tariff, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ps.Close() })
	// The collector's pricing, as serve sets it: the runs' report columns
	// are computed at it.
	ps.SetPricer(pricing)
	var progressed []pgstore.Count
	counts := importInto(t, bs, ps, func(c pgstore.Count) { progressed = append(progressed, c) })
	t.Logf("imported %s", counts)
	got := map[string]int64{}
	for _, c := range counts {
		got[c.What] = c.Rows
	}
	for what, want := range map[string]int64{"run": 3, "live run": 1, "node": 3, "deleted run window": 5, "raw-sample record": 1, "node loss record": 1,
		"budgets record": 2, "alerts record": 2, "advice record": 1, "prices record": 1, fold.DeletedNS + " record": 1} {
		if got[what] != want {
			t.Errorf("imported %d %s, want %d (%s)", got[what], what, want, counts)
		}
	}
	for _, what := range []string{"applied batch", "run window", "run event", "node window record"} {
		if got[what] == 0 {
			t.Errorf("imported no %s (%s)", what, counts)
		}
	}
	for _, c := range counts {
		// Records are told all namespaces together.
		if ns := strings.TrimSuffix(c.What, " record"); records[ns] != nil || ns == fold.DeletedNS {
			c = pgstore.Count{What: "record", Rows: 7}
		}
		if !slices.Contains(progressed, c) {
			t.Errorf("progress told %v, not %s at its end", progressed, c.What)
		}
	}

	d := &diff{t: t, cs: [2]*collector{serveCollector(t, "BadgerDB", bs, pricing), serveCollector(t, "PostgreSQL", ps, pricing)}}
	compareAll(d, false)
	for ns := range records {
		compareRecords(t, bs, ps, ns)
	}
	compareRecords(t, bs, ps, fold.DeletedNS)
	// The SQL views over the moved data, as ingest would have left them.
	ctx := context.Background()
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(ctx) })
	if ids, sawDeleted, _ := checkViews(t, d.cs[1].q, db, []time.Time{tu.T0.Truncate(24 * time.Hour)}); len(ids) != 3 || !sawDeleted {
		t.Errorf("views over the moved data: runs %v, deleted rows %v; want r1, r2, r3 and r4's deleted rows", ids, sawDeleted)
	}

	// An agent resending an old batch after the move: a duplicate on both.
	for i, st := range []storage.Ingester{bs, ps} {
		a, err := st.ApplyBatchResult(storage.Sender{Node: "node-a", Boot: "boot-1"}, batch(3, 3, "r1", false, "", ""))
		if err != nil || !a.Duplicate {
			t.Errorf("%s: an old batch resent: %+v, %v; want a duplicate", d.cs[i].name, a, err)
		}
	}
	// More batches to both: the deleted run's data is dropped again, a
	// duplicate of the restarted boot, an in-doubt loss of a batch held,
	// a new run.
	nc, nb, a2 := d.connect("node-c", "c1"), d.connect("node-b", "b1"), d.connect("node-a", "boot-2")
	nc.send(batch(14, 14, "r4", false, "", ""))
	a2.send(batch(2, 15, "r1", false, "", ""))
	b := batch(13, 20, "r5", true, "erin", "nlp")
	b.Losses = []*trainmeterv1.DataLoss{{RunId: "r3", Batches: 1, Tokens: 65536, EnergyJ: 1100, GpuSeconds: 2, Reason: "spool full", Seq: 10, WindowStart: timestamppb.New(at(9))}}
	nb.send(b)
	// node-b runs r3 and r5 now: a third start is refused by both.
	for i, st := range []storage.Ingester{bs, ps} {
		a, err := st.ApplyBatchResult(storage.Sender{Node: "node-b", Boot: "b1"}, batch(14, 21, "r6", true, "erin", "nlp"))
		if err != nil || len(a.Refused) != 1 {
			t.Errorf("%s: a third live run on node-b: %+v, %v; want it refused", d.cs[i].name, a, err)
		}
	}
	compareAll(d, true)
	if r, err := d.cs[1].q.GetRun(context.Background(), &trainmeterv1.GetRunRequest{RunId: "r3"}); err != nil || r.GetRun().GetLostBatches() != 0 {
		t.Errorf("r3 after a loss record of a batch it holds: %v, %v; want no loss", r.GetRun(), err)
	}

	// A second import into the same database is refused, naming why.
	if _, err := ps.Import(context.Background(), emptyDump{}, nil); !errors.Is(err, pgstore.ErrNotEmpty) {
		t.Errorf("second import: %v, want ErrNotEmpty", err)
	}

	// Days later, past a raw retention of a day, the raw partitions of
	// the moved day are dropped: usage answers from the rollups what
	// BadgerDB answers from its raw records.
	later := openWith(t, url, pgstore.Options{Logger: quiet, Clock: clock.NewFake(tu.T0.Add(72 * time.Hour)), EnergyBands: tariff,
		Limits: limits, RawRetention: 24 * time.Hour})
	if err := later.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	var raw int
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM run_windows) + (SELECT count(*) FROM node_windows)`).Scan(&raw); err != nil || raw != 0 {
		t.Fatalf("raw rows after the drop: %d (%v), want none", raw, err)
	}
	dropped := query.New(later, nil, pricing)
	for _, by := range [][]string{nil, {"user"}, {"gpu"}, {"label:team"}, {"node"}, {"node", "user"}} {
		var resp [2]*trainmeterv1.UsageResponse
		for i, q := range []*query.Server{d.cs[0].q, dropped} {
			if resp[i], err = q.Usage(ctx, &trainmeterv1.UsageRequest{By: by}); err != nil {
				t.Fatal(err)
			}
		}
		got, want := map[string]figures{}, map[string]figures{}
		for i, m := range []map[string]figures{got, want} {
			r := resp[1-i]
			for _, row := range r.GetRows() {
				m[usageKey(row)] = figures{row.GetGpuSeconds(), row.GetEnergyJ(), row.CostUsd, int64(row.GetRuns())}
			}
			for _, n := range r.GetNodes() {
				m["node "+n.GetNode()] = figures{n.GetGpuSeconds(), n.GetEnergyJ(), nil, -1}
				m["node "+n.GetNode()+" idle"] = figures{n.GetIdleGpuSeconds(), n.GetIdleEnergyJ(), nil, -1}
				m["node "+n.GetNode()+" host"] = figures{n.GetHostEnergyJ(), n.GetIdleHostEnergyJ(), nil, -1}
			}
		}
		compareFigures(t, fmt.Sprintf("usage by %v after the raw days' drop", by), got, want)
	}
}

func importInto(t *testing.T, bs *store.Store, ps *pgstore.Store, progress func(pgstore.Count)) pgstore.Counts {
	t.Helper()
	var counts pgstore.Counts
	err := bs.Export(func(d storage.Dump) (err error) {
		counts, err = ps.Import(context.Background(), d, progress)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return counts
}

// writeStream feeds a BadgerDB store through a collector of its own,
// stopped before it returns.
func writeStream(t *testing.T, st *store.Store, pricing aggregate.Pricing) {
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
	defer func() {
		ing.Close()
		gs.Stop()
	}()
	conn := tu.Dial(t, lis.Addr().String())
	q := query.New(st, ing, pricing)
	connect := func(node, boot string) *tu.Agent {
		return tu.ConnectHello(t, conn, &trainmeterv1.Hello{Node: node, BootId: boot, AgentVersion: "test", GpuBackend: "sim",
			Gpus: []*trainmeterv1.GpuInfo{
				{Index: 0, Name: "Sim H100", MemoryTotalMib: 81559, HasEnergyCounter: true},
				{Index: 1, Name: "Sim H100", MemoryTotalMib: 81559, HasEnergyCounter: true},
			}})
	}
	// node-a: r1 with a warmup, raw samples, a resend, reordering, run
	// and node losses, an evaluation; then a restart (boot 2) and the end.
	a1 := connect("node-a", "boot-1")
	a1.MustAck(batch(1, 1, "r1", true, "alice", "vision"))
	for _, s := range []int{2, 3, 4, 6, 7, 5, 3} {
		bb := batch(uint64(s), s, "r1", false, "", "")
		switch s {
		case 2:
			bb.RunWindows[0].Phase = trainmeterv1.Phase_PHASE_WARMUP
		case 3:
			loadgen.AddRawSamples(bb, 20)
		}
		a1.MustAck(bb)
	}
	b := batch(10, 10, "r1", false, "", "")
	b.Losses = []*trainmeterv1.DataLoss{
		{RunId: "r1", Batches: 1, Tokens: 65536, EnergyJ: 1100, GpuSeconds: 2, Reason: "spool full"},
		{RunId: "r1", Batches: 1, Tokens: 65536, EnergyJ: 1100, GpuSeconds: 2, Reason: "spool full", Seq: 9, WindowStart: timestamppb.New(at(8))},
	}
	b.NodeLosses = []*trainmeterv1.DataLoss{{Batches: 1, EnergyJ: 1100, GpuSeconds: 2, Reason: "spool full", FirstWindowStart: timestamppb.New(at(7))}}
	a1.MustAck(b)
	a1.MustAck(batch(9, 9, "r1", false, "", ""))
	a1.MustAck(withEval(batch(12, 12, "r1", false, "", ""), "r1", 12, 0.61))
	a2 := connect("node-a", "boot-2")
	for s := 14; s <= 18; s++ {
		bb := batch(uint64(s-13), s, "r1", false, "", "")
		if s == 18 {
			withEnd(bb, "r1", 18)
		}
		a2.MustAck(bb)
	}
	// r2 on node-b and node-c (host energy, priority high); r3 after it
	// on node-b.
	nb, nc := connect("node-b", "b1"), connect("node-c", "c1")
	for s := 1; s <= 8; s++ {
		for _, a := range []*tu.Agent{nb, nc} {
			bb := withHost(batch(uint64(s), s, "r2", s == 1, "bob", "nlp"), "r2")
			if s == 1 {
				bb.RunEvents[0].GetRunStart().Labels["priority"] = "high"
			}
			if s == 8 {
				withEnd(withEval(bb, "r2", 8, 0.64), "r2", 8)
			}
			a.MustAck(bb)
		}
	}
	for s := 9; s <= 12; s++ {
		bb := batch(uint64(s), s, "r3", s == 9, "carol", "vision")
		if s == 12 {
			withEval(bb, "r3", 12, 0.58) // r3 goes on: live at the move
		}
		nb.MustAck(bb)
	}
	// r4 on node-c, deleted while live, then more of it.
	for s := 9; s <= 11; s++ {
		nc.MustAck(batch(uint64(s), s, "r4", s == 9, "dave", "nlp"))
	}
	if _, err := q.DeleteRun(context.Background(), &trainmeterv1.DeleteRunRequest{RunId: "r4", Force: true}); err != nil {
		t.Fatal(err)
	}
	for s := 12; s <= 13; s++ {
		nc.MustAck(batch(uint64(s), s, "r4", false, "", ""))
	}
	if _, err := q.Reprice(context.Background(), &trainmeterv1.RepriceRequest{RunId: "r2", UsdPerGpuHour: 4, Reason: "contract"}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Reprice(context.Background(), &trainmeterv1.RepriceRequest{Since: timestamppb.New(at(10)), UsdPerGpuHour: 3.3, Reason: "new rate"}); err != nil {
		t.Fatal(err)
	}
}

// compareAll compares what the two query servers answer: the listing,
// every run's report (and the deleted r4's), timelines, compare, nodes
// (last_seq but when sinceBatches: BadgerDB writes a node's status at
// most every 10 s) and usage.
func compareAll(d *diff, sinceBatches bool) {
	list := both(d, "runs --json", func(q *query.Server) (*trainmeterv1.ListRunsResponse, error) {
		return q.ListRuns(context.Background(), &trainmeterv1.ListRunsRequest{})
	})
	var ids []string
	for _, r := range list.GetRuns() {
		ids = append(ids, r.GetRunId())
	}
	if len(ids) < 3 {
		d.t.Errorf("runs %v, want r1, r2, r3 at least", ids)
	}
	for _, id := range append(ids, "r4") {
		both(d, "report "+id+" --json", func(q *query.Server) (*trainmeterv1.GetRunResponse, error) {
			return q.GetRun(context.Background(), &trainmeterv1.GetRunRequest{RunId: id})
		})
		both(d, "timeline "+id, func(q *query.Server) (*trainmeterv1.TimelineResponse, error) {
			return q.Timeline(context.Background(), &trainmeterv1.TimelineRequest{RunId: id})
		})
	}
	both(d, "compare", func(q *query.Server) (*trainmeterv1.CompareResponse, error) {
		return q.Compare(context.Background(), &trainmeterv1.CompareRequest{RunIds: ids})
	})
	both(d, "nodes --json", func(q *query.Server) (*trainmeterv1.ListNodesResponse, error) {
		r, err := q.ListNodes(context.Background(), &trainmeterv1.ListNodesRequest{})
		for _, n := range r.GetNodes() {
			if sinceBatches {
				n.LastSeq = 0
			}
		}
		return r, err
	})
	sawDeleted := false
	for _, by := range [][]string{nil, {"user"}, {"gpu"}, {"label:team"}, {"label:priority", "node"}, {"node", "user"}} {
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
			for _, r := range u.GetRows() {
				sawDeleted = sawDeleted || r.GetDeleted()
			}
		}
	}
	if !sawDeleted {
		d.t.Error("usage shows no deleted run's windows")
	}
}

// compareRecords fails unless both stores hold the same records of ns.
func compareRecords(t *testing.T, a, b storage.Records, ns string) {
	t.Helper()
	var out [2]bytes.Buffer
	for i, st := range []storage.Records{a, b} {
		if err := st.ScanRecords(ns, "", func(k string, v []byte) (bool, error) {
			fmt.Fprintf(&out[i], "%q=%q\n", k, v)
			return true, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if out[0].String() != out[1].String() || out[0].Len() == 0 {
		t.Errorf("records %s: BadgerDB\n%s\nPostgreSQL\n%s", ns, &out[0], &out[1])
	}
}

// emptyDump is a store with nothing in it.
type emptyDump struct{}

func (emptyDump) Runs() iter.Seq2[*aggregate.State, error] {
	return func(func(*aggregate.State, error) bool) {}
}
func (emptyDump) Nodes() iter.Seq2[*trainmeterv1.NodeStatus, error] {
	return func(func(*trainmeterv1.NodeStatus, error) bool) {}
}
func (emptyDump) AppliedBatches() iter.Seq2[storage.AppliedBatch, error] {
	return func(func(storage.AppliedBatch, error) bool) {}
}
func (emptyDump) Raw(storage.RawKind) iter.Seq2[storage.RawRecord, error] {
	return func(func(storage.RawRecord, error) bool) {}
}
func (emptyDump) Records() iter.Seq2[storage.Record, error] {
	return func(func(storage.Record, error) bool) {}
}

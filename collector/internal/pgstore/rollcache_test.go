package pgstore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/pgstore"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/pgtest"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// TestRollupsAcrossReplicas: a node's batches alternate between two
// collectors on one database. The first is rolled up (rollbehind.go), and
// the batches that follow start before the node's rolled_ns, so ingest
// adds them to the rollups itself, each collector keeping the rollup rows
// it wrote; a late batch lands in a minute already left; the last two
// start after rolled_ns and reach the rollups by the next roll-up. Every
// minute's rollup rows hold exactly the sum of its records: a collector
// whose rows the other wrote since reads them again rather than adding to
// its own stale copy, and no record is added twice or missed.
func TestRollupsAcrossReplicas(t *testing.T) {
	url := pgtest.DB(t)
	a, b := open(t, url), open(t, url)
	node := storage.Sender{Node: "n", Boot: "b"}
	send := func(st interface {
		ApplyBatchResult(storage.Sender, *trainmeterv1.Batch) (storage.Applied, error)
	}, seq uint64, sec float64) {
		t.Helper()
		bt := tu.Batch(seq, sec, []*trainmeterv1.RunWindow{tu.Window("r", sec, 10, 5)})
		if seq == 1 {
			bt.RunEvents = append(bt.RunEvents, tu.Start("r", sec, "m"))
		}
		if ap, err := st.ApplyBatchResult(node, bt); err != nil || ap.Duplicate {
			t.Fatalf("batch %d: %+v, %v", seq, ap, err)
		}
	}
	send(a, 1, 0)
	if err := a.RollUp(t.Context(), tu.T0.Add(2*time.Minute), true); err != nil {
		t.Fatal(err)
	}
	send(a, 2, 1)
	send(b, 3, 2) // b reads a's rows
	send(a, 4, 3) // a's cache is stale: read again
	send(a, 5, 61)
	send(b, 6, 62)
	send(a, 7, 63) // stale again
	send(a, 8, 4)  // late: minute 0 again, not cached
	if n := a.CommitStats().RollupRereads; n != 2 {
		t.Errorf("collector a read its cached rows again %d times, want 2 (after each of b's writes)", n)
	}
	send(b, 9, 125) // after rolled_ns: the roll-up's
	send(a, 10, 126)
	if err := b.RollUp(t.Context(), tu.T0.Add(10*time.Minute), true); err != nil {
		t.Fatal(err)
	}

	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	tokens := map[int64]uint64{}
	gpuS := map[int64]float64{}
	rows, _ := conn.Query(t.Context(), `SELECT start_ns, w FROM run_rollups WHERE node = 'n' AND run_id = 'r'`)
	var start int64
	var val []byte
	if _, err := pgx.ForEachRow(rows, []any{&start, &val}, func() error {
		w := &trainmeterv1.RunWindow{}
		if err := proto.Unmarshal(val, w); err != nil {
			return err
		}
		tokens[start-tu.T0.UnixNano()] += w.GetTokens()
		gpuS[start-tu.T0.UnixNano()] += w.GetGpuSeconds()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	const m1, m2 = int64(60e9), int64(120e9)
	if tokens[0] != 50 || tokens[m1] != 30 || tokens[m2] != 20 || gpuS[0] != 5 || gpuS[m1] != 3 || gpuS[m2] != 2 || len(tokens) != 3 {
		t.Errorf("run rollups: tokens %v, GPU-s %v; want minute 0: 50 tokens, 5 GPU-s; minute 1: 30, 3; minute 2: 20, 2", tokens, gpuS)
	}
	energy := map[int64]float64{}
	rows, _ = conn.Query(t.Context(), `SELECT start_ns, b FROM node_rollups WHERE node = 'n'`)
	if _, err := pgx.ForEachRow(rows, []any{&start, &val}, func() error {
		b := &trainmeterv1.Batch{}
		if err := proto.Unmarshal(val, b); err != nil {
			return err
		}
		for _, g := range b.GetGpuWindows() {
			energy[start-tu.T0.UnixNano()] += g.GetEnergyCounterJ()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if energy[0] != 500 || energy[m1] != 300 || energy[m2] != 200 || len(energy) != 3 {
		t.Errorf("node rollups: GPU energy by minute %v, want minute 0: 500 J, minute 1: 300 J, minute 2: 200 J", energy)
	}
}

// TestRunsWithDataSince: the runs that got data since a time, the most
// recent first, by the clock of the collector that applied it (any of
// those sharing the database): what the fleet's leader exports.
func TestRunsWithDataSince(t *testing.T) {
	url := pgtest.DB(t)
	clk := clock.NewFake(tu.T0)
	a, b := openWith(t, url, pgstore.Options{Clock: clk}), openWith(t, url, pgstore.Options{Clock: clk})
	send := func(st *pgstore.Store, node string, seq uint64, run string) {
		t.Helper()
		bt := tu.Batch(seq, float64(seq), []*trainmeterv1.RunWindow{tu.Window(run, float64(seq), 10, 5)})
		if seq == 1 {
			bt.RunEvents = append(bt.RunEvents, tu.Start(run, float64(seq), "m"))
		}
		if _, err := st.ApplyBatchResult(storage.Sender{Node: node, Boot: "b"}, bt); err != nil {
			t.Fatal(err)
		}
	}
	send(a, "n1", 1, "r1")
	clk.Advance(10 * time.Second)
	send(b, "n2", 1, "r2")
	clk.Advance(10 * time.Second)
	send(a, "n3", 1, "r3")
	clk.Advance(10 * time.Second)
	send(b, "n1", 2, "r1") // r1 again, on the other collector
	for _, c := range []struct {
		since time.Duration
		limit int
		want  string
	}{
		{0, 10, "r1,r3,r2"},
		{0, 2, "r1,r3"},
		{15 * time.Second, 10, "r1,r3"},
		{31 * time.Second, 10, ""},
	} {
		ids, err := b.RunsWithDataSince(tu.T0.Add(c.since), c.limit)
		if got := strings.Join(ids, ","); err != nil || got != c.want {
			t.Errorf("since T0+%v, limit %d: %q (%v), want %q", c.since, c.limit, got, err, c.want)
		}
	}
}

// TestRollerRollsUpEveryInterval: the leader's roller, on a fake clock,
// rolls up at each interval what started an interval ago or earlier, and
// stops when told.
func TestRollerRollsUpEveryInterval(t *testing.T) {
	url := pgtest.DB(t)
	clk := tu.Clock() // T0 + 60 s
	st := openWith(t, url, pgstore.Options{Clock: clk})
	node := storage.Sender{Node: "n", Boot: "b"}
	send := func(seq uint64, sec float64) {
		t.Helper()
		bt := tu.Batch(seq, sec, []*trainmeterv1.RunWindow{tu.Window("r", sec, 10, 5)})
		if seq == 1 {
			bt.RunEvents = append(bt.RunEvents, tu.Start("r", sec, "m"))
		}
		if _, err := st.ApplyBatchResult(node, bt); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	tokens := func() (n uint64) {
		t.Helper()
		rows, _ := conn.Query(t.Context(), `SELECT w FROM run_rollups WHERE node = 'n' AND run_id = 'r'`)
		var val []byte
		if _, err := pgx.ForEachRow(rows, []any{&val}, func() error {
			w := &trainmeterv1.RunWindow{}
			err := proto.Unmarshal(val, w)
			n += w.GetTokens()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	send(1, 0)
	send(2, 45)
	send(3, 55)
	if n := tokens(); n != 0 {
		t.Fatalf("before a roll-up the rollups hold %d tokens, want 0 (ingest leaves them to the roll-up)", n)
	}
	r := &pgstore.Roller{Store: st, Interval: 10 * time.Second}
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	rollAt := func(want uint64) {
		t.Helper()
		if err := clk.AwaitWaiters(t.Context(), 1); err != nil {
			t.Fatal(err)
		}
		clk.Advance(10 * time.Second)
		if err := clk.AwaitWaiters(t.Context(), 1); err != nil { // waiting again: the roll-up is done
			t.Fatal(err)
		}
		if n := tokens(); n != want {
			t.Errorf("after the roll-up at T0+%v the rollups hold %d tokens, want %d", clk.Now().Sub(tu.T0), n, want)
		}
	}
	rollAt(30) // at T0+70 s, up to T0+60 s: all three
	send(4, 65)
	send(5, 72)
	rollAt(40) // at T0+80 s, up to T0+70 s: the one at 65 s
	if err := r.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestLiveRunColumnsTrail: a live run's report columns (run_report) are
// written with its first batch, then at most every 10 s while its batches
// bring windows only, at once for an event, and exactly when it ends; its
// aggregate (report --json) is exact throughout.
func TestLiveRunColumnsTrail(t *testing.T) {
	url := pgtest.DB(t)
	clk := tu.Clock()
	st := openWith(t, url, pgstore.Options{Clock: clk})
	node := storage.Sender{Node: "n", Boot: "b"}
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	step := func(seq uint64, sec float64, wantColumn uint64, events ...*trainmeterv1.RunEvent) {
		t.Helper()
		if _, err := st.ApplyBatchResult(node, tu.Batch(seq, sec, []*trainmeterv1.RunWindow{tu.Window("r", sec, 10, 5)}, events...)); err != nil {
			t.Fatal(err)
		}
		var tokens int64
		if err := conn.QueryRow(t.Context(), `SELECT tokens FROM runs WHERE run_id = 'r'`).Scan(&tokens); err != nil {
			t.Fatal(err)
		}
		agg, err := st.GetRun("r")
		if err != nil {
			t.Fatal(err)
		}
		if got := agg.Report(aggregate.Pricing{}).GetTokensProcessed(); got != seq*10 {
			t.Errorf("batch %d: the aggregate holds %d tokens, want %d", seq, got, seq*10)
		}
		if uint64(tokens) != wantColumn {
			t.Errorf("batch %d at T0+%v: runs.tokens %d, want %d", seq, clk.Now().Sub(tu.T0), tokens, wantColumn)
		}
	}
	step(1, 0, 10, tu.Start("r", 0, "m")) // the first write: columns too
	step(2, 1, 10)                        // windows only, within 10 s: aggregate alone
	clk.Advance(5 * time.Second)
	step(3, 2, 10)
	step(4, 3, 40, tu.Start("r", 0, "m")) // an event: columns at once
	clk.Advance(10 * time.Second)
	step(5, 4, 50) // 10 s since: columns
	step(6, 5, 50)
	step(7, 6, 70, tu.End("r", 6)) // ended: exact
}

// TestNodeStatusAcrossReplicas: a collector folds a node's next batch into
// the node status its last group wrote only while no one has written the
// node's row since: a hello through another collector (the agent
// restarted with other GPUs) is what the node then shows, not the first
// collector's copy from before it.
func TestNodeStatusAcrossReplicas(t *testing.T) {
	url := pgtest.DB(t)
	a, b := open(t, url), open(t, url)
	sender := storage.Sender{Node: "n", Boot: "b1"}
	gpus := func(name string) []*trainmeterv1.GpuInfo {
		return []*trainmeterv1.GpuInfo{{Index: 0, Name: name}, {Index: 1, Name: name}}
	}
	if err := a.PutHello(&trainmeterv1.Hello{Node: "n", BootId: "b1", Gpus: gpus("A100")}); err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 2; seq++ {
		if _, err := a.ApplyBatchResult(sender, tu.Batch(seq, float64(seq), nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.PutHello(&trainmeterv1.Hello{Node: "n", BootId: "b2", Gpus: gpus("H100")}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ApplyBatchResult(storage.Sender{Node: "n", Boot: "b2"}, tu.Batch(1, 3, nil)); err != nil {
		t.Fatal(err)
	}
	// a's status row is not due (the hello wrote it just now): a writes
	// what it holds when it closes.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	nodes, err := b.Nodes()
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || nodes[0].GetBootId() != "b2" || len(nodes[0].GetGpus()) != 2 || nodes[0].GetGpus()[0].GetName() != "H100" || nodes[0].GetLastSeq() != 1 {
		t.Errorf("node after the restart's hello and first batch: %v; want boot b2, two H100s, last seq 1", nodes)
	}
}

// TestNodeStatusWrittenWhenDue: a node's status row (last seen, last seq)
// is rewritten at most every 10 s while its boot stays (what another
// collector on the database reads trails by that much at most), at once
// for a new boot, and with the newest status when the collector closes.
func TestNodeStatusWrittenWhenDue(t *testing.T) {
	url := pgtest.DB(t)
	clk := clock.NewFake(tu.T0)
	st, other := openWith(t, url, pgstore.Options{Clock: clk}), open(t, url)
	stored := func() (uint64, string) {
		t.Helper()
		nodes, err := other.Nodes()
		if err != nil || len(nodes) != 1 {
			t.Fatalf("nodes: %v, %v", nodes, err)
		}
		return nodes[0].GetLastSeq(), nodes[0].GetBootId()
	}
	send := func(boot string, seq uint64) {
		t.Helper()
		if _, err := st.ApplyBatchResult(storage.Sender{Node: "n", Boot: boot}, tu.Batch(seq, float64(seq), nil)); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Second)
	}
	for seq := uint64(1); seq <= 10; seq++ {
		send("b1", seq)
		if q, _ := stored(); q != 1 {
			n, _ := other.Nodes()
			t.Log(n)
			t.Fatalf("after seq %d at %v: the row says last seq %d, want 1 (written at the first batch, due again 10 s after)", seq, clk.Now().Sub(tu.T0), q)
		}
	}
	send("b1", 11)
	if q, _ := stored(); q != 11 {
		t.Errorf("10 s after the row's status: last seq %d, want 11", q)
	}
	send("b2", 1)
	if q, b := stored(); q != 1 || b != "b2" {
		t.Errorf("a new boot: the row says seq %d of %q, want 1 of b2", q, b)
	}
	send("b2", 2)
	send("b2", 3)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if q, b := stored(); q != 3 || b != "b2" {
		t.Errorf("after close: the row says seq %d of %q, want 3 of b2", q, b)
	}
}

package pgstore_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/pgstore"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/pgtest"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// TestGroupCommit: concurrent batches share transactions (fewer commits
// than batches), and a batch that fails or is a duplicate gets its own
// answer while its neighbours in the group commit: inside the group (a
// duplicate, a batch whose first insert fails) and when the group's own
// statements fail on it (a node name PostgreSQL refuses).
func TestGroupCommit(t *testing.T) {
	st := openWith(t, pgtest.DB(t), pgstore.Options{CommitWindow: 300 * time.Millisecond})
	dup := storage.Sender{Node: "dup", Boot: "b"}
	dupBatch := tu.Batch(1, 0, nil)
	if _, err := st.ApplyBatchResult(dup, dupBatch); err != nil {
		t.Fatal(err)
	}
	tokens := uint64(0)
	round := func(nodes int, bad storage.Sender, maxCommits uint64) {
		t.Helper()
		before := st.CommitStats()
		var wg sync.WaitGroup
		for n := range nodes {
			wg.Go(func() {
				node := fmt.Sprintf("n%d-%d", nodes, n)
				a, err := st.ApplyBatchResult(storage.Sender{Node: node, Boot: "b"},
					tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 10, 5)}, tu.Start("r", 0, "m")))
				if err != nil || a.Duplicate {
					t.Errorf("%s: %+v, %v: a good batch in a group with a bad one", node, a, err)
				}
			})
		}
		wg.Go(func() {
			a, err := st.ApplyBatchResult(dup, dupBatch)
			if err != nil || !a.Duplicate {
				t.Errorf("the duplicate: %+v, %v, want Duplicate", a, err)
			}
		})
		wg.Go(func() {
			if _, err := st.ApplyBatchResult(bad, tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 1000, 5)})); err == nil {
				t.Errorf("the bad batch of %q applied", bad.Node)
			}
		})
		wg.Wait()
		tokens += uint64(nodes) * 10
		after := st.CommitStats()
		if c, b := after.Commits-before.Commits, after.Batches-before.Batches; c > maxCommits || b != uint64(nodes) {
			t.Errorf("%d batches in %d commits, want %d batches in at most %d", b, c, nodes, maxCommits)
		}
	}
	// The bad boot fails the batch's first insert, inside the group: it
	// and the duplicate roll back to their savepoints, the group commits
	// once (twice when a second leader took part of it).
	round(40, storage.Sender{Node: "bad", Boot: "b\x00"}, 2)
	// PostgreSQL refuses the node name in the group's locking statements:
	// the group is applied again in halves.
	round(10, storage.Sender{Node: "bad\x00", Boot: "b"}, 9)

	s, err := st.GetRun("r")
	if err != nil {
		t.Fatal(err)
	}
	if r := s.Report(aggregate.Pricing{}); r.GetTokensProcessed() != tokens || r.GetNodes() != 50 {
		t.Errorf("tokens %d on %d nodes, want %d on 50", r.GetTokensProcessed(), r.GetNodes(), tokens)
	}
	ws, _, err := st.RunTimeline("r")
	if err != nil || len(ws) != 50 {
		t.Errorf("%d windows (%v), want 50", len(ws), err)
	}
}

// TestGroupAppliedAsOne: a group of batches of one run over many nodes,
// with a duplicate among them, is applied as one (group.go: no fallback
// to the per-batch path), each batch answered on its own, and the run
// holds every batch's records once.
func TestGroupAppliedAsOne(t *testing.T) {
	st := openWith(t, pgtest.DB(t), pgstore.Options{CommitWindow: 300 * time.Millisecond})
	dup := storage.Sender{Node: "dup", Boot: "b"}
	dupBatch := tu.Batch(1, 0, nil)
	if _, err := st.ApplyBatchResult(dup, dupBatch); err != nil {
		t.Fatal(err)
	}
	const nodes = 40
	for seq := uint64(1); seq <= 2; seq++ {
		before := st.CommitStats()
		var wg sync.WaitGroup
		for n := range nodes {
			wg.Go(func() {
				var evs []*trainmeterv1.RunEvent
				if seq == 1 {
					evs = append(evs, tu.Start("r", 0, "m"))
				}
				a, err := st.ApplyBatchResult(storage.Sender{Node: fmt.Sprintf("n%d", n), Boot: "b"},
					tu.Batch(seq, float64(seq-1), []*trainmeterv1.RunWindow{tu.Window("r", float64(seq-1), 10, 5)}, evs...))
				if err != nil || a.Duplicate {
					t.Errorf("node %d seq %d: %+v, %v", n, seq, a, err)
				}
			})
		}
		wg.Go(func() {
			if a, err := st.ApplyBatchResult(dup, dupBatch); err != nil || !a.Duplicate {
				t.Errorf("the duplicate: %+v, %v, want Duplicate", a, err)
			}
		})
		wg.Wait()
		after := st.CommitStats()
		if c, b, f := after.Commits-before.Commits, after.Batches-before.Batches, after.Fallbacks-before.Fallbacks; c > 2 || b != nodes || f != 0 {
			t.Errorf("seq %d: %d batches in %d commits, %d groups applied batch by batch; want %d in at most 2, none", seq, b, c, f, nodes)
		}
	}
	s, err := st.GetRun("r")
	if err != nil {
		t.Fatal(err)
	}
	if r := s.Report(aggregate.Pricing{}); r.GetTokensProcessed() != 2*nodes*10 || r.GetNodes() != nodes {
		t.Errorf("tokens %d on %d nodes, want %d on %d", r.GetTokensProcessed(), r.GetNodes(), 2*nodes*10, nodes)
	}
	ws, _, err := st.RunTimeline("r")
	if err != nil || len(ws) != 2*nodes {
		t.Errorf("%d windows (%v), want %d", len(ws), err, 2*nodes)
	}
}

// TestRawKeyReusedByANewBoot: the group inserts its raw rows without an
// upsert (a raw row's key is new but for a node reusing a window start and
// seq under a new boot). When one is there, the group fails on it and is
// applied batch by batch, whose statements replace the row: the node's
// window is the new boot's, as BadgerDB keeps it, and the run's tokens
// count both batches.
func TestRawKeyReusedByANewBoot(t *testing.T) {
	st := open(t, pgtest.DB(t))
	first := tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 10, 5)}, tu.Start("r", 0, "m"))
	if _, err := st.ApplyBatchResult(storage.Sender{Node: "n", Boot: "b1"}, first); err != nil {
		t.Fatal(err)
	}
	before := st.CommitStats()
	again := tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 7, 5)})
	again.GpuWindows[0].EnergyCounterJ = 250
	if a, err := st.ApplyBatchResult(storage.Sender{Node: "n", Boot: "b2"}, again); err != nil || a.Duplicate {
		t.Fatalf("the new boot's batch: %+v, %v", a, err)
	}
	if f := st.CommitStats().Fallbacks - before.Fallbacks; f != 1 {
		t.Errorf("%d fallbacks to batch by batch, want 1 (the raw key taken)", f)
	}
	ws, err := st.NodeGPUWindows("n", tu.T0.Add(-time.Second), tu.T0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 1 || ws[0].GetStoredBootId() != "b2" || ws[0].GetGpuWindows()[0].GetEnergyCounterJ() != 250 {
		t.Errorf("node windows %v, want the one of boot b2 (250 J)", ws)
	}
	run, err := st.GetRun("r")
	if err != nil {
		t.Fatal(err)
	}
	if tok := run.Report(aggregate.Pricing{}).GetTokensProcessed(); tok != 17 {
		t.Errorf("run r: %d tokens, want 17 (both batches)", tok)
	}
}

// TestNodeRowWithoutHello: a node's first batch, with no hello before it
// and starting no run, makes the node's row under its name with the
// batch's status. (The group once queued the new rows' names and then
// compacted the same slice for the live-run count, so the row was made
// under the name "" and the node's status never written.)
func TestNodeRowWithoutHello(t *testing.T) {
	url := pgtest.DB(t)
	st := open(t, url)
	if _, err := st.ApplyBatchResult(storage.Sender{Node: "n", Boot: "b1"}, tu.Batch(1, 0, nil)); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	rows, _ := conn.Query(t.Context(), `SELECT node FROM nodes`)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(names) != 1 || names[0] != "n" {
		t.Errorf("node rows %q (%v), want [n]", names, err)
	}
	nodes, err := st.Nodes()
	if err != nil || len(nodes) != 1 || nodes[0].GetBootId() != "b1" || nodes[0].GetLastSeq() != 1 {
		t.Errorf("nodes %v (%v), want n of boot b1 at seq 1", nodes, err)
	}
}

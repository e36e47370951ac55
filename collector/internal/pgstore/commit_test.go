package pgstore_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

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

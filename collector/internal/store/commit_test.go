package store

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/loadgen"
)

// Many nodes writing batches of a few shared runs at once are committed in
// groups; the aggregates must come out as if every batch had been applied
// alone, also after a reopen (no cache), and replays must stay duplicates.
func TestConcurrentBatchesOfSharedRunsFoldLikeSequential(t *testing.T) {
	const nodes, perNode, runs = 24, 15, 3
	now := time.Now()
	batch := func(n, i int) *trainmeterv1.Batch {
		return loadgen.MakeBatch(uint64(i+1), now.Add(time.Duration(i)*time.Second), time.Second, fmt.Sprintf("run-%d", n%runs), 8, i == 0)
	}

	dir := t.TempDir()
	conc := open(t, dir)
	var wg sync.WaitGroup
	for n := 0; n < nodes; n++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perNode; i++ {
				if dup, err := conc.ApplyBatch(fmt.Sprintf("node-%d", n), "boot", batch(n, i)); err != nil || dup {
					t.Errorf("node %d batch %d: dup=%v err=%v", n, i, dup, err)
					return
				}
			}
			// A replay of every batch (lost acks) changes nothing.
			for i := 0; i < perNode; i++ {
				if dup, err := conc.ApplyBatch(fmt.Sprintf("node-%d", n), "boot", batch(n, i)); err != nil || !dup {
					t.Errorf("node %d replay %d: dup=%v err=%v", n, i, dup, err)
					return
				}
			}
		}()
	}
	wg.Wait()

	seq := open(t, t.TempDir())
	defer seq.Close()
	seq.aggs = newAggCache(0) // every batch decodes the stored aggregate
	seq.nodes = newNodeCache(0, seq.db)
	for i := 0; i < perNode; i++ {
		for n := 0; n < nodes; n++ {
			if _, err := seq.ApplyBatch(fmt.Sprintf("node-%d", n), "boot", batch(n, i)); err != nil {
				t.Fatal(err)
			}
		}
	}

	check := func(label string, got *Store) {
		t.Helper()
		for r := 0; r < runs; r++ {
			id := fmt.Sprintf("run-%d", r)
			a, err := got.GetRun(id)
			if err != nil {
				t.Fatalf("%s: %v", label, err)
			}
			b, err := seq.GetRun(id)
			if err != nil {
				t.Fatal(err)
			}
			if a.Tokens != b.Tokens || a.Steps != b.Steps || a.MeasuredWindows != b.MeasuredWindows || len(a.Nodes) != len(b.Nodes) ||
				a.Tokens != uint64(nodes/runs*perNode*65536) {
				t.Errorf("%s %s: tokens %d/%d steps %d/%d windows %d/%d nodes %d/%d", label, id, a.Tokens, b.Tokens,
					a.Steps, b.Steps, a.MeasuredWindows, b.MeasuredWindows, len(a.Nodes), len(b.Nodes))
			}
			if math.Abs(a.EnergyTotal-b.EnergyTotal) > 1e-9*b.EnergyTotal || math.Abs(a.Peak()-b.Peak()) > 1e-9*b.Peak() {
				t.Errorf("%s %s: energy %v/%v peak %v/%v", label, id, a.EnergyTotal, b.EnergyTotal, a.Peak(), b.Peak())
			}
		}
	}
	check("concurrent", conc)
	if err := conc.Close(); err != nil {
		t.Fatal(err)
	}
	reopened := open(t, dir)
	defer reopened.Close()
	check("reopened", reopened)
}

// A batch too large for a transaction fails alone: the batches committed in
// the same group are stored, and it gets ErrBatchTooLarge.
func TestTooLargeBatchFailsAloneInItsGroup(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	now := time.Now()
	huge := loadgen.MakeBatch(1, now, time.Second, "huge", 1, true)
	for len(huge.RunWindows) < 200000 { // one key each
		huge.RunWindows = append(huge.RunWindows, huge.RunWindows[0])
	}
	var wg sync.WaitGroup
	errs := make([]error, 9)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := huge
			if i > 0 {
				b = loadgen.MakeBatch(1, now, time.Second, fmt.Sprintf("ok-%d", i), 8, true)
			}
			_, errs[i] = s.ApplyBatch(fmt.Sprintf("node-%d", i), "boot", b)
		}()
	}
	wg.Wait()
	if !errors.Is(errs[0], ErrBatchTooLarge) {
		t.Errorf("huge batch: got %v, want ErrBatchTooLarge", errs[0])
	}
	for i := 1; i < len(errs); i++ {
		if errs[i] != nil {
			t.Errorf("batch %d: %v", i, errs[i])
		}
		if _, err := s.GetRun(fmt.Sprintf("ok-%d", i)); err != nil {
			t.Errorf("run ok-%d: %v", i, err)
		}
	}
	if _, err := s.GetRun("huge"); !errors.Is(err, ErrNotFound) {
		t.Errorf("run of the rejected batch: got %v, want ErrNotFound", err)
	}
}

// After Close, ApplyBatch fails instead of hanging.
func TestApplyBatchAfterCloseFails(t *testing.T) {
	s := open(t, t.TempDir())
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ApplyBatch("n", "b", loadgen.MakeBatch(1, time.Now(), time.Second, "r", 1, true)); err == nil {
		t.Error("ApplyBatch after Close: want an error")
	}
}

// Node states are stored apart from their run's aggregate and only when a
// commit changed them; what a reader gets from the database must be exactly
// the committer's state, for runs over many nodes, after an aggregate of an
// earlier version (nodes inside) is upgraded, and after a reopen.
func TestNodeStatesApartReadBackAsCommitted(t *testing.T) {
	const nodes, perNode, runs = 40, 75, 2 // over PeakHorizon, so buckets fold
	now := time.Now()
	batch := func(n, i int) *trainmeterv1.Batch {
		return loadgen.MakeBatch(uint64(i+1), now.Add(time.Duration(i)*time.Second), time.Second, fmt.Sprintf("run-%d", n%runs), 8, i == 0)
	}
	same := func(label string, a, b *aggregate.State) {
		t.Helper()
		// Both through the full encoding, so that bookkeeping compares equal.
		ab, err := a.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		bb, err := b.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		x, _ := aggregate.Unmarshal(ab)
		y, _ := aggregate.Unmarshal(bb)
		if !reflect.DeepEqual(x, y) || len(x.Nodes) == 0 {
			t.Fatalf("%s: the stored aggregate differs from the committed one (%d vs %d nodes)", label, len(x.Nodes), len(y.Nodes))
		}
	}
	dir := t.TempDir()
	s := open(t, dir)
	apply := func(from, to int) {
		var wg sync.WaitGroup
		for n := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				last := to
				if n < 4 {
					// A few nodes fall silent early: the others' windows then
					// fold buckets of theirs in commits they are not part of.
					last = from + 5
				}
				for i := from; i < last; i++ {
					if _, err := s.ApplyBatch(fmt.Sprintf("node-%d", n), "boot", batch(n, i)); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	check := func(label string) {
		t.Helper()
		for r := range runs {
			id := fmt.Sprintf("run-%d", r)
			disk, err := s.GetRun(id)
			if err != nil {
				t.Fatal(err)
			}
			s.aggMu.Lock()
			cached := s.aggs.get(id)
			s.aggMu.Unlock()
			if cached == nil {
				t.Fatalf("%s: %s not cached", label, id)
			}
			same(label+" "+id, disk, cached)
			listed, err := s.ListRuns(nil)
			if err != nil {
				t.Fatal(err)
			}
			same(label+" listed "+id, listed[r], cached)
		}
	}
	apply(0, perNode/2)
	check("first half")

	apply(perNode/2, perNode)
	check("second half")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	for r := range runs {
		got, err := s.GetRun(fmt.Sprintf("run-%d", r))
		if err != nil {
			t.Fatal(err)
		}
		if !got.GetNodesApart() || len(got.Nodes) != nodes/runs {
			t.Fatalf("after reopen run-%d: apart %v, %d nodes, %d tokens", r, got.GetNodesApart(), len(got.Nodes), got.Tokens)
		}
	}
	// Deleting a run takes its node states with it: a new run of the same
	// id starts with none.
	if _, err := s.DeleteRun("run-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ApplyBatch("node-new", "boot", batch(1, 0)); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetRun("run-1"); err != nil || len(got.Nodes) != 1 || got.GetNodesApart() {
		t.Fatalf("run-1 again after delete: err %v, %d nodes (apart %v), want only node-new, inside", err, len(got.Nodes), got.GetNodesApart())
	}
	// A second node moves the node states apart, the first one included.
	if _, err := s.ApplyBatch("node-second", "boot", batch(1, 0)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	defer s.Close()
	if got, err := s.GetRun("run-1"); err != nil || len(got.Nodes) != 2 || !got.GetNodesApart() || len(got.Nodes["node-new"].GetGpus()) != 8 {
		t.Fatalf("run-1 with two nodes: err %v, %d nodes (apart %v), node-new GPUs %v", err, len(got.Nodes), got.GetNodesApart(), got.Nodes["node-new"].GetGpus())
	}
}

// With a commit window, batches that arrive within it share one commit, and
// each caller is answered only once its batch is committed (readable from
// the database, not from the committer's cache).
func TestCommitWindowGroupsConcurrentBatchesAndAnswersAfterCommit(t *testing.T) {
	const nodes = 16
	s, err := Open(t.TempDir(), Options{Logger: quiet(), CommitWindow: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for n := 0; n < nodes; n++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run := fmt.Sprintf("run-%d", n)
			<-start
			if _, err := s.ApplyBatch(fmt.Sprintf("node-%d", n), "boot", loadgen.MakeBatch(1, now, time.Second, run, 8, true)); err != nil {
				t.Error(err)
				return
			}
			err := s.db.View(func(txn *badger.Txn) error {
				_, err := txn.Get(aggKey(run))
				return err
			})
			if err != nil {
				t.Errorf("%s: answered before its aggregate was committed: %v", run, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if got := s.CommitStats(); got != (CommitStats{Commits: 1, Batches: nodes}) {
		t.Errorf("commit stats %+v, want all %d batches in one commit", got, nodes)
	}

	// Without a window, a batch nobody else is waiting with commits alone.
	solo := open(t, t.TempDir())
	defer solo.Close()
	for i := 1; i <= 3; i++ {
		if _, err := solo.ApplyBatch("node", "boot", loadgen.MakeBatch(uint64(i), now.Add(time.Duration(i)*time.Second), time.Second, "r", 8, i == 1)); err != nil {
			t.Fatal(err)
		}
	}
	if got := solo.CommitStats(); got != (CommitStats{Commits: 3, Batches: 3}) {
		t.Errorf("no window, sequential batches: %+v, want 3 commits of 1", got)
	}
}

// A batch holds its node's lock stripe until its commit is durable, commit
// window included, so nodes sharing a stripe commit one after the other.
// Many nodes arriving together must still share one or two commits, not
// queue up behind each other a window at a time.
func TestManyNodesWithinOneWindowAreNotSerializedByLockStripes(t *testing.T) {
	const nodes = 200
	s, err := Open(t.TempDir(), Options{Logger: quiet(), CommitWindow: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for n := 0; n < nodes; n++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if _, err := s.ApplyBatch(fmt.Sprintf("node-%d", n), "boot", loadgen.MakeBatch(1, now, time.Second, fmt.Sprintf("run-%d", n), 8, true)); err != nil {
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if got := s.CommitStats(); got.Batches != nodes || got.Commits > 2 {
		t.Errorf("commit stats %+v: %d nodes arriving together took more than 2 commits", got, nodes)
	}
}

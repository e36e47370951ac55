package store

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

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

package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/internal/testkit"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

func TestMain(m *testing.M) {
	// badger's global ristretto/z caches keep a few goroutines for the process.
	goleak.VerifyTestMain(m, testkit.GoleakOptions()...)
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func ts(s int) *timestamppb.Timestamp { return timestamppb.New(t0.Add(time.Duration(s) * time.Second)) }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir, Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func batch(seq uint64, run string, sec int, tokens uint64, energy float64, events ...*trainmeterv1.RunEvent) *trainmeterv1.Batch {
	return &trainmeterv1.Batch{
		Seq: seq, WindowStart: ts(sec), WindowEnd: ts(sec + 1),
		RunWindows: []*trainmeterv1.RunWindow{{
			RunId: run, Start: ts(sec), End: ts(sec + 1), Phase: trainmeterv1.Phase_PHASE_MEASURED,
			EnergyCounterJ: energy, CounterOk: true, EnergyIntegratedJ: energy, Tokens: tokens,
			TokensMeasured: tokens, GpuSeconds: 1, Gpus: []uint32{0},
		}},
		GpuWindows: []*trainmeterv1.GpuWindow{{Gpu: 0, EnergyCounterJ: energy, CounterOk: true}},
		Host:       &trainmeterv1.HostWindow{CpuPct: 10},
		RunEvents:  events,
	}
}

func runStart(run string, sec int) *trainmeterv1.RunEvent {
	return &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunStart{RunStart: &trainmeterv1.RunStart{
		RunId: run, Time: ts(sec), Metadata: &trainmeterv1.RunMetadata{Model: "m"},
	}}}
}

func TestApplyDedupAndReopen(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if dup, err := s.ApplyBatch("n1", "boot1", batch(1, "r1", 0, 100, 50, runStart("r1", 0))); dup || err != nil {
		t.Fatalf("first apply: dup=%v err=%v", dup, err)
	}
	if dup, err := s.ApplyBatch("n1", "boot1", batch(1, "r1", 0, 100, 50)); !dup || err != nil {
		t.Fatalf("resend: dup=%v err=%v", dup, err)
	}
	// Same seq from another boot is a different batch.
	if dup, err := s.ApplyBatch("n1", "boot2", batch(1, "r1", 1, 100, 50)); dup || err != nil {
		t.Fatalf("new boot: dup=%v err=%v", dup, err)
	}
	check := func(s *Store) {
		t.Helper()
		st, err := s.GetRun("r1")
		if err != nil {
			t.Fatal(err)
		}
		r := st.Report(aggregate.Pricing{})
		if r.TokensProcessed != 200 || r.EnergyJ != 100 || r.GetMetadata().GetModel() != "m" {
			t.Fatalf("tokens %d energy %v model %q", r.TokensProcessed, r.EnergyJ, r.GetMetadata().GetModel())
		}
		ws, err := s.RunWindows("r1")
		if err != nil || len(ws) != 2 {
			t.Fatalf("raw windows: %d %v", len(ws), err)
		}
		nodes, err := s.Nodes()
		if err != nil || len(nodes) != 1 || nodes[0].GetLastSeq() != 1 || nodes[0].GetBootId() != "boot2" {
			t.Fatalf("nodes: %v %v", nodes, err)
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	defer s.Close()
	check(s)
	if dup, err := s.ApplyBatch("n1", "boot1", batch(1, "r1", 0, 100, 50)); !dup || err != nil {
		t.Fatalf("resend after reopen: dup=%v err=%v", dup, err)
	}
	if _, err := s.GetRun("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown run: %v", err)
	}
	if _, err := s.ListRuns([]string{"r1", "nope"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("ListRuns unknown: %v", err)
	}
}

func TestConcurrentNodesOneRun(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	gc := &GC{Store: s, Interval: 5 * time.Millisecond}
	if err := gc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	const nodes, batches = 4, 40
	var wg sync.WaitGroup
	errs := make(chan error, nodes*batches)
	for n := 0; n < nodes; n++ {
		wg.Add(1)
		go func(n int) {
			defer wg.Done()
			node := fmt.Sprintf("node-%d", n)
			for i := 1; i <= batches; i++ {
				var evs []*trainmeterv1.RunEvent
				if i == 1 {
					evs = append(evs, runStart("shared", 0))
				}
				// Every batch twice: at-least-once delivery.
				for k := 0; k < 2; k++ {
					if _, err := s.ApplyBatch(node, "b", batch(uint64(i), "shared", i, 10, 1.5, evs...)); err != nil {
						errs <- err
					}
				}
			}
		}(n)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st, err := s.GetRun("shared")
	if err != nil {
		t.Fatal(err)
	}
	r := st.Report(aggregate.Pricing{})
	if r.TokensProcessed != nodes*batches*10 || r.EnergyTotalJ != nodes*batches*1.5 || r.Nodes != nodes || r.Gpus != nodes {
		t.Fatalf("tokens %d energy %v nodes %d gpus %d", r.TokensProcessed, r.EnergyTotalJ, r.Nodes, r.Gpus)
	}
	if err := gc.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.RunGC()
}

func TestOpenCorruptDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "MANIFEST"), []byte("this is not a manifest at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, Options{Logger: quiet()})
	if err == nil {
		s.Close()
		t.Fatal("opened a corrupt directory")
	}
	t.Log(err)

	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(file, Options{Logger: quiet()}); err == nil {
		s.Close()
		t.Fatal("opened a plain file")
	}
}

func TestKeysDoNotCollide(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	// "a" is a prefix of "a/b": their series must stay apart.
	for i, run := range []string{"a", "a/b", "a\u00e9"} {
		if _, err := s.ApplyBatch("n", "b", batch(uint64(i+1), run, i, uint64(i+1), 1, runStart(run, i))); err != nil {
			t.Fatal(err)
		}
	}
	ws, err := s.RunWindows("a")
	if err != nil || len(ws) != 1 || ws[0].GetTokens() != 1 {
		t.Fatalf("windows of a: %v %v", ws, err)
	}
	all, err := s.ListRuns(nil)
	if err != nil || len(all) != 3 || all[0].RunId != "a" {
		t.Fatalf("ListRuns: %d %v", len(all), err)
	}
}

// A node's stored status follows its batches at most every nodeStatusEvery,
// and is complete again after Close and before a hello.
func TestNodeStatusIsWrittenEveryFewSecondsAndOnClose(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	s, err := Open(dir, Options{Logger: quiet(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	stored := func(s *Store) (uint64, time.Time) {
		t.Helper()
		nodes, err := s.Nodes()
		if err != nil || len(nodes) != 1 {
			t.Fatalf("nodes %v %v", nodes, err)
		}
		return nodes[0].GetLastSeq(), nodes[0].GetLastSeen().AsTime()
	}
	apply := func(s *Store, seq uint64) {
		t.Helper()
		if _, err := s.ApplyBatch("n1", "boot", batch(seq, "r1", int(seq), 10, 1)); err != nil {
			t.Fatal(err)
		}
	}
	apply(s, 1)
	if seq, _ := stored(s); seq != 1 {
		t.Fatalf("a new node's status is not stored at once: last seq %d", seq)
	}
	clk.Advance(time.Second)
	apply(s, 2)
	if seq, _ := stored(s); seq != 1 {
		t.Fatalf("status rewritten a second later: last seq %d, want still 1", seq)
	}
	clk.Advance(nodeStatusEvery)
	apply(s, 3)
	if seq, seen := stored(s); seq != 3 || !seen.Equal(clk.Now()) {
		t.Fatalf("after %v: last seq %d seen %v, want 3 at %v", nodeStatusEvery, seq, seen, clk.Now())
	}
	clk.Advance(time.Second)
	apply(s, 4)
	// A hello reads the stored status: it gets the newest first.
	if err := s.PutHello(&trainmeterv1.Hello{Node: "n1", BootId: "boot", HostEnergyStatus: "ok: 1 socket(s), package"}); err != nil {
		t.Fatal(err)
	}
	if seq, _ := stored(s); seq != 4 {
		t.Fatalf("after a hello: last seq %d, want 4", seq)
	}
	clk.Advance(time.Second)
	apply(s, 5)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, Options{Logger: quiet(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if seq, seen := stored(s); seq != 5 || !seen.Equal(clk.Now()) {
		t.Fatalf("after Close: last seq %d seen %v, want 5 at %v", seq, seen, clk.Now())
	}
	// The hello's host energy status outlives the committer's rewrites and
	// a restart: `trainmeter nodes` shows it for an agent that is away.
	nodes, err := s.Nodes()
	if err != nil || len(nodes) != 1 || nodes[0].GetHostEnergyStatus() != "ok: 1 socket(s), package" {
		t.Fatalf("after Close: nodes %v %v, want n1 with its host energy status", nodes, err)
	}
}

// Seqs above the highest applied one are new without a lookup; below it a
// seq is a duplicate only if it was applied (a batch that filled a gap is
// not), before and after a restart, per boot.
func TestDedupBelowAndAboveTheHighestSeq(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	want := func(s *Store, boot string, seq uint64, dup bool) {
		t.Helper()
		got, err := s.ApplyBatch("n1", boot, batch(seq, "r1", int(seq), 10, 1, runStart("r1", 0)))
		if err != nil || got != dup {
			t.Fatalf("%s seq %d: duplicate=%v err=%v, want duplicate=%v", boot, seq, got, err, dup)
		}
	}
	for _, seq := range []uint64{1, 2, 5} {
		want(s, "b1", seq, false)
	}
	want(s, "b1", 3, false) // a gap filled late
	want(s, "b1", 5, true)
	want(s, "b1", 3, true)
	want(s, "b2", 2, false) // another boot numbers afresh
	want(s, "b1", 6, false)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	defer s.Close()
	want(s, "b1", 4, false)
	for _, seq := range []uint64{1, 2, 3, 4, 5, 6} {
		want(s, "b1", seq, true)
	}
	want(s, "b2", 2, true)
	want(s, "b2", 1, false)
	want(s, "b1", 7, false)
	st, err := s.GetRun("r1")
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Report(aggregate.Pricing{}).GetTokensProcessed(); got != 9*10 {
		t.Fatalf("tokens %d, want %d (each of the 9 distinct batches once)", got, 9*10)
	}
}

package store

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

func openWith(t *testing.T, dir string, o Options) *Store {
	t.Helper()
	o.Logger = quiet()
	s, err := Open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func applyResult(t *testing.T, s *Store, node string, b *trainmeterv1.Batch) Applied {
	t.Helper()
	a, err := s.ApplyBatchResult(Sender{Node: node, Boot: "boot-" + node}, b)
	if err != nil {
		t.Fatalf("%s seq %d: %v", node, b.GetSeq(), err)
	}
	return a
}

func reportOf(t *testing.T, s *Store, run string) *trainmeterv1.RunReport {
	t.Helper()
	st, err := s.GetRun(run)
	if err != nil {
		t.Fatal(err)
	}
	return st.Report(aggregate.Pricing{})
}

func droppedOf(a Applied, run string) int {
	for _, d := range a.Dropped {
		if d.RunID == run {
			return d.Records
		}
	}
	return -1
}

// node1's run, started, 3 windows, ended at second 4.
func endedVictim(t *testing.T, s *Store) *trainmeterv1.RunReport {
	t.Helper()
	applyResult(t, s, "node1", batch(1, "victim", 1, 100, 50, runStart("victim", 1)))
	applyResult(t, s, "node1", batch(2, "victim", 2, 100, 50))
	applyResult(t, s, "node1", batch(3, "victim", 3, 100, 50, endEv("victim", 4)))
	return reportOf(t, s, "victim")
}

// Another node's windows, events and loss records of an ended run are
// dropped and counted; the rest of its batch is applied; the run's report
// does not change at all.
func TestAnotherNodesRecordsOfAnEndedRunAreDropped(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	before := endedVictim(t, s)

	b := batch(1, "victim", 5, 1000, 1e12)
	for range 19 {
		b.RunWindows = append(b.RunWindows, proto.Clone(b.RunWindows[0]).(*trainmeterv1.RunWindow))
	}
	b.RunEvents = append(b.RunEvents, endEv("victim", 6),
		&trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_Eval{Eval: &trainmeterv1.Eval{RunId: "victim", Time: ts(5), ValLoss: proto.Float64(1)}}})
	b.Losses = []*trainmeterv1.DataLoss{{RunId: "victim", Batches: 3, EnergyJ: 1e9, Reason: "spool full"}}
	b.HostEnergy = []*trainmeterv1.HostEnergy{{Start: ts(5), End: ts(6), CpuEnergyJ: 10, Runs: []*trainmeterv1.HostEnergyShare{{RunId: "victim", CpuEnergyJ: 10}}}}
	a := applyResult(t, s, "node2", b)
	if got := droppedOf(a, "victim"); got != 24 {
		t.Fatalf("dropped %d records of victim (%+v), want 24: 20 windows, an end, an eval, a loss record, a host share", got, a.Dropped)
	}
	if !strings.Contains(a.Dropped[0].Reason, `run "victim": node node2 did not start it`) {
		t.Errorf("reason %q", a.Dropped[0].Reason)
	}
	if after := reportOf(t, s, "victim"); !proto.Equal(before, after) {
		t.Errorf("victim's report changed:\nbefore %v\nafter  %v", before, after)
	}
	// The rest of the batch (node2's GPU record) was applied.
	nodes, err := s.Nodes()
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 2 || nodes[1].GetNode() != "node2" || nodes[1].GetLastSeq() != 1 {
		t.Errorf("nodes after node2's batch: %v", nodes)
	}
	// A start of it from node2 is refused (it ended everywhere), with the
	// window after it.
	a = applyResult(t, s, "node2", batch(2, "victim", 7, 1000, 1e3, runStart("victim", 7)))
	if len(a.Refused) != 1 || a.Refused[0].RunID != "victim" {
		t.Errorf("refused %+v, want victim's start", a.Refused)
	}
	if after := reportOf(t, s, "victim"); !proto.Equal(before, after) {
		t.Errorf("victim's report changed by a refused start:\nbefore %v\nafter  %v", before, after)
	}
}

// The node that ran the run may still send its records up to EndGrace
// after its end (the end's window, a batch later); not later.
func TestOwnRecordsWithinTheEndGraceAreKept(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	endedVictim(t, s)                                               // ended at second 4
	a := applyResult(t, s, "node1", batch(4, "victim", 4, 100, 50)) // ends at 5: within the grace
	if len(a.Dropped) != 0 {
		t.Fatalf("the end's window was dropped: %+v", a.Dropped)
	}
	if got := reportOf(t, s, "victim").GetTokensProcessed(); got != 400 {
		t.Errorf("tokens %d, want 400", got)
	}
	a = applyResult(t, s, "node1", batch(5, "victim", 30, 100, 50)) // ends at 31: 27 s after the end
	if got := droppedOf(a, "victim"); got != 1 || !strings.Contains(a.Dropped[0].Reason, "ended on node node1") {
		t.Errorf("a window 27 s after the end: dropped %+v", a.Dropped)
	}
	// A loss record of its own ended run is kept whenever it comes.
	b := batch(6, "victim", 40, 0, 0)
	b.RunWindows = nil
	b.Losses = []*trainmeterv1.DataLoss{{RunId: "victim", Batches: 1, Tokens: 7, Reason: "spool full"}}
	if a = applyResult(t, s, "node1", b); len(a.Dropped) != 0 {
		t.Errorf("own loss record dropped: %+v", a.Dropped)
	}
	if got := reportOf(t, s, "victim").GetLostTokens(); got != 7 {
		t.Errorf("lost tokens %d, want 7", got)
	}
}

// Windows of runs nobody started make no run: no aggregate is written.
func TestRecordsOfRunsNeverStartedMakeNoRun(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	b := batch(1, "ghost-0", 1, 10, 1)
	for i := 1; i < 1000; i++ {
		w := proto.Clone(b.RunWindows[0]).(*trainmeterv1.RunWindow)
		w.RunId = "ghost-" + string(rune('a'+i%26)) + strings.Repeat("x", i%7) + string(rune('0'+i%10))
		b.RunWindows = append(b.RunWindows, w)
	}
	a := applyResult(t, s, "node2", b)
	total := 0
	for _, d := range a.Dropped {
		total += d.Records
	}
	if total != 1000 {
		t.Errorf("dropped %d records, want 1000", total)
	}
	runs, err := s.ListRuns(nil)
	if err != nil || len(runs) != 0 {
		t.Errorf("runs after windows of runs never started: %d %v, want none", len(runs), err)
	}
	if got := keysByPrefix(t, s, "a/", "w/"); got["a/"] != 0 || got["w/"] != 0 {
		t.Errorf("keys %v, want no aggregate and no run window", got)
	}
}

// A window whose energy its GPUs cannot draw is dropped, even in the
// node's own live run.
func TestImplausibleWindowEnergyIsDropped(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	applyResult(t, s, "node1", batch(1, "r", 1, 10, 100, runStart("r", 1)))
	a := applyResult(t, s, "node1", batch(2, "r", 2, 10, 1e12)) // 1 GPU-s
	if got := droppedOf(a, "r"); got != 1 || !strings.Contains(a.Dropped[0].Reason, "more than its 1 GPU-s can draw") {
		t.Errorf("dropped %+v", a.Dropped)
	}
	b := batch(3, "r", 3, 10, 100)
	b.RunWindows[0].GpuSeconds = 1e9 // in a 1 s window of a node of 1 GPU
	b.RunWindows[0].EnergyCounterJ = 1e12
	a = applyResult(t, s, "node1", b)
	if got := droppedOf(a, "r"); got != 1 || !strings.Contains(a.Dropped[0].Reason, "GPU-s, more than node node1's 1 GPUs can") {
		t.Errorf("dropped %+v", a.Dropped)
	}
	if e := reportOf(t, s, "r").GetEnergyTotalJ(); e != 100 {
		t.Errorf("energy %v J, want 100 (the plausible window only)", e)
	}
}

// A node may join another node's live run (ranks of one job on two nodes)
// and write into it while it is live there.
func TestJoinOfALiveRunIsAuthorized(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	applyResult(t, s, "node1", batch(1, "job", 1, 10, 100, runStart("job", 1)))
	a := applyResult(t, s, "node2", batch(1, "job", 2, 10, 100, runStart("job", 2)))
	if len(a.Dropped) != 0 || len(a.Refused) != 0 {
		t.Fatalf("join refused: %+v %+v", a.Dropped, a.Refused)
	}
	applyResult(t, s, "node2", batch(2, "job", 3, 10, 100))
	if got := reportOf(t, s, "job").GetTokensProcessed(); got != 30 {
		t.Errorf("tokens %d, want 30", got)
	}
}

func startsBatch(seq uint64, sec int, runs ...string) *trainmeterv1.Batch {
	b := &trainmeterv1.Batch{Seq: seq, WindowStart: ts(sec), WindowEnd: ts(sec + 1)}
	for _, r := range runs {
		b.RunEvents = append(b.RunEvents, runStart(r, sec))
	}
	return b
}

// The live runs of a node are bounded: a start beyond is refused (the
// agent is told, naming the limit) and makes no run; an end frees a
// place; the bound holds across a reopen (the index is rebuilt).
func TestLiveRunsPerNodeAreBounded(t *testing.T) {
	dir := t.TempDir()
	s := openWith(t, dir, Options{Limits: Limits{MaxLiveRunsPerNode: 3}})
	a := applyResult(t, s, "n", startsBatch(1, 1, "a", "b", "c", "d"))
	if len(a.Refused) != 1 || a.Refused[0].RunID != "d" || !strings.Contains(a.Refused[0].Reason, "already has 3 live runs") {
		t.Fatalf("refused %+v, want d's start, naming the limit", a.Refused)
	}
	if _, err := s.GetRun("d"); err == nil {
		t.Error("the refused run has an aggregate")
	}
	// Another node has its own bound.
	if a := applyResult(t, s, "other", startsBatch(1, 1, "x")); len(a.Refused) != 0 {
		t.Errorf("another node refused: %+v", a.Refused)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openWith(t, dir, Options{Limits: Limits{MaxLiveRunsPerNode: 3}})
	defer s.Close()
	if a := applyResult(t, s, "n", startsBatch(2, 2, "e")); len(a.Refused) != 1 {
		t.Fatalf("after a reopen: refused %+v, want e's start", a.Refused)
	}
	b := startsBatch(3, 3, "e")
	b.RunEvents = append([]*trainmeterv1.RunEvent{endEv("a", 3)}, b.RunEvents...)
	if a := applyResult(t, s, "n", b); len(a.Refused) != 0 {
		t.Fatalf("after a's end: refused %+v", a.Refused)
	}
	runs, err := s.ListRuns(nil)
	if err != nil || len(runs) != 5 {
		t.Errorf("%d runs (%v), want a, b, c, e, x", len(runs), err)
	}
}

// The new runs a node starts are bounded per minute (a bucket refilled
// over the minute); joins and re-starts of a node's own live runs are not
// new.
func TestNewRunsPerMinuteAreBounded(t *testing.T) {
	clk := clock.NewFake(t0)
	s := openWith(t, t.TempDir(), Options{Clock: clk, Limits: Limits{MaxNewRunsPerMinute: 2}})
	defer s.Close()
	a := applyResult(t, s, "n", startsBatch(1, 1, "a", "b", "c"))
	if len(a.Refused) != 1 || a.Refused[0].RunID != "c" || !strings.Contains(a.Refused[0].Reason, "limit of 2 new runs a minute") {
		t.Fatalf("refused %+v, want c's start, naming the limit", a.Refused)
	}
	if a := applyResult(t, s, "n", startsBatch(2, 2, "a", "c")); len(a.Refused) != 1 || a.Refused[0].RunID != "c" {
		t.Fatalf("refused %+v, want c again and a (live) accepted", a.Refused)
	}
	clk.Advance(30 * time.Second) // one run's worth refilled
	if a := applyResult(t, s, "n", startsBatch(3, 3, "c", "d")); len(a.Refused) != 1 || a.Refused[0].RunID != "d" {
		t.Fatalf("30 s later: refused %+v, want d only", a.Refused)
	}
}

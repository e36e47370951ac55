package store

import (
	"bytes"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

func endEv(run string, sec int) *trainmeterv1.RunEvent {
	return &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunEnd{RunEnd: &trainmeterv1.RunEnd{
		RunId: run, Time: ts(sec), EndStatus: "ok"}}}
}

func evalEv(run string, sec int) *trainmeterv1.RunEvent {
	return &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_Eval{Eval: &trainmeterv1.Eval{
		RunId: run, Time: ts(sec), Epoch: proto.Int64(1), ValLoss: proto.Float64(0.5)}}}
}

// reportBytes is the run's report as the API gives it, encoded
// deterministically: equal bytes, equal figures.
func reportBytes(t *testing.T, s *Store, run string) []byte {
	t.Helper()
	st, err := s.GetRun(run)
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(st.Report(aggregate.Pricing{GPUPricePerHour: 3.6}))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// runOn applies a whole run of one node: a start at from, one 1 s window of
// tokens per second, an end at to.
func runOn(t *testing.T, s *Store, node string, seq uint64, run string, from, to int, tokens uint64, startFields func(*trainmeterv1.RunStart)) uint64 {
	t.Helper()
	for sec := from; sec < to; sec++ {
		var evs []*trainmeterv1.RunEvent
		if sec == from {
			ev := startEv(run, from)
			if startFields != nil {
				startFields(ev.GetRunStart())
			}
			evs = append(evs, ev)
		}
		if sec == to-1 {
			evs = append(evs, evalEv(run, sec), endEv(run, to))
		}
		b := batch(seq, run, sec, tokens, 100, evs...)
		b.HostEnergy = []*trainmeterv1.HostEnergy{hostPart(sec, sec+1, 20, run)}
		b.GpuWindows[0].GpuSeconds = 1
		if _, err := s.ApplyBatch(node, "boot-"+node, b); err != nil {
			t.Fatal(err)
		}
		seq++
	}
	return seq
}

// The run shareA ended on box1; 20 s later shareA starts on box2 without
// resume. Before: the collector merged both into one run (2 nodes, tokens
// summed, wall time across the gap). Now the start is refused and nothing
// of box2's records reaches the ended run: its report is byte-identical.
func TestRunIDReusedOnAnotherNodeAfterItEndedIsRefused(t *testing.T) {
	s, err := Open(t.TempDir(), Options{Logger: quiet(), Clock: clock.NewFake(t0.Add(time.Minute))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	runOn(t, s, "box1", 1, "shareA", 0, 10, 100, nil)
	before := reportBytes(t, s, "shareA")

	runOn(t, s, "box2", 1, "shareA", 30, 35, 500, nil)
	if after := reportBytes(t, s, "shareA"); !bytes.Equal(before, after) {
		st, _ := s.GetRun("shareA")
		r := st.Report(aggregate.Pricing{})
		t.Fatalf("the refused start changed the ended run: nodes %d, tokens %d, wall %.0f s, status %q",
			r.GetNodes(), r.GetTokensProcessed(), r.GetWallS(), r.GetEndStatus())
	}
	ws, err := s.RunWindows("shareA")
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 10 {
		t.Errorf("%d raw windows of shareA, want box1's 10 (box2's refused ones must not be stored under it)", len(ws))
	}
}

// The refusal is what the ingest stream tells the agent: on the batch
// with the refused start, and again on a later batch of that node whose
// records of the run were dropped. The dropped windows' GPU time is the
// node's idle, so usage still adds up to the node.
func TestRefusedStartIsReportedAndItsGPUTimeIsIdle(t *testing.T) {
	s, err := Open(t.TempDir(), Options{Logger: quiet(), Clock: clock.NewFake(t0.Add(time.Minute))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	runOn(t, s, "box1", 1, "shareA", 0, 10, 100, nil)

	b := batch(1, "shareA", 30, 500, 100, startEv("shareA", 30))
	b.GpuWindows[0].GpuSeconds = 1
	a, err := s.ApplyBatchResult(Sender{Node: "box2", Boot: "b2"}, b)
	if err != nil || a.Duplicate || len(a.Refused) != 1 {
		t.Fatalf("the refused start: %+v, %v; want one refusal", a, err)
	}
	r := a.Refused[0]
	if r.RunID != "shareA" || r.Start != t0.Add(30*time.Second).UnixNano() || r.Records != 2 {
		t.Errorf("refusal %+v: want shareA, the start's time, 2 records (start, window) dropped", r)
	}
	for _, want := range []string{`run "shareA" already ended`, "box1", "(ok)", "resume=true", "new run_id"} {
		if !bytes.Contains([]byte(r.Reason), []byte(want)) {
			t.Errorf("reason %q lacks %q", r.Reason, want)
		}
	}
	a, err = s.ApplyBatchResult(Sender{Node: "box2", Boot: "b2"}, batch(2, "shareA", 31, 500, 100))
	if err != nil || len(a.Refused) != 1 || a.Refused[0].Records != 1 {
		t.Fatalf("a later batch of the refused run: %+v, %v; want its window dropped and the refusal again", a, err)
	}
	// A batch without the run says nothing.
	a, err = s.ApplyBatchResult(Sender{Node: "box2", Boot: "b2"}, batch(3, "other", 32, 5, 100, startEv("other", 32)))
	if err != nil || len(a.Refused) != 0 {
		t.Fatalf("another run's batch: %+v, %v", a, err)
	}

	var idleS, runS float64
	err = s.UsageScan(time.Time{}, time.Time{}, func(node string, b *trainmeterv1.Batch) error {
		if node == "box2" && b.GetWindowStart().AsTime().Before(t0.Add(32*time.Second)) {
			for _, gw := range b.GetGpuWindows() {
				idleS += gw.GetIdleGpuSeconds()
			}
		}
		return nil
	}, func(run, node string, w *trainmeterv1.RunWindow) error {
		if node == "box2" && run == "shareA" {
			runS += w.GetGpuSeconds()
		}
		return nil
	}, func(string, *storev1.DeletedRunWindow) error {
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if idleS != 2 || runS != 0 {
		t.Errorf("box2's refused windows: idle %v GPU-s, shareA %v GPU-s; want 2 and 0", idleS, runS)
	}
}

// A start that asks to resume is accepted from another node (resume_requested:
// that node's agent did not see the run end), and reopens the run with a pause.
func TestResumeOnAnotherNodeIsAccepted(t *testing.T) {
	s, err := Open(t.TempDir(), Options{Logger: quiet(), Clock: clock.NewFake(t0.Add(time.Minute))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	runOn(t, s, "box1", 1, "shareA", 0, 10, 100, nil)
	runOn(t, s, "box2", 1, "shareA", 30, 35, 500, func(rs *trainmeterv1.RunStart) { rs.ResumeRequested = true })
	st, err := s.GetRun("shareA")
	if err != nil {
		t.Fatal(err)
	}
	r := st.Report(aggregate.Pricing{})
	if r.GetTokensProcessed() != 10*100+5*500 || r.GetResumes() != 1 || r.GetPausedS() != 20 || r.GetNodes() != 2 || !r.GetEnded() {
		t.Fatalf("resumed on box2: tokens %d resumes %d paused %v nodes %d ended %v; want 3500, 1, 20, 2, true",
			r.GetTokensProcessed(), r.GetResumes(), r.GetPausedS(), r.GetNodes(), r.GetEnded())
	}
}

// Ranks of one launch join one run: box2's start 2 s after box1's, while
// the run is live on box1; and a start timestamped before the run's end
// joins even when its batch arrives after box1's end (it was in flight).
func TestRanksStartingApartOnTwoNodesJoinOneRun(t *testing.T) {
	clk := clock.NewFake(t0.Add(time.Minute)) // the collector's clock
	s, err := Open(t.TempDir(), Options{Logger: quiet(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Interleaved as two agents send them.
	for sec := 0; sec < 10; sec++ {
		var e1, e2 []*trainmeterv1.RunEvent
		if sec == 0 {
			e1 = append(e1, startEv("j", 0))
		}
		if sec == 2 {
			e2 = append(e2, startEv("j", 2))
		}
		if sec == 9 {
			e1, e2 = append(e1, endEv("j", 10)), append(e2, endEv("j", 10))
		}
		if a, err := s.ApplyBatchResult(Sender{Node: "box1", Boot: "b1"}, batch(uint64(sec+1), "j", sec, 100, 100, e1...)); err != nil || len(a.Refused) > 0 {
			t.Fatalf("box1 second %d: %+v %v", sec, a, err)
		}
		if sec >= 2 {
			if a, err := s.ApplyBatchResult(Sender{Node: "box2", Boot: "b2"}, batch(uint64(sec+1), "j", sec, 100, 100, e2...)); err != nil || len(a.Refused) > 0 {
				t.Fatalf("box2 second %d: %+v %v", sec, a, err)
			}
		}
	}
	st, _ := s.GetRun("j")
	if r := st.Report(aggregate.Pricing{}); r.GetNodes() != 2 || r.GetTokensProcessed() != 1800 || !r.GetEnded() || r.GetResumes() != 0 {
		t.Fatalf("two ranks 2 s apart: nodes %d tokens %d ended %v resumes %d; want 2, 1800, true, 0",
			r.GetNodes(), r.GetTokensProcessed(), r.GetEnded(), r.GetResumes())
	}

	// box3's start dated 5 s arrives after the run ended at 10 s on box1,
	// within aggregate.LateJoinGrace of the collector seeing that end: a
	// rank whose batch was in flight joins.
	runOn(t, s, "box1", 100, "k", 0, 10, 100, nil)
	clk.Advance(aggregate.LateJoinGrace - time.Second)
	runOn(t, s, "box3", 1, "k", 5, 10, 100, nil)
	st, _ = s.GetRun("k")
	if r := st.Report(aggregate.Pricing{}); r.GetNodes() != 2 || r.GetTokensProcessed() != 1500 || r.GetResumes() != 0 {
		t.Fatalf("a start from before the end, arriving within the grace, from another node: nodes %d tokens %d resumes %d; want 2, 1500, 0",
			r.GetNodes(), r.GetTokensProcessed(), r.GetResumes())
	}

	// box4's start dated 5 s arrives past the grace: refused (a node cannot
	// join an ended run by dating its start back), the run unchanged.
	runOn(t, s, "box1", 200, "m", 0, 10, 100, nil)
	clk.Advance(aggregate.LateJoinGrace + time.Second)
	runOn(t, s, "box4", 1, "m", 5, 10, 100, nil)
	st, _ = s.GetRun("m")
	if r := st.Report(aggregate.Pricing{}); r.GetNodes() != 1 || r.GetTokensProcessed() != 1000 || r.GetResumes() != 0 {
		t.Fatalf("a start from before the end, arriving past the grace, from another node: nodes %d tokens %d resumes %d; want 1, 1000, 0",
			r.GetNodes(), r.GetTokensProcessed(), r.GetResumes())
	}
}

package ingest

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

// FuzzForeignNodeCannotChangeOtherRuns: whatever valid batch node2 (a node
// with its own valid token) sends, the runs node1 started and ended (the
// run ids the seeds use) do not change at all. A run_start with resume is
// the membership rules' explicit way to reopen an ended run from any node
// (docs/protocol.md), so the fuzzer's starts are stripped of it. node2's
// batches come past aggregate.LateJoinGrace after node1's ends (within it a
// start dated before an end may join: a rank whose batch was in flight).
func FuzzForeignNodeCannotChangeOtherRuns(f *testing.F) {
	addSeeds(f)
	victims := []string{"r1", "r2", "a", "b"}
	clk := clock.NewFake(tu.Now())
	s, err := store.Open(f.TempDir(), store.Options{Limits: store.Limits{MaxLiveRunsPerNode: 16, MaxNewRunsPerMinute: 64},
		Clock: clk})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	node1 := store.Sender{Node: "node1", Boot: "boot1"}
	for i, run := range victims {
		b := tu.Batch(uint64(i+1), 0, []*trainmeterv1.RunWindow{tu.Window(run, 0, 100, 50), tu.Window(run, 1, 100, 50)},
			tu.Start(run, 0, "m"), tu.End(run, 2.5))
		if _, err := s.ApplyBatchResult(node1, b); err != nil {
			f.Fatal(err)
		}
	}
	reports := func() map[string]*trainmeterv1.RunReport {
		out := map[string]*trainmeterv1.RunReport{}
		for _, run := range victims {
			st, err := s.GetRun(run)
			if err != nil {
				f.Fatal(err)
			}
			out[run] = st.Report(aggregate.Pricing{})
		}
		return out
	}
	want := reports()
	clk.Advance(aggregate.LateJoinGrace + time.Minute)
	seq := uint64(0)
	f.Fuzz(func(t *testing.T, raw []byte) {
		var b trainmeterv1.Batch
		if proto.Unmarshal(raw, &b) != nil || ValidateBatch(&b) != nil {
			return
		}
		for _, e := range b.GetRunEvents() {
			if st := e.GetRunStart(); st != nil {
				st.Resume, st.ResumeRequested = false, false
			}
		}
		seq++
		b.Seq = seq
		if _, err := s.ApplyBatchResult(store.Sender{Node: "node2", Boot: "boot2"}, &b); err != nil {
			return // too large for a transaction: nothing applied
		}
		for run, r := range reports() {
			if !proto.Equal(r, want[run]) {
				t.Fatalf("node2's batch changed node1's run %s:\nbefore %v\nafter  %v\nbatch %v", run, want[run], r, &b)
			}
		}
	})
}

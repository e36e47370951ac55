package store

import (
	"errors"
	"testing"
	"time"

	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

func startEv(run string, sec int) *trainmeterv1.RunEvent {
	return &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunStart{RunStart: &trainmeterv1.RunStart{
		RunId: run, Time: ts(sec), Metadata: &trainmeterv1.RunMetadata{Model: "m"}}}}
}

// A live run deleted with force does not come back from the batches its
// agent sends afterwards (before: it came back without metadata, running
// for ever), even across a collector restart; a run_start after the
// deletion starts the id afresh.
func TestDeletedLiveRunStaysDeleted(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewFake(t0.Add(5 * time.Second))
	s, err := Open(dir, Options{Logger: quiet(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	apply := func(s *Store, b *trainmeterv1.Batch) {
		t.Helper()
		if _, err := s.ApplyBatch("n1", "boot", b); err != nil {
			t.Fatal(err)
		}
	}
	apply(s, batch(1, "live", 0, 10, 100, startEv("live", 0)))
	apply(s, batch(2, "other", 1, 10, 100, startEv("other", 1)))
	if _, err := s.DeleteLiveRun("live"); err != nil {
		t.Fatal(err)
	}
	apply(s, batch(3, "live", 6, 10, 100))
	if _, err := s.GetRun("live"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the deleted run came back: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, Options{Logger: quiet(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	apply(s, batch(4, "live", 7, 10, 100))
	if _, err := s.GetRun("live"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after a restart the deleted run came back: %v", err)
	}
	if st, err := s.GetRun("other"); err != nil || st.Tokens != 10 {
		t.Fatalf("another run: %v %v", st, err)
	}
	apply(s, batch(5, "live", 20, 7, 100, startEv("live", 20)))
	st, err := s.GetRun("live")
	if err != nil || st.Tokens != 7 || st.GetRunStart().GetMetadata().GetModel() != "m" {
		t.Fatalf("the id reused by a later run_start: %+v %v", st, err)
	}
}

// usageOfDeleted is what UsageScan gives of deleted runs' windows.
func usageOfDeleted(t *testing.T, s *Store) (out []*storev1.DeletedRunWindow, nodes []string) {
	t.Helper()
	err := s.UsageScan(time.Time{}, time.Time{},
		func(string, *trainmeterv1.Batch) error { return nil },
		func(string, string, *trainmeterv1.RunWindow) error { return nil },
		func(node string, d *storev1.DeletedRunWindow) error {
			out, nodes = append(out, d), append(nodes, node)
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	return out, nodes
}

// A deleted run's windows stay as the deleted run's usage: naming no run,
// at the run's own GPU price, one deletion id per run, across a collector
// restart; the windows a live run's agent sends after its deletion too.
func TestDeletedRunsWindowsStayAsUsage(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewFake(t0.Add(5 * time.Second))
	s, err := Open(dir, Options{Logger: quiet(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	apply := func(s *Store, b *trainmeterv1.Batch) {
		t.Helper()
		if _, err := s.ApplyBatch("n1", "boot", b); err != nil {
			t.Fatal(err)
		}
	}
	priced := func(run string, sec int) *trainmeterv1.RunEvent {
		e := startEv(run, sec)
		e.GetRunStart().GpuPricePerHour, e.GetRunStart().GpuName = 2.5, "Sim GPU"
		return e
	}
	apply(s, batch(1, "ended", 0, 10, 100, priced("ended", 0)))
	apply(s, batch(2, "ended", 1, 10, 100))
	apply(s, batch(3, "live", 2, 10, 70, priced("live", 2)))
	if n, err := s.DeleteRun("ended"); err != nil || n != 3 { // 2 windows, 1 event
		t.Fatalf("DeleteRun: %d records, %v", n, err)
	}
	if _, err := s.DeleteLiveRun("live"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, Options{Logger: quiet(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	apply(s, batch(4, "live", 6, 10, 70)) // after the deletion and a restart

	got, nodes := usageOfDeleted(t, s)
	if len(got) != 4 {
		t.Fatalf("%d deleted windows, want 4: %v", len(got), got)
	}
	ids := map[uint64]float64{}
	for i, d := range got {
		if nodes[i] != "n1" || d.GetWindow().GetRunId() != "" || d.GetGpuPricePerHour() != 2.5 || d.GetGpuName() != "Sim GPU" ||
			d.GetWindow().GetGpuSeconds() != 1 {
			t.Errorf("deleted window on %q: %v", nodes[i], d)
		}
		ids[d.GetDeletion()] += d.GetWindow().GetEnergyCounterJ()
	}
	// One deletion id per run: ended's 2 × 100 J, live's 2 × 70 J.
	if len(ids) != 2 {
		t.Errorf("deletions %v, want one per run", ids)
	}
	for _, j := range ids {
		if j != 200 && j != 140 {
			t.Errorf("deletions %v: want 200 J and 140 J", ids)
		}
	}
	if ws, _ := s.RunWindows("ended"); len(ws) != 0 {
		t.Errorf("%d windows of the deleted run left", len(ws))
	}
}

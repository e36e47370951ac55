package store

import (
	"errors"
	"testing"
	"time"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
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
	clock := func() time.Time { return t0.Add(5 * time.Second) }
	s, err := Open(dir, Options{Logger: quiet(), Now: clock})
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
	s, err = Open(dir, Options{Logger: quiet(), Now: clock})
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
	if err != nil || st.Tokens != 7 || st.Metadata.Model != "m" {
		t.Fatalf("the id reused by a later run_start: %+v %v", st, err)
	}
}

package store

import (
	"errors"
	"testing"
)

func TestDeleteRunRemovesAggregateAndRawRecordsOnly(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	// "a" is a prefix of "ab": deleting "a" must leave "ab" whole.
	for i, run := range []string{"a", "a", "ab"} {
		if _, err := s.ApplyBatch("n", "b", batch(uint64(i+1), run, i, 10, 1, runStart(run, i))); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.DeleteRun("a")
	if err != nil {
		t.Fatal(err)
	}
	if n != 4 { // 2 windows + 2 events
		t.Errorf("deleted %d raw records, want 4", n)
	}
	if _, err := s.GetRun("a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetRun after delete: %v, want not found", err)
	}
	if ws, _ := s.RunWindows("a"); len(ws) != 0 {
		t.Errorf("%d windows of a left", len(ws))
	}
	if st, err := s.GetRun("ab"); err != nil || st.RunId != "ab" {
		t.Errorf("run ab: %v %v", st, err)
	}
	if ws, _ := s.RunWindows("ab"); len(ws) != 1 {
		t.Errorf("run ab has %d windows, want 1", len(ws))
	}
	if _, err := s.DeleteRun("a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second delete: %v, want ErrNotFound", err)
	}
	// A re-sent batch that was applied before stays deduplicated: the run
	// does not come back from a retry.
	if dup, err := s.ApplyBatch("n", "b", batch(1, "a", 0, 10, 1)); err != nil || !dup {
		t.Errorf("re-sent batch: dup=%v err=%v, want a duplicate", dup, err)
	}
	if _, err := s.GetRun("a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("run came back after a re-sent batch: %v", err)
	}
}

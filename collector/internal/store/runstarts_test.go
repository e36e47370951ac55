package store

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// RunStarts gives each stored run's start as its whole aggregate has it,
// and nothing for an id not stored (a run whose start never came is not).
func TestRunStartsAreTheAggregatesStarts(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	started := runStart("started", 0)
	started.GetRunStart().User = "ana"
	started.GetRunStart().Labels = map[string]string{"team": "vision"}
	for i, b := range []*trainmeterv1.Batch{
		batch(1, "started", 0, 10, 50, started),
		batch(2, "started", 1, 10, 50),
		batch(3, "nostart", 2, 10, 50),
		batch(4, "other", 3, 10, 50, runStart("other", 3)),
	} {
		if _, err := s.ApplyBatch("n1", "boot", b); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
	}
	// Runs between the ids asked for: stepped over, or skipped by a seek.
	for i := range 20 {
		id := fmt.Sprintf("r%02d", i)
		if _, err := s.ApplyBatch("n2", "boot", batch(uint64(i+1), id, i, 10, 50, runStart(id, i))); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.RunStarts([]string{"unknown", "started", "r03", "nostart", "other"})
	if err != nil {
		t.Fatal(err)
	}
	runs, err := s.ListRuns([]string{"other", "r03", "started"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Errorf("RunStarts: %d runs %v, want other, r03 and started", len(got), got)
	}
	for _, r := range runs {
		st, ok := got[r.RunId]
		if !ok || !proto.Equal(st, r.GetRunStart()) {
			t.Errorf("run %q: start %v (%v), want the aggregate's %v", r.RunId, st, ok, r.GetRunStart())
		}
	}
	if got["started"].GetUser() != "ana" || got["started"].GetLabels()["team"] != "vision" {
		t.Errorf("starts: %v", got)
	}
}

// A start RunStarts decoded before is given again while the stored start
// is the same, and the new one once it changed (the id reused after a
// delete, with another team): the cache is keyed by the stored bytes.
func TestRunStartsAfterTheStartChanged(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	start := func(team string) *trainmeterv1.RunEvent {
		e := runStart("r", 0)
		e.GetRunStart().Labels = map[string]string{"team": team}
		return e
	}
	if _, err := s.ApplyBatch("n1", "boot", batch(1, "r", 0, 10, 50, start("a"))); err != nil {
		t.Fatal(err)
	}
	team := func() string {
		t.Helper()
		got, err := s.RunStarts([]string{"r"})
		if err != nil {
			t.Fatal(err)
		}
		return got["r"].GetLabels()["team"]
	}
	if a, again := team(), team(); a != "a" || again != "a" {
		t.Fatalf("team %q then %q, want a twice", a, again)
	}
	if _, err := s.DeleteRun("r"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ApplyBatch("n1", "boot", batch(2, "r", 5, 10, 50, start("b"))); err != nil {
		t.Fatal(err)
	}
	if got := team(); got != "b" {
		t.Errorf("team after the run started again %q, want b", got)
	}
}

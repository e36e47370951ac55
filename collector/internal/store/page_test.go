package store

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
)

// TestRunsAfterPagesListRuns: RunsAfter pages through the same runs as
// ListRuns(nil), in run id order, each once, node states (a run on two
// nodes) included.
func TestRunsAfterPagesListRuns(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	for i := range 7 {
		id := fmt.Sprintf("r%d", 6-i) // started in the reverse of id order
		if _, err := s.ApplyBatch("n1", "boot", batch(uint64(i+1), id, i, 100, 50, runStart(id, i))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.ApplyBatch("n2", "boot", batch(1, "r3", 3, 10, 5, runStart("r3", 3))); err != nil {
		t.Fatal(err)
	}
	all, err := s.ListRuns(nil)
	if err != nil || len(all) != 7 {
		t.Fatalf("ListRuns: %d runs, %v", len(all), err)
	}
	var paged []*aggregate.State
	after := ""
	for {
		page, err := s.RunsAfter(after, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > 3 {
			t.Fatalf("page of %d runs, asked for 3", len(page))
		}
		if len(page) == 0 {
			break
		}
		paged = append(paged, page...)
		after = page[len(page)-1].RunId
	}
	if len(paged) != len(all) {
		t.Fatalf("RunsAfter paged %d runs, ListRuns has %d", len(paged), len(all))
	}
	for i := range all {
		if paged[i].RunId != fmt.Sprintf("r%d", i) {
			t.Errorf("run %d of the pages is %s, want r%d", i, paged[i].RunId, i)
		}
		if a, b := paged[i].Report(aggregate.Pricing{}), all[i].Report(aggregate.Pricing{}); !proto.Equal(a, b) {
			t.Errorf("%s: the paged report differs from ListRuns':\n%v\n%v", all[i].RunId, a, b)
		}
	}
	if r3 := paged[3]; len(r3.Nodes) != 2 {
		t.Errorf("r3 has %d node states, want n1 and n2", len(r3.Nodes))
	}
	if rest, err := s.RunsAfter("r6", 3); err != nil || len(rest) != 0 {
		t.Errorf("after the last run: %d runs, %v", len(rest), err)
	}
}

package aggregate

import (
	"strings"
	"testing"
	"time"
)

// The admission rule: a start joins while the run is live on some node, or
// when it is timestamped at or before the run's end and comes from a node
// that took part in the run, or arrives within LateJoinGrace of the
// collector holding the run ended (a rank whose batch was in flight); after every node
// ended, it is refused unless it asks to resume; an accepted start from a
// refused node lifts its refusal.
func TestAdmitJoinsWhileLiveAndRefusesAfterTheEnd(t *testing.T) {
	s := New("r")
	var live time.Time // while live, the arrival time does not matter
	if a := s.Admit("a", start("a", 0, "m", 0).s, live); a != AdmitNew {
		t.Fatalf("first start: %v", a)
	}
	s.AddStart("a", start("a", 0, "m", 0).s)
	if a := s.Admit("b", start("b", 2, "m", 0).s, live); a != AdmitJoin {
		t.Fatalf("a second node while live: %v", a)
	}
	s.AddEnd("a", endWith("a", 10, "ok").e)
	seen := time.Unix(0, s.endNanos()).Add(time.Second)
	s.NoteEnded(seen)
	late := seen.Add(LateJoinGrace + time.Second)
	if a := s.Admission("c", start("c", 9, "m", 0).s, seen.Add(LateJoinGrace)); a != AdmitJoin {
		t.Fatalf("a start from before the end, arriving within the grace after it, from a node that never started the run: %v", a)
	}
	if a := s.Admission("c", start("c", 9, "m", 0).s, late); a != AdmitRefused {
		t.Fatalf("a start from before the end, arriving past the grace, from a node that never started the run: %v", a)
	}
	if a := s.Admit("a", start("a", 9, "m", 0).s, late); a != AdmitJoin {
		t.Fatalf("a start from before the end, arriving after it, from a node of the run: %v", a)
	}
	if a := s.Admit("b", start("b", 10.5, "m", 0).s, seen); a != AdmitRefused {
		t.Fatalf("a start after every node ended: %v", a)
	}
	r, ok := s.RefusedOn("b")
	if at := r.First; !ok || r.Latest != at || s.Keeps("b", at) || !s.Keeps("b", at-1) || !s.Keeps("a", at+1) {
		t.Fatalf("refusal of b %+v (%v): keeps %v before, %v from it", r, ok, s.Keeps("b", at-1), s.Keeps("b", at))
	}
	// A second refused attempt: records still dropped from the first, the
	// agent told of the latest.
	if a := s.Admit("b", start("b", 20, "m", 0).s, late); a != AdmitRefused {
		t.Fatalf("a second start after the end: %v", a)
	}
	if r2, _ := s.RefusedOn("b"); r2.First != r.First || r2.Latest != nanos(start("b", 20, "m", 0).s.GetTime()) {
		t.Fatalf("after a second refused start: %+v, want first %d and the new latest", r2, r.First)
	}
	if !strings.Contains(s.RefusalReason(), `run "r" already ended at `) || !strings.Contains(s.RefusalReason(), "on node a (ok)") {
		t.Errorf("reason %q", s.RefusalReason())
	}
	// The refusal survives the store's encoding, whole and apart.
	back, err := Unmarshal(mustEncode(t, s))
	if err != nil {
		t.Fatal(err)
	}
	apart, err := s.MarshalApart()
	if err != nil {
		t.Fatal(err)
	}
	back2, err := Unmarshal(apart)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []*State{back, back2} {
		if got, _ := b.RefusedOn("b"); got.First != r.First || got.Latest <= r.Latest {
			t.Fatalf("decoded refusal %+v", got)
		}
	}
	resumed := start("b", 30, "m", 0)
	resumed.s.ResumeRequested = true
	if a := s.Admit("b", resumed.s, late); a != AdmitResume {
		t.Fatalf("a resume from another node: %v", a)
	}
	if _, ok := s.RefusedOn("b"); ok {
		t.Error("the accepted resume left b refused")
	}
	if s.LiveOn("b") || !s.StartedOn("a") || s.LiveOn("a") {
		t.Errorf("live on b %v (not yet folded), started on a %v, live on a %v", s.LiveOn("b"), s.StartedOn("a"), s.LiveOn("a"))
	}
}

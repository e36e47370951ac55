package aggregate

import (
	"fmt"
	"sort"
	"strings"
	"time"

	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Membership: which nodes take part in a run, whether it is live there, and
// which starts the collector refused (docs/protocol.md, "Joining a run from
// several nodes"). Every rule about what a node may send for a run asks
// these methods, which read the node states and RefusedStarts.
//
// A run_start from any node joins the run while it is live on at least one
// node (ranks start seconds apart; an elastic job adds a node later). Live
// is judged by the agents' clocks: a start dated at or before the run's end
// (the latest run_end of every node) joins even when it arrives after that
// end (its batch was in flight), from a node that took part, and from
// another node only within LateJoinGrace of the collector first holding
// the run ended everywhere (EndedSeenAt), so that no node can write into a
// long-ended run by dating a start back (docs/security.md). A start later
// than the end reopens the run only if it asks to resume (RunStart.resume
// or resume_requested); otherwise it is refused, and the node's records of
// the run from that start on are dropped (Keeps) until the node sends a
// start that is accepted.

// Admission is what a RunStart does to a run.
type Admission int

const (
	// AdmitNew starts the run: nothing of it was started before.
	AdmitNew Admission = iota
	// AdmitJoin joins a live run (another rank, on this node or another).
	AdmitJoin
	// AdmitResume reopens a run that had ended on every node, with resume:
	// the time in between is a pause.
	AdmitResume
	// AdmitRefused: the run had ended on every node and the start did not
	// ask to resume.
	AdmitRefused
)

func (a Admission) String() string {
	switch a {
	case AdmitNew:
		return "new"
	case AdmitJoin:
		return "join"
	case AdmitResume:
		return "resume"
	case AdmitRefused:
		return "refused"
	}
	return fmt.Sprintf("Admission(%d)", int(a))
}

// Admit decides what ev, a RunStart from node, does to the run, and
// records a refusal (RefusedStarts); an accepted start from a node clears
// that node's refusal. It does not fold ev: the caller calls AddStart for
// an accepted one.
func (s *State) Admit(node string, ev *trainmeterv1.RunStart, now time.Time) Admission {
	t := nanos(ev.GetTime())
	a := s.Admission(node, ev, now)
	if a == AdmitRefused {
		if s.RefusedStarts == nil {
			s.RefusedStarts = map[string]*RefusedStart{}
		}
		r := &RefusedStart{First: t, Latest: t}
		if was, ok := s.RefusedStarts[node]; ok {
			r.First, r.Latest = min(was.First, t), max(was.Latest, t)
		}
		s.RefusedStarts[node] = r // a new one: RefusedOn's results stay as they were
		return a
	}
	if r, ok := s.RefusedStarts[node]; ok && t > r.Latest {
		delete(s.RefusedStarts, node)
	}
	return a
}

// RefusedStart is a node's refused starts of a run (Unix ns): its records
// of the run from First on are dropped; Latest is the start its agent's
// run has now, which a refusal sent to the agent names.
type RefusedStart = storev1.RefusedStart

// LateJoinGrace is how long after the collector first holds a run ended on
// every node a start dated before that end still joins from a node that
// had not started it.
const LateJoinGrace = 30 * time.Second

func (s *State) admission(node string, t int64, resume bool, now time.Time) Admission {
	if !s.StartedAnywhere() {
		return AdmitNew
	}
	if !s.Ended() {
		return AdmitJoin
	}
	if t <= s.endNanos() {
		// EndedSeenAt 0: the end was folded in this commit, not stamped yet.
		inFlight := s.EndedSeenAt == 0 || now.UnixNano()-s.EndedSeenAt <= int64(LateJoinGrace)
		if s.StartedOn(node) || inFlight {
			return AdmitJoin
		}
	}
	if resume {
		return AdmitResume
	}
	return AdmitRefused
}

// StartedAnywhere reports whether some node sent a RunStart for the run.
func (s *State) StartedAnywhere() bool {
	for _, n := range s.Nodes {
		if n.Started {
			return true
		}
	}
	return false
}

// StartedOn reports whether node sent an accepted RunStart for the run.
func (s *State) StartedOn(node string) bool {
	n := s.Nodes[node]
	return n != nil && n.Started
}

// LiveOn reports whether the run is live on node: started there and not
// ended since its latest start.
func (s *State) LiveOn(node string) bool {
	n := s.Nodes[node]
	return n != nil && n.Started && !nodeEnded(n)
}

// RefusedOn returns node's refused starts of the run, if its records are
// being dropped.
func (s *State) RefusedOn(node string) (*RefusedStart, bool) {
	r, ok := s.RefusedStarts[node]
	return r, ok
}

// Keeps reports whether a record of the run from node at t (Unix ns: a
// window's end, an event's time, a host energy interval's end) is folded:
// false from the node's first refused start on.
func (s *State) Keeps(node string, t int64) bool {
	r, ok := s.RefusedStarts[node]
	return !ok || t < r.First
}

// RefusalReason is the error line a trainer whose start was refused gets:
// like the agent's for a run that ended on its own node, naming where and
// when the run ended and both ways on.
func (s *State) RefusalReason() string {
	var nodes []string
	for name, n := range s.Nodes {
		if n.Started {
			nodes = append(nodes, name)
		}
	}
	sort.Strings(nodes)
	where := "node " + strings.Join(nodes, ", ")
	switch {
	case len(nodes) > 3:
		where = "nodes " + strings.Join(nodes[:3], ", ") + fmt.Sprintf(" and %d more", len(nodes)-3)
	case len(nodes) > 1:
		where = "nodes " + strings.Join(nodes, ", ")
	}
	st := s.EndStatus()
	return fmt.Sprintf("run_start: run %q already ended at %s on %s (%s); "+
		"to start a new run use a new run_id, or to continue this one send resume=true "+
		"(Python: trainmeter.start(..., resume=True); trainmeter run --resume)",
		s.RunId, time.Unix(0, s.endNanos()).UTC().Format(time.RFC3339), where, st)
}

// Admission is what ev, a RunStart, would do to the run, without recording
// anything (Admit records).
func (s *State) Admission(node string, ev *trainmeterv1.RunStart, now time.Time) Admission {
	return s.admission(node, nanos(ev.GetTime()), ev.GetResume() || ev.GetResumeRequested(), now)
}

// NoteEnded keeps when the collector first held the run ended on every node
// (now, its own clock), or clears it while the run is live again.
func (s *State) NoteEnded(now time.Time) {
	switch {
	case !s.Ended():
		s.EndedSeenAt = 0
	case s.EndedSeenAt == 0:
		s.EndedSeenAt = now.UnixNano()
	}
}

// EndedOn returns the latest end of the run on node (Unix ns) when the run
// has ended there since the node's latest start.
func (s *State) EndedOn(node string) (int64, bool) {
	n := s.Nodes[node]
	if n == nil || !n.Started || !nodeEnded(n) {
		return 0, false
	}
	return n.EndMax, true
}

// LiveNodes lists the nodes the run is live on.
func (s *State) LiveNodes() []string {
	var out []string
	for name := range s.Nodes {
		if s.LiveOn(name) {
			out = append(out, name)
		}
	}
	return out
}

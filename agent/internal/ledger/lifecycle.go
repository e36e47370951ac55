package ledger

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
)

// Run lifecycle: how a run ended, and what a run_start for an ended run
// does (docs/protocol.md, "run_start"; docs/measurement.md, "Resumed runs").

// maxEndedRuns bounds the ended run ids an agent remembers to refuse their
// accidental reuse: about 100 bytes each, and far more runs than one node
// ends between two look-ups of any one id.
const maxEndedRuns = 4096

// EndedRun is a run that ended on this node, remembered (and checkpointed)
// so that a run_start reusing its id is refused unless it asks to resume.
type EndedRun struct {
	ID     string    `json:"id"`
	End    time.Time `json:"end"`
	Status string    `json:"status"`
}

// End statuses (RunEnd.end_status). A status from a trainer that is none
// of these is recorded as "error".
const (
	StatusOK      = "ok"
	StatusError   = "error"
	StatusLost    = "lost"
	StatusStopped = "stopped"
)

// normalizeStatus maps a run_end "status" to an end status. Absent, "ok"
// and "exit 0" are a normal end; "exit N", "signal NAME" and "stopped[:
// cause]" are kept; anything else a trainer sends ("error", "failed",
// "RuntimeError") is an error.
func normalizeStatus(s string) string {
	s = strings.TrimSpace(s)
	low := strings.ToLower(s)
	switch {
	case low == "" || low == StatusOK || low == "success" || low == "completed" || low == "exit 0":
		return StatusOK
	case low == StatusStopped || strings.HasPrefix(low, StatusStopped+":"):
		return low
	case strings.HasPrefix(low, "exit "):
		if n, err := strconv.Atoi(strings.TrimSpace(s[len("exit "):])); err == nil && n > 0 && n < 256 {
			return "exit " + strconv.Itoa(n)
		}
	case strings.HasPrefix(low, "signal "):
		name := strings.ToUpper(strings.TrimSpace(s[len("signal "):]))
		if name != "" && len(name) <= 16 && !strings.ContainsAny(name, " \t") {
			return "signal " + name
		}
	}
	return StatusError
}

// stopCause is the first word of a Stop advisory's reason: "budget" for a
// budget policy, "max-cost" for trainmeter run --max-cost.
func stopCause(reason string) string {
	f := strings.Fields(strings.ToLower(reason))
	if len(f) == 0 {
		return "requested"
	}
	return strings.Trim(f[0], ":,;.")
}

// finalStatus is the node's end status when the last rank has left: the
// first rank's status that was not ok, else ok; "lost" if no rank sent
// run_end. A run the collector asked to stop and that then ended without
// an error of its own (ok, stopped, lost, or a SIGTERM/SIGINT such as
// trainmeter run's) is "stopped: <cause>".
func (r *run) finalStatus() string {
	st := r.rankStatus
	switch {
	case !r.anyRunEnd:
		st = StatusLost
	case st == "":
		st = StatusOK
	}
	if r.stopCause != "" {
		switch st {
		case StatusOK, StatusLost, StatusStopped, "signal SIGTERM", "signal SIGINT":
			return StatusStopped + ": " + r.stopCause
		}
	}
	return st
}

// endCause is the cause of a rank's failed end: run_end's error; else a
// free-text status that was mapped to "error" ("RuntimeError", "it
// broke"), which names the cause itself.
func endCause(ev *trainerproto.RunEnd) string {
	if ev.Error != "" {
		return ev.Error
	}
	if s := strings.TrimSpace(ev.Status); normalizeStatus(s) == StatusError && !strings.EqualFold(s, StatusError) {
		return s
	}
	return ""
}

// endError is the cause that goes with the run's end status: the error of
// the rank whose status it is; none when the run ended otherwise (ok,
// stopped on request, lost).
func (r *run) endError() string {
	if r.endStatus == "" || r.endStatus != r.rankStatus {
		return ""
	}
	return r.rankError
}

// StopRequested records that the collector asked the run to stop (a Stop
// advisory), for its end status.
func (l *Ledger) StopRequested(id, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r, ok := l.runs[id]; ok && !r.ended && r.stopCause == "" {
		r.stopCause = stopCause(reason)
	}
}

// EndedRuns lists the runs that ended on this node (the newest
// maxEndedRuns), oldest first, and a version that changes whenever the list
// does: the agent saves the list apart from its per-second checkpoint, only
// when it changed, so that a restarted agent still refuses their reuse.
func (l *Ledger) EndedRuns() ([]EndedRun, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.endedRuns(), l.endedVersion
}

// RestoreEnded brings back the ended runs a previous agent saved.
func (l *Ledger) RestoreEnded(runs []EndedRun) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range runs {
		if e.ID != "" {
			l.rememberEnded(e)
		}
	}
	l.endedVersion = 0 // as saved
}

// rememberEnded records an ended run, forgetting the oldest beyond
// maxEndedRuns.
func (l *Ledger) rememberEnded(e EndedRun) {
	l.endedVersion++
	if l.ended == nil {
		l.ended = map[string]EndedRun{}
	}
	if _, ok := l.ended[e.ID]; !ok {
		l.endedOrder = append(l.endedOrder, e.ID)
	}
	l.ended[e.ID] = e
	for len(l.endedOrder) > maxEndedRuns {
		delete(l.ended, l.endedOrder[0])
		l.endedOrder = l.endedOrder[1:]
	}
}

func (l *Ledger) forgetEnded(id string) {
	if _, ok := l.ended[id]; !ok {
		return
	}
	delete(l.ended, id)
	l.endedVersion++
	l.endedOrder = slices.DeleteFunc(l.endedOrder, func(x string) bool { return x == id })
}

// endedRuns lists the remembered ended runs, oldest first (for snapshots).
func (l *Ledger) endedRuns() []EndedRun {
	out := make([]EndedRun, 0, len(l.endedOrder))
	for _, id := range l.endedOrder {
		out = append(out, l.ended[id])
	}
	return out
}

// reuseError is the refusal of a run_start for an ended run: it names both
// ways on.
func reuseError(id string, end time.Time, status string) error {
	return errorf("run_start", "run %q already ended on this node at %s (%s); "+
		"to start a new run use a new run_id, or to continue this one send resume=true "+
		"(Python: trainmeter.start(..., resume=True); trainmeter run --resume)",
		id, end.UTC().Format(time.RFC3339), status)
}

package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/ledger"
	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// endedFile holds the ids of the runs that ended on this node, so that a
// restarted agent still refuses their reuse (ledger/lifecycle.go). Apart
// from the ledger state: up to 4096 ids are too many to rewrite every
// second, and they change only when a run ends.
const endedFile = "ended-runs.json"

func (a *Agent) endedPath() string { return filepath.Join(a.cfg.Spool, endedFile) }

// restoreLedger brings back the runs of the previous process, if any, from
// the newest valid state slot. No checkpoint is a clean start; an
// unreadable one is reported and ignored: the runs it held are then ended
// at the collector by nobody, and show as not ended there. A state of
// another format is refused (the error).
func (a *Agent) restoreLedger() error {
	if b, err := os.ReadFile(a.endedPath()); err == nil {
		var ended []ledger.EndedRun
		if err := json.Unmarshal(b, &ended); err != nil {
			a.log.Warn("cannot read the ended runs of the previous agent; their ids may be reused by accident", "file", a.endedPath(), "err", err)
		} else {
			a.ledger.RestoreEnded(ended)
			a.endedSavedOK = true
		}
	}
	if a.state == nil {
		a.state = newStateSlots(a.cfg.Spool, nil)
	}
	b, from, problems, err := a.state.load()
	if err != nil {
		return err
	}
	var bad []string
	for _, p := range problems {
		bad = append(bad, a.state.path(p.slot))
		a.log.Warn("ledger state slot unreadable (a write torn by a kill -9 or a crash, or damage); not used",
			"file", a.state.path(p.slot), "err", p.err)
	}
	if from < 0 {
		if len(bad) > 0 {
			a.log.Error("no ledger state slot is readable; starting afresh: runs of the previous agent are not resumed", "files", bad)
		}
		return nil
	}
	file := a.state.path(from)
	if len(bad) > 0 {
		a.log.Warn("resuming from the readable ledger state slot; if the other was the newer (a write torn by a kill -9), this checkpoint is one second older than the last", "file", file)
	}
	var s ledger.Snapshot
	err = json.Unmarshal(b, &s)
	if err == nil {
		err = a.ledger.Restore(a.clock.Now(), s, a.cfg.RejoinGrace)
	}
	if err != nil {
		a.log.Error("cannot resume runs from the previous agent's state; starting afresh", "file", file, "err", err)
		return nil
	}
	if cr, ok := a.backend.(gpu.CounterResumer); ok {
		// A simulated GPU's counter lives in this process: continue it
		// from the checkpoint, as a real one kept counting meanwhile.
		devs := a.backend.Devices()
		for i, g := range s.GPUs {
			if i < len(devs) && g.CounterOK && g.UUID == devs[i].UUID {
				cr.ResumeCounter(i, g.CounterJ, s.Time)
			}
		}
	}
	if len(s.Runs) > 0 {
		a.log.Info("resuming runs after an agent restart", "runs", len(s.Runs), "checkpoint", s.Time, "down_for", a.clock.Now().Sub(s.Time), "file", file)
	}
	return nil
}

// checkpoint persists the ledger's snapshot after the batches of a closed
// window were handed to the spool, into the older state slot. No fsync, on
// purpose: the page cache survives a killed process, and a flush every
// second would cost more than the state is worth after a power loss.
func (a *Agent) checkpoint(now time.Time) {
	b, err := json.Marshal(a.ledger.Snapshot())
	if err == nil {
		err = a.state.write(b)
	}
	if ended, v := a.ledger.EndedRuns(); err == nil && (v != a.endedSaved || !a.endedSavedOK) && (len(ended) > 0 || a.endedSavedOK) {
		if err = writeJSONFile(a.endedPath(), ended); err == nil {
			a.endedSaved, a.endedSavedOK = v, true
		}
	}
	if err != nil && now.Sub(a.lastStateErr) > time.Minute {
		a.lastStateErr = now
		a.log.Warn("cannot save ledger state; a restart now would lose the open runs' downtime", "dir", a.cfg.Spool, "err", err)
	}
}

// writeJSONFile replaces path with v as JSON: write, then rename, so the
// file is whole through a kill -9.
func writeJSONFile(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

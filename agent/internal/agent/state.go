package agent

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/ledger"
)

// stateFile sits in the spool directory: the ledger's snapshot after the last
// closed window, so a restarted agent (kill -9 included) can resume its runs.
const stateFile = "ledger-state.json"

// endedFile holds the ids of the runs that ended on this node, so that a
// restarted agent still refuses their reuse (ledger/lifecycle.go). Apart
// from stateFile: up to 4096 ids are too many to rewrite every second, and
// they change only when a run ends.
const endedFile = "ended-runs.json"

func (a *Agent) endedPath() string { return filepath.Join(a.cfg.Spool, endedFile) }

func (a *Agent) statePath() string { return filepath.Join(a.cfg.Spool, stateFile) }

// restoreLedger brings back the runs of the previous process, if any. A
// missing file is a clean start; an unreadable one is reported and ignored:
// the runs it held are then ended at the collector by nobody, and show as
// not ended there.
func (a *Agent) restoreLedger() {
	if b, err := os.ReadFile(a.endedPath()); err == nil {
		var ended []ledger.EndedRun
		if err := json.Unmarshal(b, &ended); err != nil {
			a.log.Warn("cannot read the ended runs of the previous agent; their ids may be reused by accident", "file", a.endedPath(), "err", err)
		} else {
			a.ledger.RestoreEnded(ended)
			a.endedSavedOK = true
		}
	}
	b, err := os.ReadFile(a.statePath())
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var s ledger.Snapshot
	if err == nil {
		err = json.Unmarshal(b, &s)
	}
	if err == nil {
		err = a.ledger.Restore(a.clock.Now(), s, a.cfg.RejoinGrace)
	}
	if err != nil {
		a.log.Error("cannot resume runs from the previous agent's state; starting afresh", "file", a.statePath(), "err", err)
		return
	}
	if len(s.Runs) > 0 {
		a.log.Info("resuming runs after an agent restart", "runs", len(s.Runs), "checkpoint", s.Time, "down_for", a.clock.Now().Sub(s.Time))
	}
}

// checkpoint persists the ledger's snapshot after the batches of a closed
// window were handed to the spool. Write-then-rename keeps the file whole
// through a kill -9 (the page cache survives a killed process; fsync is left
// out on purpose: it would cost a disk flush every second).
func (a *Agent) checkpoint(now time.Time) {
	err := writeJSONFile(a.statePath(), a.ledger.Snapshot())
	if ended, v := a.ledger.EndedRuns(); err == nil && (v != a.endedSaved || !a.endedSavedOK) && (len(ended) > 0 || a.endedSavedOK) {
		if err = writeJSONFile(a.endedPath(), ended); err == nil {
			a.endedSaved, a.endedSavedOK = v, true
		}
	}
	if err != nil && now.Sub(a.lastStateErr) > time.Minute {
		a.lastStateErr = now
		a.log.Warn("cannot save ledger state; a restart now would lose the open runs' downtime", "file", a.statePath(), "err", err)
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

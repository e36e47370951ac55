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

func (a *Agent) statePath() string { return filepath.Join(a.cfg.Spool, stateFile) }

// restoreLedger brings back the runs of the previous process, if any. A
// missing file is a clean start; an unreadable one is reported and ignored:
// the runs it held are then ended at the collector by nobody, and show as
// not ended there.
func (a *Agent) restoreLedger() {
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
	b, err := json.Marshal(a.ledger.Snapshot())
	if err == nil {
		tmp := a.statePath() + ".tmp"
		if err = os.WriteFile(tmp, b, 0o600); err == nil {
			err = os.Rename(tmp, a.statePath())
		}
	}
	if err != nil && now.Sub(a.lastStateErr) > time.Minute {
		a.lastStateErr = now
		a.log.Warn("cannot save ledger state; a restart now would lose the open runs' downtime", "file", a.statePath(), "err", err)
	}
}

package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/trainmeter/trainmeter/agent/internal/spool"
	"github.com/trainmeter/trainmeter/internal/plural"
)

// unackedWarn is how many unacked batches (1 s each) make the spool check
// warn: two minutes of data waiting for the collector.
const unackedWarn = 120

func checkSpool(o Options, r *Report) {
	dir := o.Config.Spool
	if dir == "" {
		return
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		parent := existingAncestor(dir)
		if writable(parent) {
			r.add(SectionSpool, "spool", OK, fmt.Sprintf("%s does not exist yet; the agent creates it at start (%s is writable)", dir, parent), "")
		} else {
			r.add(SectionSpool, "spool", Warn, fmt.Sprintf("%s does not exist yet, and %s is not writable by %s", dir, parent, userName(os.Getuid())),
				"the agent creates it at start if its user may (systemd's StateDirectory= does it for the unit); fine if the agent runs as another user that can")
		}
		return
	case err != nil:
		r.add(SectionSpool, "spool", Fail, err.Error(), "")
		return
	case !fi.IsDir():
		r.add(SectionSpool, "spool", Fail, dir+" exists but is not a directory", "point --spool (spool:) at a directory")
		return
	}
	owner, _ := ownerOf(fi)
	onDisk := segmentBytes(dir)
	bound := o.Config.SpoolMaxBytes
	if bound <= 0 {
		bound = spool.DefaultMaxBytes
	}
	usage := fmt.Sprintf("%s of %s used (%.1f%%)", bytesStr(onDisk), bytesStr(bound), 100*float64(onDisk)/float64(bound))

	st, hint := OK, ""
	var notes []string
	note := func(s Status, n, h string) { st, hint, notes = s, h, append(notes, n) }
	if !writable(dir) {
		note(Warn, fmt.Sprintf("not writable by %s", userName(os.Getuid())),
			fmt.Sprintf("fine if the agent runs as its owner %s; otherwise the agent cannot keep batches", userName(owner)))
	}
	if onDisk > bound*9/10 {
		note(Warn, "nearly full: the oldest batches are dropped (and the runs marked incomplete) when it is",
			"the collector has not acked for a long time: see the collector checks above and the agent's log")
	}

	held, err := lockHeld(filepath.Join(dir, "lock"))
	switch {
	case err != nil:
		notes = append(notes, "cannot probe its lock: "+err.Error())
	case held:
		notes = append(notes, "in use by a running agent (locked)")
	case owner != os.Geteuid():
		// Opening writes the state file; as another user that would leave
		// files the agent may not read.
		notes = append(notes, fmt.Sprintf("unacked batches not counted: the spool belongs to %s (run doctor as that user to count them)", userName(owner)))
	case !writable(dir):
	default:
		// No agent holds it: open it as the agent would at start (a bound
		// no smaller than what is on disk, so nothing is evicted), count,
		// close.
		s, err := spool.Open(dir, max(o.Config.SpoolMaxBytes, onDisk+spool.MinMaxBytes), nil)
		switch {
		case err != nil && strings.Contains(err.Error(), "in use"):
			notes = append(notes, "in use by a running agent (locked)")
		case err != nil:
			note(Fail, "cannot be opened: "+err.Error(), "the agent will fail to start the same way")
		default:
			stats := s.Stats()
			_ = s.Close()
			notes = append(notes, fmt.Sprintf("no agent running on it; %s not yet acked by the collector (sent when the agent starts)", plural.N(stats.Unacked, "batch")))
			if stats.Unacked > unackedWarn && st == OK {
				st = Warn
				hint = "these batches wait for the collector; start the agent with a reachable collector to deliver them"
			}
			if stats.StateCorrupt || stats.CorruptRecords > 0 {
				notes = append(notes, fmt.Sprintf("found corrupt data (%d records, %d bytes) and discarded it", stats.CorruptRecords, stats.CorruptBytes))
			}
		}
	}
	msg := usage
	if len(notes) > 0 {
		msg += "; " + strings.Join(notes, "; ")
	}
	r.add(SectionSpool, "spool", st, msg, hint)
}

// segmentBytes sums the sizes of the spool's segment files.
func segmentBytes(dir string) int64 {
	names, _ := filepath.Glob(filepath.Join(dir, "seg-*.tms"))
	var n int64
	for _, p := range names {
		if fi, err := os.Stat(p); err == nil {
			n += fi.Size()
		}
	}
	return n
}

func existingAncestor(p string) string {
	for {
		parent := filepath.Dir(p)
		if _, err := os.Stat(parent); err == nil || parent == p {
			return parent
		}
		p = parent
	}
}

func bytesStr(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

package cli

import (
	"fmt"
	"log/slog"
	"runtime/debug"
)

// applyMemoryLimit sets the Go runtime's soft memory limit: the collector
// collects garbage more often as its heap nears it, and exceeds it when its
// live data needs more (it is not a cap that fails allocations). GOMEMLIMIT,
// when set, wins: it is the runtime's own knob.
func applyMemoryLimit(mib int64, getenv func(string) string, log *slog.Logger) error {
	if mib < 0 {
		return fmt.Errorf("--memory-limit-mib must be >= 0 (0: no limit), got %d", mib)
	}
	if getenv("GOMEMLIMIT") != "" {
		log.Info("memory limit from GOMEMLIMIT", "GOMEMLIMIT", getenv("GOMEMLIMIT"))
		return nil
	}
	if mib > 0 {
		debug.SetMemoryLimit(mib << 20)
	}
	return nil
}

package cli

import (
	"fmt"
	"log/slog"
	"runtime/debug"
)

// defaultMemoryLimitMiB is `serve --memory-limit-mib`'s default. Without a
// limit the Go heap grows to twice its live data before a collection, which
// at 10,000 agents put the collector at 1.3–1.7 GiB resident for about
// 0.7 GiB of live data (docs/benchmarks.md).
const defaultMemoryLimitMiB = 768

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

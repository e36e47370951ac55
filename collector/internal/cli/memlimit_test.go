package cli

import (
	"log/slog"
	"math"
	"runtime/debug"
	"testing"
)

func TestMemoryLimitIsSetUnlessGOMEMLIMITIs(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	log := slog.New(slog.DiscardHandler)
	debug.SetMemoryLimit(math.MaxInt64)

	if err := applyMemoryLimit(768, func(string) string { return "" }, log); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetMemoryLimit(-1); got != 768<<20 {
		t.Errorf("limit %d, want 768 MiB", got)
	}
	debug.SetMemoryLimit(math.MaxInt64)
	env := func(k string) string {
		if k == "GOMEMLIMIT" {
			return "2GiB"
		}
		return ""
	}
	if err := applyMemoryLimit(768, env, log); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Errorf("GOMEMLIMIT set, but the flag changed the limit to %d", got)
	}
	if err := applyMemoryLimit(-1, func(string) string { return "" }, log); err == nil {
		t.Error("a negative limit was accepted")
	}
}

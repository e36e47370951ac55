// Package lifecycle is the shape every background component of both
// daemons has: Start(ctx) error, which returns once the component runs
// (ctx bounds only the start, not the run), and Shutdown(ctx) error, which
// stops it and waits for its goroutines until ctx ends. Shutdown is safe
// to call more than once and without a Start.
//
// The same components take a *slog.Logger; nil means "discard" in both
// daemons (never the process-wide slog.Default, which a library should not
// write to unasked). The binaries always pass their configured logger.
package lifecycle

import (
	"context"
	"fmt"
)

// Component is a background part of a daemon.
type Component interface {
	Start(ctx context.Context) error
	Shutdown(ctx context.Context) error
}

// Wait waits for done to close or ctx to end; what names the component in
// the error.
func Wait(ctx context.Context, done <-chan struct{}, what string) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s did not stop: %w", what, ctx.Err())
	}
}

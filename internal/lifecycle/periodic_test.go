package lifecycle

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

func TestPeriodicRunsAtStartOnEveryTickAndCancelsARunInFlight(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	runs := make(chan context.Context)
	p := NewPeriodic("the test schedule")
	p.Start(clk, time.Minute, func(ctx context.Context) { runs <- ctx })
	<-runs // at Start, before any tick
	advanced := make(chan struct{})
	go func() { clk.Advance(time.Minute); close(advanced) }()
	<-runs
	<-advanced

	// The third run blocks until its context ends: Shutdown must cancel it.
	blocked := make(chan error, 1)
	p2 := NewPeriodic("the blocking schedule")
	p2.Start(clk, time.Minute, func(ctx context.Context) { <-ctx.Done(); blocked <- ctx.Err() })
	if err := p2.Shutdown(context.Background()); err != nil {
		t.Fatalf("shutdown with a run in flight: %v", err)
	}
	if err := <-blocked; !errors.Is(err, context.Canceled) {
		t.Fatalf("run in flight ended with %v, want context.Canceled", err)
	}
	if err := p2.Shutdown(context.Background()); err != nil {
		t.Fatalf("second shutdown: %v", err)
	}

	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if err := NewPeriodic("never started").Shutdown(context.Background()); err != nil {
		t.Fatalf("shutdown without start: %v", err)
	}
}

func TestPeriodicShutdownGivesUpWhenTheRunIgnoresCancel(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	release := make(chan struct{})
	started := make(chan struct{})
	p := NewPeriodic("the stuck schedule")
	p.Start(clk, time.Minute, func(context.Context) { close(started); <-release })
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := p.Shutdown(ctx)
	close(release)
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("shutdown of a stuck run: %v, want the schedule's name and context.Canceled", err)
	}
	if got := err.Error(); got != "the stuck schedule did not stop: context canceled" {
		t.Fatalf("error %q does not name the schedule", got)
	}
}

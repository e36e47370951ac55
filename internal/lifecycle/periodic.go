package lifecycle

import (
	"context"
	"time"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

// Periodic runs a job at Start and then on every tick until Shutdown; the
// collector's watchers (prices, carbon intensity) share it. The first run
// is in the background too, so that a slow remote API does not hold up
// the daemon's start, and Shutdown cancels a run in flight rather than
// waiting for a remote API's timeout.
type Periodic struct {
	name string
	stop chan struct{}
	done chan struct{}
}

// NewPeriodic returns a schedule; name names it in Shutdown's error.
func NewPeriodic(name string) *Periodic { return &Periodic{name: name} }

// Start runs job now and every interval of clk, each run with a context
// that ends at Shutdown. Runs never overlap: a tick during a long run is
// taken after it.
func (p *Periodic) Start(clk clock.Clock, interval time.Duration, job func(ctx context.Context)) {
	stop, done := make(chan struct{}), make(chan struct{})
	p.stop, p.done = stop, done
	t := clk.NewTicker(interval)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(done)
		defer t.Stop()
		defer cancel()
		go func() { // cancels a run in flight when stopped
			select {
			case <-stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		job(ctx)
		for {
			select {
			case <-stop:
				return
			case <-t.C():
				job(ctx)
			}
		}
	}()
}

// Shutdown stops the schedule (a run in flight is cancelled) and waits
// for it until ctx ends. It is safe without a Start and more than once.
func (p *Periodic) Shutdown(ctx context.Context) error {
	if p == nil || p.stop == nil {
		return nil
	}
	close(p.stop)
	p.stop = nil
	return Wait(ctx, p.done, p.name)
}

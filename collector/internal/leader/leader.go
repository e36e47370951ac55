// Package leader elects the one collector of a fleet sharing one store
// that runs the fleet-wide background work (budget alerts, webhook
// delivery, scheduled price and carbon fetches): the one holding a Lock, in
// PostgreSQL a session-level advisory lock (pgstore.LeaderLock). The
// others try again every Retry and take over once the leader's session
// ends. With no Lock (BadgerDB: one collector per store) the collector
// always leads.
package leader

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/trainmeter/trainmeter/internal/lifecycle"
	"github.com/trainmeter/trainmeter/pkg/clock"
)

// DefaultRetry is how often a collector that does not lead tries the lock.
const DefaultRetry = 2 * time.Second

// Lock is a lock that one process of a fleet holds at a time.
type Lock interface {
	// TryLock takes the lock unless another process holds it. Taken, it
	// returns a channel that is closed when the lock is lost (its session
	// ended); held elsewhere, a nil channel.
	TryLock(ctx context.Context) (lost <-chan struct{}, err error)
	// Unlock gives the lock up if held.
	Unlock(ctx context.Context) error
}

// Task is work that runs only on the leader: a lifecycle.Component that
// starts again after a Shutdown.
type Task = lifecycle.Component

// Config configures an Elector.
type Config struct {
	// Lock is the fleet's lock; nil: this process always leads.
	Lock Lock
	// Retry: how often the lock is tried while another holds it; 0:
	// DefaultRetry.
	Retry  time.Duration
	Clock  clock.Clock // nil: the wall clock
	Logger *slog.Logger
	// Tasks run only while this process leads: started in order when it
	// becomes the leader, stopped newest first as soon as it stops being
	// one. Each must start again after a Shutdown.
	Tasks []Task
}

// Elector holds or waits for the lock and runs the tasks while it leads.
type Elector struct {
	cfg     Config
	log     *slog.Logger
	leading atomic.Bool

	mu      sync.Mutex // serialises lead, follow and Shutdown
	running []Task
	stop    chan struct{}
	done    chan struct{}
}

// New returns an elector; Start begins the election.
func New(cfg Config) *Elector {
	cfg.Retry = cmp.Or(cfg.Retry, DefaultRetry)
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, clock.Real{})
	return &Elector{cfg: cfg, log: cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))}
}

// Leading says whether this process leads now.
func (e *Elector) Leading() bool { return e.leading.Load() }

// Start tries the lock once (so that the first process of a fleet leads
// when Start returns), then keeps trying every Retry until Shutdown.
// Without a Lock it leads at once.
func (e *Elector) Start(ctx context.Context) error {
	if e.cfg.Lock == nil {
		e.lead(ctx)
		return nil
	}
	stop, done := make(chan struct{}), make(chan struct{})
	e.stop, e.done = stop, done
	lost := e.try(ctx)
	t := e.cfg.Clock.NewTicker(e.cfg.Retry)
	go func() {
		defer close(done)
		defer t.Stop()
		// backoff: the lock was just lost; the next try is left to the
		// other collectors, whose sessions are likelier sound.
		backoff := false
		for {
			select {
			case <-stop:
				return
			case <-lost:
				e.log.Warn("lost the fleet leader lock (its database session ended): stopped the fleet-wide work")
				if err := e.follow(context.Background()); err != nil {
					e.log.Warn("leader tasks did not stop", "err", err)
				}
				lost, backoff = nil, true
			case <-t.C():
				switch {
				case lost != nil:
				case backoff:
					backoff = false
				default:
					lost = e.try(context.Background())
				}
			}
		}
	}()
	return nil
}

// try takes the lock if it is free and then leads; it returns the lock's
// lost channel (nil: not taken).
func (e *Elector) try(ctx context.Context) <-chan struct{} {
	lost, err := e.cfg.Lock.TryLock(ctx)
	if err != nil {
		e.log.Warn("cannot try the fleet leader lock", "err", err)
		return nil
	}
	if lost != nil {
		e.log.Info("leading the fleet: this collector runs budget alerts, webhooks, price and carbon fetches")
		e.lead(ctx)
	}
	return lost
}

// lead starts the tasks.
func (e *Elector) lead(ctx context.Context) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.leading.Store(true)
	for _, c := range e.cfg.Tasks {
		if err := c.Start(ctx); err != nil {
			e.log.Error("leader task did not start", "err", err)
			continue
		}
		e.running = append(e.running, c)
	}
}

// follow stops the tasks, newest first.
func (e *Elector) follow(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.leading.Store(false)
	var errs []error
	for i := len(e.running) - 1; i >= 0; i-- {
		errs = append(errs, e.running[i].Shutdown(ctx))
	}
	e.running = nil
	return errors.Join(errs...)
}

// Shutdown stops trying, stops the tasks and gives the lock up.
func (e *Elector) Shutdown(ctx context.Context) error {
	if e.stop != nil {
		close(e.stop)
		e.stop = nil
		if err := lifecycle.Wait(ctx, e.done, "leader election"); err != nil {
			return err
		}
	}
	err := e.follow(ctx)
	if e.cfg.Lock != nil {
		err = errors.Join(err, e.cfg.Lock.Unlock(ctx))
	}
	return err
}

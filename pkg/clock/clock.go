// Package clock is the time source the agent's loops run on, so the 50 ms
// sampling loop and the 1 s batching can be tested without sleeping.
package clock

import (
	"sync"
	"time"
)

// Clock is the subset of time the agent needs.
type Clock interface {
	Now() time.Time
	NewTicker(d time.Duration) Ticker
}

// Ticker delivers ticks on C until stopped.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// Real is the wall clock.
type Real struct{}

func (Real) Now() time.Time { return time.Now() }

func (Real) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time { return r.t.C }
func (r realTicker) Stop()               { r.t.Stop() }

// Fake is a manually advanced clock. Advance fires due tickers once per
// period crossed, in time order, and blocks until each tick is received, so a
// test that advances by 1 s sees exactly 20 ticks of a 50 ms ticker.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	tickers []*fakeTicker
}

// NewFake returns a fake clock set to start.
func NewFake(start time.Time) *Fake { return &Fake{now: start} }

func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *Fake) NewTicker(d time.Duration) Ticker {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTicker{c: make(chan time.Time), period: d, next: f.now.Add(d), clock: f}
	f.tickers = append(f.tickers, t)
	return t
}

// Advance moves the clock forward by d, delivering every tick that falls due.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	target := f.now.Add(d)
	f.mu.Unlock()
	for {
		f.mu.Lock()
		var due *fakeTicker
		for _, t := range f.tickers {
			if !t.stopped && !t.next.After(target) && (due == nil || t.next.Before(due.next)) {
				due = t
			}
		}
		if due == nil {
			f.now = target
			f.mu.Unlock()
			return
		}
		at := due.next
		f.now = at
		due.next = at.Add(due.period)
		f.mu.Unlock()
		due.c <- at
	}
}

type fakeTicker struct {
	c       chan time.Time
	period  time.Duration
	next    time.Time
	stopped bool
	clock   *Fake
}

func (t *fakeTicker) C() <-chan time.Time { return t.c }

func (t *fakeTicker) Stop() {
	t.clock.mu.Lock()
	t.stopped = true
	t.clock.mu.Unlock()
}

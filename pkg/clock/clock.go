// Package clock is the time source the daemons' loops run on, so the 50 ms
// sampling loop, the 1 s batching, reconnect backoff and shutdown waits can
// be tested without sleeping.
package clock

import (
	"context"
	"sync"
	"time"
)

// Clock is the subset of time the daemons need.
type Clock interface {
	Now() time.Time
	NewTicker(d time.Duration) Ticker
	// After delivers the time on the returned channel once d has passed,
	// like time.After. The channel has room for that one value, so nobody
	// has to be reading when it fires.
	After(d time.Duration) <-chan time.Time
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

func (Real) After(d time.Duration) <-chan time.Time { return time.After(d) }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time { return r.t.C }
func (r realTicker) Stop()               { r.t.Stop() }

// Fake is a manually advanced clock. Advance fires due tickers once per
// period crossed, in time order, and waits until each tick is received or
// its ticker is stopped, so a test that advances by 1 s sees exactly 20
// ticks of a 50 ms ticker, and a consumer that stopped its ticker (and so
// stopped reading) never holds Advance up. After channels are buffered and
// never wait.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	tickers []*fakeTicker
	afters  []*fakeAfter
	// waiting is closed and replaced whenever an After starts waiting.
	waiting chan struct{}
}

type fakeAfter struct {
	at time.Time
	c  chan time.Time
}

// NewFake returns a fake clock set to start.
func NewFake(start time.Time) *Fake { return &Fake{now: start, waiting: make(chan struct{})} }

func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *Fake) NewTicker(d time.Duration) Ticker {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTicker{c: make(chan time.Time), stopped: make(chan struct{}), period: d, next: f.now.Add(d), clock: f}
	f.tickers = append(f.tickers, t)
	return t
}

// After fires at once for d <= 0, else when Advance reaches now+d.
func (f *Fake) After(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := &fakeAfter{at: f.now.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		a.c <- f.now
		return a.c
	}
	f.afters = append(f.afters, a)
	close(f.waiting)
	f.waiting = make(chan struct{})
	return a.c
}

// AwaitWaiters blocks until at least n After channels are pending (the code
// under test is waiting on the clock), or ctx ends.
func (f *Fake) AwaitWaiters(ctx context.Context, n int) error {
	for {
		f.mu.Lock()
		have, ch := len(f.afters), f.waiting
		f.mu.Unlock()
		if have >= n {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// AdvanceToNextWaiter advances the clock to the earliest pending After's
// time, firing it (and the tickers due by then), and reports whether one
// was pending. Advance by a fixed step would also fire an After that the
// woken code registers meanwhile if it falls within the step (as a real
// clock would); this lets exactly one wait pass, which a test counting
// retries needs.
func (f *Fake) AdvanceToNextWaiter() bool {
	f.mu.Lock()
	if len(f.afters) == 0 {
		f.mu.Unlock()
		return false
	}
	next := f.afters[0].at
	for _, a := range f.afters[1:] {
		if a.at.Before(next) {
			next = a.at
		}
	}
	d := next.Sub(f.now)
	f.mu.Unlock()
	f.Advance(d)
	return true
}

// Waiters is how many After channels have not fired yet: a test advances
// once the code under test is waiting, instead of sleeping.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.afters)
}

// Tickers is how many tickers are running (made and not stopped): each is
// a timer the real clock would wake its owner for.
func (f *Fake) Tickers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, t := range f.tickers {
		if !t.isStopped() {
			n++
		}
	}
	return n
}

// Advance moves the clock forward by d, delivering every tick and firing
// every After that falls due, in time order.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	target := f.now.Add(d)
	f.mu.Unlock()
	for {
		f.mu.Lock()
		var due *fakeTicker
		for _, t := range f.tickers {
			if !t.isStopped() && !t.next.After(target) && (due == nil || t.next.Before(due.next)) {
				due = t
			}
		}
		afterIdx := -1
		for i, a := range f.afters {
			if !a.at.After(target) && (afterIdx < 0 || a.at.Before(f.afters[afterIdx].at)) {
				afterIdx = i
			}
		}
		if afterIdx >= 0 && (due == nil || !due.next.Before(f.afters[afterIdx].at)) {
			a := f.afters[afterIdx]
			f.afters = append(f.afters[:afterIdx], f.afters[afterIdx+1:]...)
			f.now = a.at
			a.c <- a.at
			f.mu.Unlock()
			continue
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
		select {
		case due.c <- at:
		case <-due.stopped:
		}
	}
}

type fakeTicker struct {
	c        chan time.Time
	stopped  chan struct{}
	stopOnce sync.Once
	period   time.Duration
	next     time.Time
	clock    *Fake
}

func (t *fakeTicker) C() <-chan time.Time { return t.c }

func (t *fakeTicker) isStopped() bool {
	select {
	case <-t.stopped:
		return true
	default:
		return false
	}
}

func (t *fakeTicker) Stop() { t.stopOnce.Do(func() { close(t.stopped) }) }

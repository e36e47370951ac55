package clock

import "time"

// Pacer paces a periodic loop that has to run on time, like the agent's
// 50 ms GPU sampling. A Pacer belongs to one goroutine.
type Pacer interface {
	// Wait blocks until the next period boundary and reports true, or
	// reports false once stop is closed. Boundaries the caller was too late
	// for are skipped, as a time.Ticker drops ticks.
	Wait(stop <-chan struct{}) bool
	Stop()
	// OwnThread reports whether Wait sleeps on the calling goroutine's own
	// OS thread (the real clock on Linux: clock_nanosleep to an absolute
	// deadline), so that a caller that locks its goroutine to its thread
	// and raises that thread's priority wakes on time however busy the
	// CPUs are. Otherwise Wait receives from a Ticker.
	OwnThread() bool
}

// NewPacer returns a pacer of period d whose first boundary is d from now.
func NewPacer(c Clock, d time.Duration) Pacer {
	if _, real := c.(Real); real {
		if p := newThreadPacer(d); p != nil {
			return p
		}
	}
	return tickerPacer{c.NewTicker(d)}
}

type tickerPacer struct{ t Ticker }

func (p tickerPacer) Wait(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return false
	case <-p.t.C():
		return true
	}
}

func (p tickerPacer) Stop()           { p.t.Stop() }
func (p tickerPacer) OwnThread() bool { return false }

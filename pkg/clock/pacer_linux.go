package clock

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"
)

// maxSleep bounds one sleep, so that a closed stop is seen within it even
// with a long period.
const maxSleep = 100 * time.Millisecond

// threadPacer sleeps with clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)
// on the caller's thread. A Go timer would be woken by whichever runtime
// thread polls the timers, at that thread's priority; this way only the
// caller's thread has to be scheduled.
type threadPacer struct {
	period time.Duration
	next   time.Duration // monotonic deadline of the next boundary
}

func newThreadPacer(d time.Duration) Pacer {
	now, err := monotonic()
	if err != nil {
		return nil
	}
	return &threadPacer{period: d, next: now + d}
}

func monotonic() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, err
	}
	return time.Duration(ts.Nano()), nil
}

func (p *threadPacer) Wait(stop <-chan struct{}) bool {
	for {
		select {
		case <-stop:
			return false
		default:
		}
		now, err := monotonic()
		if err != nil { // cannot happen on Linux; never spin or stop sampling
			time.Sleep(p.period)
			return true
		}
		if now >= p.next {
			// Late by whole periods: skip to the boundary just passed.
			p.next += (now - p.next) / p.period * p.period
			p.next += p.period
			return true
		}
		wake := min(p.next, now+maxSleep)
		ts := unix.NsecToTimespec(int64(wake))
		if err := unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil); err != nil && !errors.Is(err, unix.EINTR) {
			time.Sleep(wake - now)
		}
	}
}

func (p *threadPacer) Stop()           {}
func (p *threadPacer) OwnThread() bool { return true }

package clock

import (
	"runtime"
	"testing"
	"time"
)

func TestPacerOnAFakeClockFollowsItsTicks(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	p := NewPacer(f, 50*time.Millisecond)
	defer p.Stop()
	if p.OwnThread() {
		t.Fatal("a fake clock's pacer claims its own thread")
	}
	got := make(chan bool)
	go func() { got <- p.Wait(nil) }()
	f.Advance(50 * time.Millisecond)
	if !<-got {
		t.Fatal("Wait did not report the tick")
	}
	stop := make(chan struct{})
	close(stop)
	if p.Wait(stop) {
		t.Fatal("Wait reported a tick after stop")
	}
}

func TestThreadPacerWaitsAndSkipsMissedBoundaries(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("clock_nanosleep pacer is Linux only")
	}
	const period = 5 * time.Millisecond
	p := NewPacer(Real{}, period)
	tp, ok := p.(*threadPacer)
	if !ok || !p.OwnThread() {
		t.Fatalf("the real clock's pacer is %T", p)
	}
	first := tp.next
	if !p.Wait(nil) {
		t.Fatal("Wait reported no tick")
	}
	if now, _ := monotonic(); now < first {
		t.Fatalf("Wait returned %v before the first boundary", first-now)
	}
	// Late by several periods: one tick at once, and the next deadline is
	// the first boundary after now, not a burst of the missed ones.
	time.Sleep(4 * period)
	if !p.Wait(nil) {
		t.Fatal("Wait reported no tick")
	}
	now, _ := monotonic()
	if ahead := tp.next - now; ahead <= 0 || ahead > period {
		t.Fatalf("next deadline %v from now, want within one period", ahead)
	}
	if (tp.next-first)%period != 0 {
		t.Fatalf("deadlines drifted off the period grid: %v", (tp.next-first)%period)
	}
	stop := make(chan struct{})
	close(stop)
	if p.Wait(stop) {
		t.Fatal("Wait reported a tick after stop")
	}
}

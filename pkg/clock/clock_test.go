package clock

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var start = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// finishes fails the test if f does not return: a guard against a hang,
// not a synchronisation.
func finishes(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return", what)
	}
}

func TestAdvanceDeliversEveryTickInOrder(t *testing.T) {
	f := NewFake(start)
	tk := f.NewTicker(50 * time.Millisecond)
	defer tk.Stop()
	got := make(chan []time.Time)
	go func() {
		var ticks []time.Time
		for range 20 {
			ticks = append(ticks, <-tk.C())
		}
		got <- ticks
	}()
	f.Advance(time.Second)
	ticks := <-got
	for i, at := range ticks {
		if want := start.Add(time.Duration(i+1) * 50 * time.Millisecond); !at.Equal(want) {
			t.Fatalf("tick %d at %v, want %v", i, at, want)
		}
	}
	if !f.Now().Equal(start.Add(time.Second)) {
		t.Errorf("now %v", f.Now())
	}
}

func TestAdvanceDoesNotBlockOnAStoppedConsumer(t *testing.T) {
	f := NewFake(start)
	tk := f.NewTicker(10 * time.Millisecond)
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer tk.Stop()
		for range 3 {
			<-tk.C()
		}
		// Stops reading here, as a loop does when its context ends.
	}()
	finishes(t, "Advance past a consumer that stopped reading", func() { f.Advance(time.Second) })
	<-read
	if !f.Now().Equal(start.Add(time.Second)) {
		t.Errorf("now %v", f.Now())
	}
	finishes(t, "Advance with only a stopped ticker", func() { f.Advance(time.Second) })
}

func TestAfterFiresWhenDueWithoutAReader(t *testing.T) {
	f := NewFake(start)
	c := f.After(time.Second)
	if n := f.Waiters(); n != 1 {
		t.Fatalf("waiters %d, want 1", n)
	}
	finishes(t, "Advance short of the deadline", func() { f.Advance(999 * time.Millisecond) })
	select {
	case at := <-c:
		t.Fatalf("fired early at %v", at)
	default:
	}
	finishes(t, "Advance with nobody reading the After", func() { f.Advance(time.Millisecond) })
	if at := <-c; !at.Equal(start.Add(time.Second)) {
		t.Errorf("fired at %v", at)
	}
	if n := f.Waiters(); n != 0 {
		t.Errorf("waiters %d after firing", n)
	}
	if at := <-f.After(0); !at.Equal(f.Now()) {
		t.Errorf("After(0) gave %v", at)
	}
}

func TestAwaitWaitersReturnsOnceSomeoneWaits(t *testing.T) {
	f := NewFake(start)
	fired := make(chan time.Time)
	go func() { fired <- <-f.After(time.Minute) }()
	if err := f.AwaitWaiters(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	f.Advance(time.Minute)
	if at := <-fired; !at.Equal(start.Add(time.Minute)) {
		t.Errorf("fired at %v", at)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.AwaitWaiters(ctx, 1); err == nil {
		t.Error("AwaitWaiters returned nil with nobody waiting and ctx done")
	}
}

func TestAfterAndTicksInterleaveInTimeOrder(t *testing.T) {
	f := NewFake(start)
	tk := f.NewTicker(100 * time.Millisecond)
	defer tk.Stop()
	after := f.After(250 * time.Millisecond)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 3 {
			<-tk.C()
		}
	}()
	f.Advance(300 * time.Millisecond)
	<-done
	if at := <-after; !at.Equal(start.Add(250 * time.Millisecond)) {
		t.Errorf("after fired at %v", at)
	}
}

func TestRealClock(t *testing.T) {
	var c Clock = Real{}
	before := time.Now()
	<-c.After(time.Millisecond)
	if c.Now().Before(before.Add(time.Millisecond)) {
		t.Error("After returned before its duration")
	}
	tk := c.NewTicker(time.Millisecond)
	defer tk.Stop()
	<-tk.C()
}

// A retry loop woken by one wait may register its next before the test's
// Advance returns; AdvanceToNextWaiter ends exactly one wait.
func TestAdvanceToNextWaiterEndsOneWait(t *testing.T) {
	f := NewFake(start)
	if f.AdvanceToNextWaiter() {
		t.Fatal("advanced with nothing waiting")
	}
	first, second := f.After(5*time.Millisecond), f.After(8*time.Millisecond)
	if !f.AdvanceToNextWaiter() {
		t.Fatal("did not advance with two waiting")
	}
	select {
	case at := <-first:
		if !at.Equal(start.Add(5 * time.Millisecond)) {
			t.Errorf("first fired at %v, want start+5ms", at)
		}
	default:
		t.Fatal("the earliest wait did not end")
	}
	select {
	case <-second:
		t.Fatal("the later wait ended too")
	default:
	}
	if got := f.Now(); !got.Equal(start.Add(5 * time.Millisecond)) {
		t.Errorf("now %v, want start+5ms", got)
	}
	if n := f.Waiters(); n != 1 {
		t.Errorf("%d waiters, want 1", n)
	}
}

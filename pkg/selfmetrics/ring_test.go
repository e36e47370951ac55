package selfmetrics

import (
	"sync"
	"testing"
	"time"
)

func TestRingQuantilesOverTheLastN(t *testing.T) {
	r := NewRing(100)
	if q := r.Quantiles(0.5); q[0] != 0 {
		t.Fatalf("empty ring p50 = %v", q[0])
	}
	// 1000 huge values, then 100 values 1..100 ms: only the last 100 count.
	for i := 0; i < 1000; i++ {
		r.Observe(time.Hour)
	}
	for i := 1; i <= 100; i++ {
		r.Observe(time.Duration(i) * time.Millisecond)
	}
	q := r.Quantiles(0.5, 0.99, 1)
	if q[0] != 50*time.Millisecond || q[1] != 99*time.Millisecond || q[2] != 100*time.Millisecond {
		t.Fatalf("p50/p99/max = %v, want 50ms 99ms 100ms", q)
	}
	if r.Count() != 1100 {
		t.Fatalf("count %d", r.Count())
	}
}

func TestRingObserveDoesNotAllocate(t *testing.T) {
	r := NewRing(1024)
	if n := testing.AllocsPerRun(1000, func() { r.Observe(time.Millisecond) }); n != 0 {
		t.Fatalf("Observe allocates %v times", n)
	}
}

func TestRingConcurrentObserve(t *testing.T) {
	r := NewRing(64)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				r.Observe(time.Microsecond)
				if i%100 == 0 {
					r.Quantiles(0.99)
				}
			}
		}()
	}
	wg.Wait()
	if r.Count() != 8000 || r.Quantiles(0.5)[0] != time.Microsecond {
		t.Fatalf("count %d p50 %v", r.Count(), r.Quantiles(0.5)[0])
	}
}

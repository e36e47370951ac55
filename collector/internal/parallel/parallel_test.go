package parallel

import (
	"sync/atomic"
	"testing"
)

// TestEachCallsEveryIndexOnce: every index once, for counts around the
// goroutine split, including none.
func TestEachCallsEveryIndexOnce(t *testing.T) {
	for _, n := range []int{0, 1, 63, 64, 65, 1000} {
		for _, per := range []int{1, 64} {
			calls := make([]atomic.Int32, n)
			Each(n, per, func(i int) { calls[i].Add(1) })
			for i := range calls {
				if c := calls[i].Load(); c != 1 {
					t.Errorf("n %d, per %d: index %d called %d times", n, per, i, c)
				}
			}
		}
	}
}

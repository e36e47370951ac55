// Package parallel runs independent work on all cores.
package parallel

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Each calls fn(0) ... fn(n-1), each once, on up to GOMAXPROCS goroutines
// and at least per calls to a goroutine (so that a few cheap calls do not
// pay for goroutines), and returns when all have returned. fn must be safe
// to call concurrently for different i.
func Each(n, per int, fn func(i int)) {
	per = max(per, 1)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := min(runtime.GOMAXPROCS(0), (n+per-1)/per); w > 0; w-- {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				fn(i)
			}
		})
	}
	wg.Wait()
}

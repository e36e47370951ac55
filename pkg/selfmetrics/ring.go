// Package selfmetrics holds the small, allocation-free building blocks of the
// daemons' own health counters (GET /status): a ring of the last N duration
// observations with exact quantiles over them. The later OpenTelemetry export
// reads the same values.
package selfmetrics

import (
	"slices"
	"sync/atomic"
	"time"
)

// Ring keeps the last len(slots) durations. Observe is lock-free and does not
// allocate, so it may sit on the 50 ms sampling path; Quantiles copies the
// ring and sorts it (it allocates, and is meant for status requests). Many
// goroutines may Observe at once; a reader racing a writer may see a slot's
// previous value, which is fine for a health figure.
type Ring struct {
	n     atomic.Uint64 // observations so far
	slots []atomic.Int64
}

// NewRing returns a ring over the last size observations (size ≥ 1).
func NewRing(size int) *Ring {
	return &Ring{slots: make([]atomic.Int64, max(size, 1))}
}

// Observe records d.
func (r *Ring) Observe(d time.Duration) {
	i := r.n.Add(1) - 1
	r.slots[i%uint64(len(r.slots))].Store(int64(d))
}

// Count is the number of observations since the ring was made.
func (r *Ring) Count() uint64 { return r.n.Load() }

// Quantiles returns the q-quantiles (0 ≤ q ≤ 1, nearest rank) of the last
// observations, zero when there are none.
func (r *Ring) Quantiles(qs ...float64) []time.Duration {
	out := make([]time.Duration, len(qs))
	n := min(r.n.Load(), uint64(len(r.slots)))
	if n == 0 {
		return out
	}
	vals := make([]int64, n)
	for i := range vals {
		vals[i] = r.slots[i].Load()
	}
	slices.Sort(vals)
	for i, q := range qs {
		q = min(max(q, 0), 1)
		k := int(q*float64(n)+0.999999999) - 1 // nearest rank: ceil(q·n)
		out[i] = time.Duration(vals[min(max(k, 0), int(n)-1)])
	}
	return out
}

// Millis converts d to fractional milliseconds, the unit of the JSON status.
func Millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

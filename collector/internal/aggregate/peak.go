package aggregate

import (
	"math"
	"slices"
	"sort"
)

// Peak power across nodes (see peak_power_W in the package comment): each
// node keeps its open buckets as two sorted columns (NodeState.PeakSeconds,
// PeakWatts), which fold from the front and append at the back as a run
// goes on. Columns rather than a map of second -> node -> W keep
// encoding an aggregate cheap at every commit (docs/benchmarks.md).

func (s *State) addPeak(node string, bucket int64, p float64) {
	if s.HasFolded && bucket < s.FoldedUpTo {
		// The bucket was already folded: the other nodes' values for that
		// second are gone, so this window counts alone (a lower bound).
		if p > s.PeakFolded {
			s.PeakFolded = p
		}
		return
	}
	n := s.node(node)
	secs := n.PeakSeconds
	switch i := len(secs) - 1; {
	case i >= 0 && secs[i] == bucket:
		n.PeakWatts[i] = max(n.PeakWatts[i], p)
	case i < 0 || secs[i] < bucket:
		n.PeakSeconds = append(secs, bucket)
		n.PeakWatts = append(n.PeakWatts, p)
	default: // an earlier second than the node's newest: out of order
		j, found := slices.BinarySearch(secs, bucket)
		if found {
			n.PeakWatts[j] = max(n.PeakWatts[j], p)
		} else {
			n.PeakSeconds = slices.Insert(secs, j, bucket)
			n.PeakWatts = slices.Insert(n.PeakWatts, j, p)
		}
	}
	if !s.HasMaxBucket || bucket > s.MaxBucket {
		s.MaxBucket = bucket
		s.HasMaxBucket = true
	}
	s.foldBuckets()
}

// foldBuckets folds peak buckets that can no longer change into PeakFolded,
// so the state stays bounded for long runs.
func (s *State) foldBuckets() {
	open := false
	for _, n := range s.Nodes {
		if len(n.PeakSeconds) > 0 {
			open = true
			break
		}
	}
	if !open {
		return
	}
	// Fold bucket b when b < MaxBucket-PeakHorizon and either every node
	// that has not ended is past b, or b < MaxBucket-PeakMaxLag.
	minActive := int64(math.MaxInt64)
	for _, n := range s.Nodes {
		if nodeEnded(n) {
			continue
		}
		if !n.HasWindow {
			minActive = math.MinInt64 // a node we have nothing from yet holds everything open
			break
		}
		if n.Watermark < minActive {
			minActive = n.Watermark
		}
	}
	limit := min(s.MaxBucket-PeakHorizon, max(minActive, s.MaxBucket-PeakMaxLag))
	if minActive == math.MaxInt64 {
		limit = s.MaxBucket + 1 // every node has ended: nothing can change
	}
	if s.HasFolded && limit <= s.FoldedUpTo {
		return
	}
	// FoldedUpTo moves to the limit even when no bucket lies below it, so
	// the early return above spares the next windows of the same second
	// the merge of every node's columns.
	if s.anyBucketBelow(limit) {
		s.eachBucketSum(limit, func(sum float64) { s.PeakFolded = max(s.PeakFolded, sum) })
		for name, n := range s.Nodes {
			k, _ := slices.BinarySearch(n.PeakSeconds, limit)
			if k > 0 {
				s.markChanged(name)
				// Copy down rather than reslice, so the arrays do not creep.
				n.PeakSeconds = slices.Delete(n.PeakSeconds, 0, k)
				n.PeakWatts = slices.Delete(n.PeakWatts, 0, k)
			}
		}
	}
	s.FoldedUpTo = limit
	s.HasFolded = true
}

func (s *State) anyBucketBelow(limit int64) bool {
	for _, n := range s.Nodes {
		if len(n.PeakSeconds) > 0 && n.PeakSeconds[0] < limit {
			return true
		}
	}
	return false
}

// eachBucketSum calls fn with the summed power of every open bucket below
// limit, in second order. The nodes' values of one second are added in
// node-name order, so the sum does not depend on map order.
func (s *State) eachBucketSum(limit int64, fn func(sum float64)) {
	var cols []*NodeState
	if len(s.Nodes) == 1 {
		for _, n := range s.Nodes {
			cols = append(cols, n)
		}
	} else {
		names := make([]string, 0, len(s.Nodes))
		for name, n := range s.Nodes {
			if len(n.PeakSeconds) > 0 {
				names = append(names, name)
			}
		}
		sort.Strings(names)
		for _, name := range names {
			cols = append(cols, s.Nodes[name])
		}
	}
	pos := make([]int, len(cols))
	for {
		next := int64(math.MaxInt64)
		for i, n := range cols {
			if pos[i] < len(n.PeakSeconds) && n.PeakSeconds[pos[i]] < min(next, limit) {
				next = n.PeakSeconds[pos[i]]
			}
		}
		if next == math.MaxInt64 {
			return
		}
		var sum float64
		for i, n := range cols {
			if pos[i] < len(n.PeakSeconds) && n.PeakSeconds[pos[i]] == next {
				sum += n.PeakWatts[pos[i]]
				pos[i]++
			}
		}
		fn(sum)
	}
}

// Peak returns peak_power_W.
func (s *State) Peak() float64 {
	p := s.PeakFolded
	s.eachBucketSum(math.MaxInt64, func(sum float64) { p = max(p, sum) })
	return p
}

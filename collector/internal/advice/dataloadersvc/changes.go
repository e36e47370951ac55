package dataloadersvc

import (
	"slices"
	"sort"
	"time"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Changes finds, in a run's per-epoch records, the loader changes the
// trainer applied (consecutive epochs on a node that ran with different
// settings) and the throughput measured before and after each: tokens ÷
// seconds of the whole windows after warmup in the stretch of epochs with
// the old settings and in the one with the new. Nodes that applied a change
// at the same epoch are one change whose rates add up (all the run's GPUs).
// The advisor's beliefs are skipped where the trainer reported its own.
func Changes(h *trainmeterv1.DataloaderHistoryResponse) []*trainmeterv1.DataloaderChange {
	type stretch struct {
		workers, prefetch uint32
		tokens            uint64
		secs              float64
		last              *trainmeterv1.DataloaderEpoch // its last epoch
	}
	type mergeKey struct {
		epoch                  int64
		fromW, fromP, toW, toP uint32
	}
	merged := map[mergeKey]*trainmeterv1.DataloaderChange{}
	// A side some node did not measure is unknown: the others' rates alone
	// would not be the run's.
	unmeasured := map[*float64]bool{}
	var order []mergeKey
	addRate := func(rate *float64, tokens uint64, secs float64) {
		if secs <= 0 || unmeasured[rate] {
			*rate, unmeasured[rate] = -1, true
			return
		}
		*rate = max(*rate, 0) + float64(tokens)/secs
	}
	// Where the trainer reported what its epochs ran with, only its reports
	// count: the advisor's belief could differ from them (advice applied
	// relative to the real loader) and show a change that never happened.
	reported := slices.ContainsFunc(h.GetEpochs(), (*trainmeterv1.DataloaderEpoch).GetRanReported)
	byNode := map[string][]*trainmeterv1.DataloaderEpoch{}
	var nodes []string
	for _, e := range h.GetEpochs() {
		if reported && !e.GetRanReported() {
			continue
		}
		if _, ok := byNode[e.GetNode()]; !ok {
			nodes = append(nodes, e.GetNode())
		}
		byNode[e.GetNode()] = append(byNode[e.GetNode()], e)
	}
	for _, node := range nodes {
		var stretches []*stretch
		for _, e := range byNode[node] {
			n := len(stretches)
			if n == 0 || stretches[n-1].workers != e.GetRanNumWorkers() || stretches[n-1].prefetch != e.GetRanPrefetchFactor() {
				stretches = append(stretches, &stretch{workers: e.GetRanNumWorkers(), prefetch: e.GetRanPrefetchFactor()})
			}
			st := stretches[len(stretches)-1]
			st.tokens += e.GetMeasuredTokens()
			st.secs += e.GetMeasuredS()
			st.last = e
		}
		for i := 1; i < len(stretches); i++ {
			before, after := stretches[i-1], stretches[i]
			k := mergeKey{before.last.GetEpoch(), before.workers, before.prefetch, after.workers, after.prefetch}
			c := merged[k]
			if c == nil {
				c = &trainmeterv1.DataloaderChange{
					AppliedAfterEpoch: k.epoch, AppliedAt: before.last.GetEnd(),
					FromNumWorkers: before.workers, FromPrefetchFactor: before.prefetch,
					NumWorkers: after.workers, PrefetchFactor: after.prefetch,
					TokensPerSBefore: -1, TokensPerSAfter: -1, MeasuredSpeedup: -1, Reported: reported,
				}
				merged[k] = c
				order = append(order, k)
			}
			c.Nodes = append(c.Nodes, node)
			addRate(&c.TokensPerSBefore, before.tokens, before.secs)
			addRate(&c.TokensPerSAfter, after.tokens, after.secs)
			c.MeasuredSBefore = max(c.MeasuredSBefore, before.secs)
			c.MeasuredSAfter = max(c.MeasuredSAfter, after.secs)
			// The advice behind it: the last one delivered to the node
			// before the boundary. An evaluation is stamped with the end of
			// its 1 s window, which may hold the boundary too (the window
			// is judged before the eval in it), hence the second of slack;
			// the next change cannot come that soon (it needs two fresh
			// evaluations after the boundary).
			upTo := c.GetAppliedAt().AsTime().Add(time.Second)
			for _, ev := range h.GetEvaluations() {
				if ev.GetNode() == node && ev.GetChanged() && ev.GetDelivered() && ev.GetTime().AsTime().Before(upTo) {
					c.Classification, c.ExpectedGain = ev.GetClassification(), ev.GetExpectedGain()
				}
			}
		}
	}
	sort.SliceStable(order, func(i, j int) bool { return order[i].epoch < order[j].epoch })
	out := make([]*trainmeterv1.DataloaderChange, 0, len(order))
	for _, k := range order {
		c := merged[k]
		if c.GetTokensPerSBefore() > 0 && c.GetTokensPerSAfter() >= 0 {
			c.MeasuredSpeedup = c.GetTokensPerSAfter() / c.GetTokensPerSBefore()
		}
		out = append(out, c)
	}
	return out
}

package dataloadersvc

import (
	"slices"
	"testing"

	"github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func epochOn(node string, epoch int64, workers, prefetch uint32, tokens uint64, secs float64, reported bool) *trainmeterv1.DataloaderEpoch {
	e := &trainmeterv1.DataloaderEpoch{Node: node, Epoch: epoch, RanNumWorkers: workers, RanPrefetchFactor: prefetch,
		MeasuredTokens: tokens, MeasuredS: secs, TokensPerS: -1, RanReported: reported, End: testutil.TS(float64(10 * epoch))}
	if secs > 0 {
		e.TokensPerS = float64(tokens) / secs
	}
	return e
}

// Two nodes switch at the same boundary: one change, their rates summed
// (all the run's GPUs); a side one node did not measure is unknown; the
// advisor's belief is ignored where the trainer reported its settings.
func TestChangesAcrossNodes(t *testing.T) {
	h := &trainmeterv1.DataloaderHistoryResponse{
		Evaluations: []*trainmeterv1.DataloaderEvaluation{
			{Node: "a", Time: testutil.TS(5), Changed: true, Delivered: true, Classification: "data-bound", ExpectedGain: 0.5},
		},
		Epochs: []*trainmeterv1.DataloaderEpoch{
			epochOn("a", 1, 0, 2, 4000, 4, true), // 1000 tok/s
			epochOn("a", 2, 1, 4, 8000, 4, true), // 2000
			epochOn("a", 3, 1, 4, 4000, 2, true), // 2000: the same stretch
			epochOn("a", 4, 3, 8, 100, 1, false), // the advisor's belief: not a change
			epochOn("b", 1, 0, 2, 2000, 4, true), // 500
			epochOn("b", 2, 1, 4, 9000, 6, true), // 1500
		},
	}
	cs := Changes(h)
	if len(cs) != 1 {
		t.Fatalf("changes %v, want one", cs)
	}
	c := cs[0]
	if c.AppliedAfterEpoch != 1 || c.FromNumWorkers != 0 || c.NumWorkers != 1 || c.FromPrefetchFactor != 2 || c.PrefetchFactor != 4 ||
		c.TokensPerSBefore != 1500 || c.TokensPerSAfter != 3500 || c.MeasuredSBefore != 4 || c.MeasuredSAfter != 6 ||
		!slices.Equal(c.Nodes, []string{"a", "b"}) || c.Classification != "data-bound" || c.ExpectedGain != 0.5 || !c.Reported {
		t.Errorf("change %v", c)
	}
	if want := 3500.0 / 1500; c.MeasuredSpeedup != want {
		t.Errorf("speedup %v, want %v", c.MeasuredSpeedup, want)
	}

	h.Epochs[5] = epochOn("b", 2, 1, 4, 0, 0, true) // b measured no whole window after
	c = Changes(h)[0]
	if c.TokensPerSBefore != 1500 || c.TokensPerSAfter != -1 || c.MeasuredSpeedup != -1 {
		t.Errorf("with a side unmeasured on b: %v, want after and speedup unknown", c)
	}
}

package spool

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/trainmeter/trainmeter/internal/batchcheck"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// refuses is the collector's verdict on a batch's loss records (it checks
// them with the same code): the error it would refuse the batch with.
func refuses(b *trainmeterv1.Batch) error {
	for _, l := range b.GetLosses() {
		if err := batchcheck.Loss(l); err != nil {
			return err
		}
	}
	for _, l := range b.GetNodeLosses() {
		if err := batchcheck.NodeLoss(l); err != nil {
			return err
		}
	}
	return nil
}

// A refused batch's loss records go on with the next batch. Before, a
// figure past the collector's limit (a garbled 2e12 J window) or a reason
// cut inside a UTF-8 character made a record the collector refuses, so the
// next batch was refused for it, its records went on to the one after, and
// no batch of the node got through any more.
func TestARefusedBatchDoesNotGetTheNextOnesRefused(t *testing.T) {
	for name, c := range map[string]struct {
		edit   func(b *trainmeterv1.Batch)
		reason string
	}{
		"garbled run energy": {edit: func(b *trainmeterv1.Batch) { b.RunWindows[0].EnergyCounterJ = 2e12 },
			reason: "run_windows[0]: energy_counter_j is implausibly large"},
		"garbled node energy": {edit: func(b *trainmeterv1.Batch) {
			b.GpuWindows = []*trainmeterv1.GpuWindow{{EnergyCounterJ: 2e12, CounterOk: true, GpuSeconds: 1}}
		}, reason: "gpu_windows[0]: energy_counter_j is implausibly large"},
		// "rejected: " + 189 bytes puts 'é' across the 200-byte cut.
		"reason cut in a character": {edit: func(*trainmeterv1.Batch) {},
			reason: strings.Repeat("x", 189) + "é and the rest"},
	} {
		t.Run(name, func(t *testing.T) {
			lg, _ := testLogger(t)
			s, err := OpenWith(t.TempDir(), 0, Options{Logger: lg})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			first := batch(1, "r")
			c.edit(first)
			mustAppend(t, s, first)
			s.Cursor(0).Reject(first.Seq, c.reason)
			for i := 2; i <= 5; i++ {
				b := batch(i, "r")
				mustAppend(t, s, b)
				if err := refuses(b); err != nil {
					t.Fatalf("batch %d refused: %v (losses %v, node losses %v)", i, err, b.Losses, b.NodeLosses)
				}
				carried := append(b.Losses, b.NodeLosses...)
				// The refused batch is still reported lost for the run and
				// the node, the garbled figure left out.
				if i == 2 && (len(b.Losses) != 1 || b.Losses[0].Batches != 1 || b.Losses[0].Tokens != 1 ||
					len(b.NodeLosses) != 1 || b.NodeLosses[0].Batches != 1) {
					t.Fatalf("batch 2 carries losses %v, node losses %v: want the refused batch's, one each", b.Losses, b.NodeLosses)
				}
				for _, l := range carried {
					if !utf8.ValidString(l.Reason) || !strings.HasPrefix(l.Reason, "rejected: ") {
						t.Errorf("batch %d: loss reason %q", i, l.Reason)
					}
				}
				s.Cursor(0).Ack(b.Seq)
			}
		})
	}
}

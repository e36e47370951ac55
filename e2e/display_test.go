package e2e

import (
	"context"
	"testing"
	"time"

	pb "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Issue 15, items 3-6: what the figures shown mean, through the real
// binaries.

// TestEpochTableCountsEachEpochsSteps: 20 steps per epoch, the evals falling
// inside a second (an epoch lasts 0.6 s), must show 20 per epoch and the
// 7 steps after the last eval as a partial epoch. Counting the 1 s windows
// showed 22/18.
func TestEpochTableCountsEachEpochsSteps(t *testing.T) {
	c := startCollector(t)
	sock := c.startAgent("node", "sim:1")
	c.waitStreaming("node")
	tr := dialTrainer(t, sock)
	const run, perEpoch, epochs, tail = "epochs", 20, 4, 7
	tr.send(`{"event":"run_start","run_id":%q,"model":"m","gpus":[0],"warmup_s":0}`, run)
	step := 0
	for e := 1; e <= epochs; e++ {
		for range perEpoch {
			step++
			time.Sleep(30 * time.Millisecond) // the trainer's pace, not synchronisation
			tr.send(`{"event":"step","run_id":%q,"step":%d,"tokens":100,"compute_s":0.03}`, run, step)
		}
		tr.send(`{"event":"eval","run_id":%q,"epoch":%d,"val_loss":1}`, run, e)
	}
	for range tail {
		step++
		time.Sleep(30 * time.Millisecond)
		tr.send(`{"event":"step","run_id":%q,"step":%d,"tokens":100,"compute_s":0.03}`, run, step)
	}
	tr.sync()
	tr.send(`{"event":"run_end","run_id":%q}`, run)
	c.waitEnded(run)

	rc := c.recommendClient()
	var h *pb.DataloaderHistoryResponse
	c.eventually("the partial epoch stored", func() bool {
		var err error
		h, err = rc.DataloaderHistory(context.Background(), &pb.DataloaderHistoryRequest{RunId: run})
		return err == nil && len(h.Epochs) == epochs+1
	})
	for i, e := range h.Epochs {
		want := uint64(perEpoch)
		if i == epochs {
			want = tail
		}
		if e.Epoch != int64(i+1) || e.Steps != want || e.Partial != (i == epochs) {
			t.Errorf("epoch row %d: epoch %d, %d steps, partial %v; want epoch %d, %d steps, partial %v",
				i, e.Epoch, e.Steps, e.Partial, i+1, want, i == epochs)
		}
	}
}

package ledger

import (
	"fmt"
	"strconv"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
)

// runMeta is the metadata of the run_start that started a run; a rank that
// joins must not contradict it.
type runMeta struct {
	model, dataset, backend, optimizer, precision string
	batchSize, gradAccum, seqLen                  *int64
}

func metaOf(ev *trainerproto.RunStart) runMeta {
	return runMeta{model: ev.Model, dataset: ev.Dataset, backend: ev.Backend, optimizer: ev.Optimizer,
		precision: ev.Precision, batchSize: ev.BatchSize, gradAccum: ev.GradAccum, seqLen: ev.SeqLen}
}

// conflict reports the first field that both the run and a joining
// run_start set, to different values. Fields either side leaves out never
// conflict, nor do seed and notes (ranks often differ there).
func (m runMeta) conflict(ev *trainerproto.RunStart) error {
	strs := []struct{ key, have, got string }{
		{"model", m.model, ev.Model}, {"dataset", m.dataset, ev.Dataset}, {"backend", m.backend, ev.Backend},
		{"optimizer", m.optimizer, ev.Optimizer}, {"precision", m.precision, ev.Precision},
	}
	for _, s := range strs {
		if s.have != "" && s.got != "" && s.have != s.got {
			return fmt.Errorf("%s %q != %q", s.key, s.got, s.have)
		}
	}
	ints := []struct {
		key       string
		have, got *int64
	}{{"batch_size", m.batchSize, ev.BatchSize}, {"grad_accum", m.gradAccum, ev.GradAccum}, {"seq_len", m.seqLen, ev.SeqLen}}
	for _, n := range ints {
		if n.have != nil && n.got != nil && *n.have != *n.got {
			return fmt.Errorf("%s %s != %s", n.key, strconv.FormatInt(*n.got, 10), strconv.FormatInt(*n.have, 10))
		}
	}
	return nil
}

package agent

// Advice and stop from a collector pair reach the trainer once. Both
// collectors get the same batches and evaluate the same rules, so each sends
// the same decisions, at slightly different times and with figures that may
// differ in the last digits (a budget at 101 % on one, 102 % on the other).
// A decision is therefore keyed by what the trainer acts on: the run and
// "stop", or the run and the dataloader setting advised. Each collector's
// n-th sending of a key is one delivery: the first collector to send it
// delivers, the other's same decision is dropped, and a collector that
// sends a key again (a setting advised, changed, then advised again) is
// heard again. Keys idle for adviceDedupWindow are forgotten. Replicas in
// mode any are told apart the same way (by their place in the list): the
// replica an agent moves to may send a decision the one before it already
// sent, and the trainer hears it once.

import (
	"fmt"
	"sync"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/spool"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// adviceDedupWindow is how long a decision is remembered after it was last
// sent by either collector: far longer than the two collectors of a pair
// take to see the same batches (seconds, or a catch-up after an outage).
const adviceDedupWindow = 10 * time.Minute

type adviceKeyState struct {
	sent      [spool.MaxCollectors]uint32 // times each collector sent the key
	delivered uint32                      // times it reached the trainer
	last      time.Time
}

type adviceDedup struct {
	clock clock.Clock
	mu    sync.Mutex
	keys  map[string]*adviceKeyState
}

func newAdviceDedup(clk clock.Clock) *adviceDedup {
	return &adviceDedup{clock: clk, keys: map[string]*adviceKeyState{}}
}

// adviceKey is what the trainer acts on; "" for an advisory it ignores.
func adviceKey(adv *trainmeterv1.Advisory) string {
	switch x := adv.Advice.(type) {
	case *trainmeterv1.Advisory_Stop:
		return adv.RunId + "\x00stop"
	case *trainmeterv1.Advisory_Dataloader:
		return fmt.Sprintf("%s\x00dataloader %d %d", adv.RunId, x.Dataloader.GetNumWorkers(), x.Dataloader.GetPrefetchFactor())
	}
	return ""
}

// first reports whether the advisory from the collector-th collector is to
// be delivered: no other collector delivered it for this sending.
func (d *adviceDedup) first(collector int, adv *trainmeterv1.Advisory) bool {
	k := adviceKey(adv)
	if k == "" || collector < 0 || collector >= spool.MaxCollectors {
		return true
	}
	now := d.clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	for key, st := range d.keys {
		if now.Sub(st.last) > adviceDedupWindow {
			delete(d.keys, key)
		}
	}
	st := d.keys[k]
	if st == nil {
		st = &adviceKeyState{}
		d.keys[k] = st
	}
	st.last = now
	st.sent[collector]++
	if st.sent[collector] <= st.delivered {
		return false
	}
	st.delivered = st.sent[collector]
	return true
}

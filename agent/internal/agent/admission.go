package agent

import (
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
)

// Admission limits for events that become records of their own in a batch
// (run_start, eval); steps are summed into windows and need none. Without
// them one client flooding evals or new run ids would build a batch the
// collector must reject (more than ingest.MaxRunEvents events or
// ingest.MaxRunWindows windows) or cannot receive (over its 16 MiB message
// limit), and every run's data in that batch would be lost. A batch collects
// events for at most about 3 s (its window plus the settle delay), so it
// holds at most about 4 × the per-second rates below.
const (
	maxEventsPerSec     = 2000
	maxEventBytesPerSec = 2 << 20
	maxActiveRuns       = 2000
)

// admission is a token bucket over event count and (estimated) bytes.
type admission struct {
	mu            sync.Mutex
	last          time.Time
	events, bytes float64
}

func (ad *admission) allow(now time.Time, size int) bool {
	ad.mu.Lock()
	defer ad.mu.Unlock()
	if ad.last.IsZero() {
		ad.events, ad.bytes = maxEventsPerSec, maxEventBytesPerSec
	} else if dt := now.Sub(ad.last).Seconds(); dt > 0 {
		ad.events = min(ad.events+dt*maxEventsPerSec, maxEventsPerSec)
		ad.bytes = min(ad.bytes+dt*maxEventBytesPerSec, maxEventBytesPerSec)
	}
	ad.last = now
	if ad.events < 1 || ad.bytes < float64(size) {
		return false
	}
	ad.events--
	ad.bytes -= float64(size)
	return true
}

// eventSize estimates an event's size in a batch (its strings plus overhead).
func eventSize(ev trainerproto.Event) int {
	n := 64 + len(ev.RunID())
	if s, ok := ev.(*trainerproto.RunStart); ok {
		n += 128 + proto.Size(s.Start) + 48*len(s.GPUs)
	}
	return n
}

//go:build linux

package trainersock

import (
	"bytes"
	"fmt"
	"io"
	"runtime/trace"
	"strings"
	"testing"

	xtrace "golang.org/x/exp/trace"

	"github.com/trainmeter/trainmeter/internal/testkit"
)

// Reading a trainer's lines must not go through the Go runtime's system
// call path: every such call wakes the runtime's sysmon thread on an idle
// agent and sets it polling every 20 µs, which made each trainer step cost
// the agent ~14 context switches (docs/benchmarks.md, appendix, "Third round"). The
// execution tracer records every goroutine that enters that path
// (GoRunning → GoSyscall) with its stack; the reader goroutine must never
// appear there, one line at a time or many at once.
func TestTrainerLinesAreReadWithoutEnteringSyscalls(t *testing.T) {
	rec := newRecorder()
	s := start(t, Config{}, rec)
	c := dial(t, s.cfg.Path)
	c.send(`{"event":"run_start","run_id":"r1","model":"m","gpus":[0]}`)
	testkit.Eventually(t, "run_start handled", func() bool { return rec.numEvents() == 1 })

	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Fatal(err)
	}
	const steps = 40
	for i := 1; i <= steps; i++ {
		c.send(fmt.Sprintf(`{"event":"step","run_id":"r1","step":%d,"tokens":%d}`, i, 10*i))
		// One line at a time, as a trainer sends them: each is a wakeup.
		testkit.Eventually(t, "step handled", func() bool { return rec.numEvents() == 1+i })
	}
	// A burst longer than the reader's buffer, split across reads.
	long := strings.Repeat("x", 3*readBufSize)
	c.send(fmt.Sprintf(`{"event":"step","run_id":"r1","step":%d,"tokens":1,"note":%q}`, steps+1, long))
	testkit.Eventually(t, "long step handled", func() bool { return rec.numEvents() == 2+steps })
	trace.Stop()

	r, err := xtrace.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	var viaSyscall, readerSeen int
	for {
		ev, err := r.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Kind() != xtrace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != xtrace.ResourceGoroutine {
			continue
		}
		inReader := false
		for f := range st.Stack.Frames() {
			if strings.HasSuffix(f.Func, "trainersock.(*Server).readLoop") {
				inReader = true
			}
		}
		if !inReader {
			continue
		}
		readerSeen++
		if _, to := st.Goroutine(); to == xtrace.GoSyscall {
			viaSyscall++
		}
	}
	if readerSeen == 0 {
		t.Fatal("the trace holds no state change of the reader goroutine: the test sees nothing")
	}
	if viaSyscall != 0 {
		t.Errorf("the reader entered the runtime's system call path %d times for %d lines (want 0)", viaSyscall, steps+1)
	}
}

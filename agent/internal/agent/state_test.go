package agent

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/gpu/simgpu"
	"github.com/trainmeter/trainmeter/agent/internal/ledger"
	"github.com/trainmeter/trainmeter/agent/internal/spool"
	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/clock"
	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// stateRig is the part of an agent that checkpoints and restores its
// ledger, over real files in a spool directory, one "process" at a time.
type stateRig struct {
	t       *testing.T
	dir     string
	fake    *clock.Fake
	backend *simgpu.Backend
	a       *Agent
	logs    *testkit.Buffer
	samples []gpu.Sample
}

func newStateRig(t *testing.T, dir string, open func(string) (stateSlotFile, error)) *stateRig {
	return newStateRigAt(t, dir, open, clock.NewFake(time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)))
}

func newStateRigAt(t *testing.T, dir string, open func(string) (stateSlotFile, error), fake *clock.Fake) *stateRig {
	r := &stateRig{t: t, dir: dir, fake: fake, backend: simgpu.New(2, 1)}
	r.samples = make([]gpu.Sample, 2)
	r.start(open)
	return r
}

// start is a new agent process on the same spool directory: it restores
// what the previous one left.
func (r *stateRig) start(open func(string) (stateSlotFile, error)) {
	r.t.Helper()
	if r.a != nil {
		_ = r.a.state.close() // the previous process is gone (kill -9 or not)
	}
	cfg := DefaultConfig()
	cfg.Spool = r.dir
	r.logs = &testkit.Buffer{}
	lg := slog.New(slog.NewTextHandler(r.logs, nil))
	r.a = &Agent{cfg: cfg, clock: r.fake, log: lg, state: newStateSlots(r.dir, open),
		ledger: ledger.New(ledger.Config{Devices: r.backend.Devices(), Logger: lg})}
	r.t.Cleanup(func() { _ = r.a.state.close() })
	r.fake.Advance(time.Second)
	if err := r.a.restoreLedger(); err != nil {
		r.t.Fatal(err)
	}
}

func (r *stateRig) startRun(id string) {
	r.t.Helper()
	w := 0.0
	if err := r.a.ledger.StartRun(r.fake.Now(), ledger.Peer{ConnID: 1, PID: 1}, &trainerproto.RunStart{Run: id, GPUs: []string{"0"}, WarmupS: &w}); err != nil {
		r.t.Fatal(err)
	}
}

// window runs the sampling loop's work until a window closes, and
// checkpoints as the loop does.
func (r *stateRig) window() {
	r.t.Helper()
	for range 100 {
		r.fake.Advance(50 * time.Millisecond)
		now := r.fake.Now()
		_ = r.backend.Read(now, r.samples)
		if len(r.a.ledger.Tick(now, r.samples)) > 0 {
			r.a.checkpoint(now)
			return
		}
	}
	r.t.Fatal("no window closed in 5 s")
}

func (r *stateRig) runs() []string {
	runs := r.a.ledger.ActiveRuns()
	slices.Sort(runs)
	return runs
}

func (r *stateRig) slot(i int) string { return filepath.Join(r.dir, stateSlotNames[i]) }

// newestSlot is the slot holding the last checkpoint written.
func (r *stateRig) newestSlot() int { return 1 - r.a.state.next }

func TestStateSlotsResumeRunsAfterRestart(t *testing.T) {
	r := newStateRig(t, t.TempDir(), nil)
	r.startRun("a")
	r.window()
	r.startRun("b")
	r.window()
	r.window()
	r.start(nil)
	if got := r.runs(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("resumed runs %v, want [a b]\n%s", got, r.logs)
	}
	if strings.Contains(r.logs.String(), "level=WARN") || strings.Contains(r.logs.String(), "level=ERROR") {
		t.Errorf("a clean restart logged a problem:\n%s", r.logs)
	}
}

func TestTornNewerStateSlotFallsBackToTheOlder(t *testing.T) {
	for _, damage := range []string{"cut in the payload", "cut in the header", "payload bytes changed"} {
		t.Run(damage, func(t *testing.T) {
			r := newStateRig(t, t.TempDir(), nil)
			r.startRun("a")
			r.window() // the older checkpoint: run a
			r.startRun("b")
			r.window() // the newer: runs a and b, torn below
			newest := r.slot(r.newestSlot())
			b, err := os.ReadFile(newest)
			if err != nil {
				t.Fatal(err)
			}
			switch damage {
			case "cut in the payload":
				b = b[:stateSlotHeader+(len(b)-stateSlotHeader)/2]
			case "cut in the header":
				b = b[:stateSlotHeader/2]
			default:
				b[len(b)-3] ^= 0x55
			}
			if err := os.WriteFile(newest, b, 0o600); err != nil {
				t.Fatal(err)
			}
			r.start(nil)
			if got := r.runs(); !slices.Equal(got, []string{"a"}) {
				t.Errorf("resumed runs %v, want [a] from the older slot\n%s", got, r.logs)
			}
			logs := r.logs.String()
			if !strings.Contains(logs, "ledger state slot unreadable") || !strings.Contains(logs, filepath.Base(newest)) ||
				!strings.Contains(logs, "resuming from the readable ledger state slot") {
				t.Errorf("the torn slot is not reported:\n%s", logs)
			}
			// The next checkpoint overwrites the torn slot, not the one
			// just resumed from.
			r.window()
			if got, err := os.ReadFile(newest); err != nil || string(got) == string(b) {
				t.Errorf("the torn slot was not the one overwritten next (err %v)", err)
			}
			r.start(nil)
			if got := r.runs(); !slices.Equal(got, []string{"a"}) || strings.Contains(r.logs.String(), "unreadable") {
				t.Errorf("after one more checkpoint: runs %v, logs:\n%s", got, r.logs)
			}
		})
	}
}

func TestBothStateSlotsCorruptStartsClean(t *testing.T) {
	r := newStateRig(t, t.TempDir(), nil)
	r.startRun("a")
	r.window()
	r.window()
	for i := range stateSlotNames {
		if err := os.WriteFile(r.slot(i), []byte("TMLEDGST garbage that is no checkpoint at all"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r.start(nil)
	if got := r.runs(); len(got) != 0 {
		t.Errorf("runs %v resumed from corrupt slots", got)
	}
	logs := r.logs.String()
	if strings.Count(logs, "ledger state slot unreadable") != 2 || !strings.Contains(logs, "no ledger state slot is readable; starting afresh") {
		t.Errorf("want both slots and the clean start reported:\n%s", logs)
	}
	// The agent goes on checkpointing, and the next start resumes.
	r.startRun("c")
	r.window()
	r.start(nil)
	if got := r.runs(); !slices.Equal(got, []string{"c"}) {
		t.Errorf("runs %v after a checkpoint over corrupt slots, want [c]\n%s", got, r.logs)
	}
}

// A ledger state slot written by another state format (a newer agent's)
// is refused: the error names the file, both formats and the way out, and
// neither slot is touched, so the agent that wrote it can still resume.
func TestRestoreRefusesAnotherStateFormat(t *testing.T) {
	r := newStateRig(t, t.TempDir(), nil)
	r.startRun("a")
	r.window()
	r.window()
	newest := r.slot(r.newestSlot())
	b, err := os.ReadFile(newest)
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint32(b[8:12], 2)
	if err := os.WriteFile(newest, b, 0o600); err != nil {
		t.Fatal(err)
	}
	before := [2][]byte{}
	for i := range before {
		before[i], _ = os.ReadFile(r.slot(i))
	}
	_ = r.a.state.close()
	a := &Agent{cfg: r.a.cfg, clock: r.fake, log: r.a.log, state: newStateSlots(r.dir, nil),
		ledger: ledger.New(ledger.Config{Devices: r.backend.Devices()})}
	defer a.state.close()
	err = a.restoreLedger()
	var fe *spool.FormatError
	if !errors.As(err, &fe) {
		t.Fatalf("restore: %v, want a *spool.FormatError", err)
	}
	for _, want := range []string{"ledger state " + newest, "ledger state format 2", "this agent reads 1",
		"move it aside (the open runs it holds are not resumed) or run the agent that wrote it"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if runs := a.ledger.ActiveRuns(); len(runs) != 0 {
		t.Errorf("runs %v resumed from a refused state", runs)
	}
	for i := range before {
		if after, _ := os.ReadFile(r.slot(i)); string(after) != string(before[i]) {
			t.Errorf("slot %d changed", i)
		}
	}
}

// countingSlot counts the calls on a slot file.
type countingSlot struct {
	stateSlotFile
	c *slotCalls
}

type slotCalls struct {
	mu                        sync.Mutex
	opens, reads, writes, cls int
	writeOffsets              []int64
}

func (f countingSlot) ReadAt(p []byte, off int64) (int, error) {
	f.c.mu.Lock()
	f.c.reads++
	f.c.mu.Unlock()
	return f.stateSlotFile.ReadAt(p, off)
}

func (f countingSlot) WriteAt(p []byte, off int64) (int, error) {
	f.c.mu.Lock()
	f.c.writes++
	f.c.writeOffsets = append(f.c.writeOffsets, off)
	f.c.mu.Unlock()
	return f.stateSlotFile.WriteAt(p, off)
}

func (f countingSlot) Close() error {
	f.c.mu.Lock()
	f.c.cls++
	f.c.mu.Unlock()
	return f.stateSlotFile.Close()
}

func (c *slotCalls) snapshot() slotCalls {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slotCalls{opens: c.opens, reads: c.reads, writes: c.writes, cls: c.cls, writeOffsets: slices.Clone(c.writeOffsets)}
}

func TestCheckpointIsOneWriteAtOnAFileKeptOpen(t *testing.T) {
	calls := &slotCalls{}
	open := func(name string) (stateSlotFile, error) {
		f, err := openStateSlotFile(name)
		if err != nil {
			return nil, err
		}
		calls.mu.Lock()
		calls.opens++
		calls.mu.Unlock()
		return countingSlot{stateSlotFile: f, c: calls}, nil
	}
	r := newStateRig(t, t.TempDir(), open)
	r.startRun("a")
	before := calls.snapshot()
	if before.opens != 2 || before.writes != 0 {
		t.Fatalf("at start: %d opens, %d writes; want both slots opened once, nothing written", before.opens, before.writes)
	}
	r.window()
	first := calls.snapshot()
	const n = 10
	for range n {
		r.window()
	}
	after := calls.snapshot()
	if got := after.writes - first.writes; got != n {
		t.Errorf("%d checkpoints made %d writes; want one each", n, got)
	}
	if after.opens != 2 || after.reads != first.reads || after.cls != 0 {
		t.Errorf("checkpoints opened %d, read %d, closed %d times; want no open, read or close", after.opens-2, after.reads-first.reads, after.cls)
	}
	for _, off := range after.writeOffsets {
		if off != 0 {
			t.Errorf("write at offset %d; each slot is overwritten whole from 0", off)
		}
	}
	// And there is nothing else in the directory to write to.
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"ledger-state.0", "ledger-state.1"}) {
		t.Errorf("spool directory holds %v", names)
	}
	if err := r.a.state.close(); err != nil || calls.snapshot().cls != 2 {
		t.Errorf("close: %v, %d slot files closed", err, calls.snapshot().cls)
	}
}

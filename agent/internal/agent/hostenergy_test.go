package agent

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/gpu/simgpu"
	"github.com/trainmeter/trainmeter/agent/internal/ledger"
	"github.com/trainmeter/trainmeter/agent/internal/rapl"
	"github.com/trainmeter/trainmeter/pkg/clock"
)

// raplFixture copies agent/internal/rapl's two-socket tree; set writes a counter the
// way the kernel's file reads (the agent opens it anew at every read).
type raplFixture struct {
	t    *testing.T
	root string
	uj   map[string]uint64
}

func newRAPLFixture(t *testing.T) *raplFixture {
	t.Helper()
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS("../rapl/testdata/two-sockets")); err != nil {
		t.Fatal(err)
	}
	f := &raplFixture{t: t, root: root, uj: map[string]uint64{}}
	for _, z := range []string{"intel-rapl:0", "intel-rapl:0:0", "intel-rapl:1", "intel-rapl:1:0"} {
		b, err := os.ReadFile(filepath.Join(root, "class", "powercap", z, "energy_uj"))
		if err != nil {
			t.Fatal(err)
		}
		f.uj[z], _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	return f
}

// add advances zone's counter by joules.
func (f *raplFixture) add(zone string, joules uint64) {
	f.t.Helper()
	f.uj[zone] += joules * 1e6
	p := filepath.Join(f.root, "class", "powercap", zone, "energy_uj")
	if err := os.WriteFile(p, []byte(strconv.FormatUint(f.uj[zone], 10)+"\n"), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// writeStat writes a procfs fixture's PID/stat with the given CPU ticks
// (utime, stime, cutime, cstime), as proc(5) lays it out.
func writeStat(t *testing.T, procRoot string, pid, ppid int, utime, stime, cutime, cstime int) {
	t.Helper()
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("%d (python3 (train) x) S %d %d %d 0 -1 4194560 100 0 0 0 %d %d %d %d 20 0 4 0 12345 1000000 100 18446744073709551615\n",
		pid, ppid, pid, pid, utime, stime, cutime, cstime)
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReadProcStatAndTreeCPU(t *testing.T) {
	proc := t.TempDir()
	writeStat(t, proc, 4242, 1, 100, 50, 30, 20) // 200 ticks
	writeStat(t, proc, 4243, 4242, 70, 30, 0, 0) // its child: 100
	writeStat(t, proc, 4244, 4243, 10, 0, 0, 0)  // grandchild: 10
	writeStat(t, proc, 5252, 1, 40, 10, 0, 0)    // another run: 50
	writeStat(t, proc, 6000, 1, 999, 0, 0, 0)    // no run's
	got := treeCPU(proc, []ledger.SharedRun{{ID: "a", Roots: []int{4242, 4243}}, {ID: "b", Roots: []int{5252}}, {ID: "gone", Roots: []int{7777}}})
	if got["a"] != 3.1 || got["b"] != 0.5 {
		t.Fatalf("tree CPU %v, want a 3.1 s, b 0.5 s", got)
	}
	if _, ok := got["gone"]; ok {
		t.Fatal("a run with no process found got a CPU time")
	}
}

func waitReads(t *testing.T, a *Agent, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, reads := a.hostEnergyStatus(); reads >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("RAPL read %d never happened", n)
		}
		time.Sleep(time.Millisecond)
	}
}

// The agent reads the RAPL fixture on the injected clock and ships each
// run's share: exactly the counters' difference while a run is alone, by
// its process tree's CPU time while two share the node.
func TestAgentShipsHostEnergyFromRAPLFixture(t *testing.T) {
	rec, collectorAddr := startRecorder(t)

	fx := newRAPLFixture(t)
	proc := t.TempDir()
	fake := clock.NewFake(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC))
	cfg := DefaultConfig()
	cfg.Collector = collectorAddr
	cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	cfg.Spool = filepath.Join(t.TempDir(), "spool")
	cfg.Node = "test-node"
	cfg.GPU = "sim:1"
	cfg.SysfsRoot = fx.root
	cfg.ProcfsRoot = proc
	a, err := New(cfg, simgpu.New(1, 1), fake, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st := a.Status().HostEnergy; st.Status != "ok: 2 socket(s), package and dram" || st.Reads != 1 {
		t.Fatalf("host energy status %+v", st)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	tr := dialTrainer(t, cfg.Socket)

	fake.Advance(time.Second)
	waitReads(t, a, 2)
	fx.add("intel-rapl:0", 5) // before any run: idle
	writeStat(t, proc, 4242, 1, 0, 0, 0, 0)
	writeStat(t, proc, 4243, 4242, 0, 0, 0, 0)
	writeStat(t, proc, 5252, 1, 0, 0, 0, 0)
	fake.Advance(time.Second)
	waitReads(t, a, 3)
	tr.send(`{"event":"run_start","run_id":"a","model":"m","warmup_s":0,"attribute_pid":4242}`)
	tr.sync()
	fx.add("intel-rapl:0", 100)
	fx.add("intel-rapl:1", 50)
	fx.add("intel-rapl:0:0", 12)
	fx.add("intel-rapl:1:0", 8)
	fake.Advance(time.Second)
	waitReads(t, a, 4)
	tr2 := dialTrainer(t, cfg.Socket)
	tr2.send(`{"event":"run_start","run_id":"b","model":"m","warmup_s":0,"attribute_pid":5252}`)
	tr2.sync()
	fake.Advance(time.Second) // the first shared interval: no CPU reading yet, no energy
	waitReads(t, a, 5)
	writeStat(t, proc, 4242, 1, 200, 50, 20, 10) // a: 2.8 s over its tree
	writeStat(t, proc, 4243, 4242, 10, 10, 0, 0) // + 0.2 s
	writeStat(t, proc, 5252, 1, 80, 20, 0, 0)    // b: 1 s
	fx.add("intel-rapl:0", 300)
	fx.add("intel-rapl:1", 100)
	fx.add("intel-rapl:0:0", 20)
	fx.add("intel-rapl:1:0", 20)
	fake.Advance(time.Second)
	waitReads(t, a, 6)
	tr.send(`{"event":"run_end","run_id":"a"}`)
	tr.sync()
	tr2.send(`{"event":"run_end","run_id":"b"}`)
	tr2.sync()
	fx.add("intel-rapl:1", 7) // after the runs: idle
	fake.Advance(time.Second)
	waitReads(t, a, 7)
	fake.Advance(2 * time.Second)
	fake.Advance(50 * time.Millisecond)

	fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer fcancel()
	if err := a.up.Flush(fctx); err != nil {
		t.Fatalf("batches not acked: %v", err)
	}
	rec.mu.Lock()
	cpu, dram := map[string]float64{}, map[string]float64{}
	var node, idle float64
	for _, b := range rec.batches {
		for _, h := range b.HostEnergy {
			node += h.CpuEnergyJ
			idle += h.IdleCpuEnergyJ
			for _, s := range h.Runs {
				cpu[s.RunId] += s.CpuEnergyJ
				dram[s.RunId] += s.DramEnergyJ
			}
		}
	}
	rec.mu.Unlock()
	// a: 150 J alone + 3/4 of 400 J; b: 1/4 of 400 J
	if cpu["a"] != 450 || cpu["b"] != 100 || dram["a"] != 20+30 || dram["b"] != 10 {
		t.Errorf("cpu %v dram %v, want a 450/50 J, b 100/10 J", cpu, dram)
	}
	if node != 5+150+400+7 || idle != 12 {
		t.Errorf("node %v J idle %v J, want 562 and 12", node, idle)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr.conn.Close()
	tr2.conn.Close()
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// Counters root may not read (as CI runs as root, the refusal is
// injected): a clear status and log, no energy, no crash; read again once
// allowed.
func TestHostEnergyPermissionDenied(t *testing.T) {
	fx := newRAPLFixture(t)
	var logs strings.Builder
	a := bareAgent(fx.root, slog.New(slog.NewTextHandler(&logs, nil)))
	deny := true
	a.openHostEnergy(func(name string) ([]byte, error) {
		if deny && filepath.Base(name) == "energy_uj" {
			return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrPermission}
		}
		return os.ReadFile(name)
	})
	a.pollHostEnergy()
	st, reads := a.hostEnergyStatus()
	if !strings.HasPrefix(st, "permission denied: ") || reads != 0 {
		t.Fatalf("status %q after %d reads", st, reads)
	}
	if n := strings.Count(logs.String(), "RAPL energy counters not readable (permission denied)"); n != 1 || !strings.Contains(logs.String(), "systemd-tmpfiles --create trainmeter-rapl.conf") {
		t.Fatalf("want the refusal logged once with the fix:\n%s", logs.String())
	}
	deny = false
	a.pollHostEnergy()
	if st, reads := a.hostEnergyStatus(); st != "ok: 2 socket(s), package and dram" || reads != 1 {
		t.Fatalf("after the fix: %q, %d reads", st, reads)
	}
	if !strings.Contains(logs.String(), "RAPL energy counters read again") {
		t.Fatalf("recovery not logged:\n%s", logs.String())
	}
}

// bareAgent is the part of an agent that reads host energy, without its
// socket, spool and uplink.
func bareAgent(sysfsRoot string, logger *slog.Logger) *Agent {
	cfg := DefaultConfig()
	cfg.SysfsRoot = sysfsRoot
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Agent{cfg: cfg, clock: clock.NewFake(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)), log: logger,
		ledger: ledger.New(ledger.Config{})}
}

func TestNoPowercapTurnsHostEnergyOff(t *testing.T) {
	a := bareAgent(t.TempDir(), nil)
	a.openHostEnergy(nil)
	if st, _ := a.hostEnergyStatus(); !strings.HasPrefix(st, "no RAPL counters: ") || !strings.Contains(st, rapl.ErrNoPowercap.Error()) {
		t.Fatalf("status %q", st)
	}
}

// BenchmarkTreeCPU sums two runs' process-tree CPU time over this
// machine's real /proc (what each RAPL read adds while runs share a node:
// one pass over every process's stat).
func BenchmarkTreeCPU(b *testing.B) {
	runs := []ledger.SharedRun{{ID: "a", Roots: []int{os.Getpid()}}, {ID: "b", Roots: []int{1}}}
	entries, _ := os.ReadDir("/proc")
	b.ReportMetric(float64(len(entries)), "proc-entries")
	for b.Loop() {
		if got := treeCPU("/proc", runs); len(got) != 2 {
			b.Fatalf("tree CPU %v", got)
		}
	}
}

// A zone that is not summed (psys here) failing to read costs nothing.
func TestHostEnergyIgnoresUnsummedZoneErrors(t *testing.T) {
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS("../rapl/testdata/laptop-no-dram")); err != nil {
		t.Fatal(err)
	}
	a := bareAgent(root, nil)
	a.openHostEnergy(func(name string) ([]byte, error) {
		if strings.Contains(name, "intel-rapl:1/energy_uj") { // psys
			return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrPermission}
		}
		return os.ReadFile(name)
	})
	if st, reads := a.hostEnergyStatus(); st != "ok: 1 socket(s), package (no dram domain: dram_energy_J stays empty)" || reads != 1 {
		t.Fatalf("status %q after %d reads", st, reads)
	}
}

package e2e

// Fault tests of the real binaries: the collector killed, stopped, or its
// database corrupt; the agent's spool too small, on a full disk, or corrupt.
// docs/reliability.md lists them with what each loses.

import (
	"context"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/trainmeter/trainmeter/internal/testkit"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// proc is a daemon the test stops, kills and restarts itself.
type proc struct {
	t       *testing.T
	name    string
	cmd     *exec.Cmd
	done    chan struct{}
	logPath string
}

func startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return startProcIn(t, "", name, args...)
}

// startProcIn is startProc in working directory dir ("": the test's).
func startProcIn(t *testing.T, dir, name string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, done: make(chan struct{})}
	p.logPath = filepath.Join(t.TempDir(), name+".log")
	logf, err := os.Create(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(filepath.Join(binDir, name), args...)
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); logf.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(os.Interrupt)
		if t.Failed() {
			t.Logf("--- %s log ---\n%s", name, p.log())
		}
	})
	return p
}

// stop signals the process and waits for it to exit (SIGKILL after 40 s:
// an agent's graceful stop may wait for its reconnect backoff, up to 30 s).
func (p *proc) stop(sig os.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(40 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// faultCluster is a collector the test can kill and restart on the same
// address and data directory.
type faultCluster struct {
	*cluster
	data string
	col  *proc
}

func newFaultCluster(t *testing.T) *faultCluster {
	t.Helper()
	addr := testkit.FreeAddr(t)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fc := &faultCluster{cluster: &cluster{t: t, addr: addr, q: trainmeterv1.NewQueryServiceClient(conn)}, data: filepath.Join(t.TempDir(), "data")}
	fc.startCollector()
	return fc
}

func (fc *faultCluster) startCollector() {
	fc.t.Helper()
	fc.col = startProc(fc.t, "trainmeter", "serve", "--listen", fc.addr, "--data", fc.data)
	fc.eventually("collector answering", func() bool {
		_, err := fc.q.ListRuns(context.Background(), &trainmeterv1.ListRunsRequest{})
		return err == nil
	})
}

// agentWith starts an agent on the replay trace with the given spool dir.
func (fc *faultCluster) agentWith(node, gpuSpec, spoolDir string, extra ...string) (sock string, p *proc) {
	fc.t.Helper()
	sock = filepath.Join(fc.t.TempDir(), "agent.sock")
	args := append([]string{"--collector", fc.addr, "--socket", sock, "--node", node, "--gpu", gpuSpec,
		"--spool", spoolDir, "--warmup", "30s", "--shutdown-timeout", "2s"}, extra...)
	p = startProc(fc.t, "trainmeter-agent", args...)
	fc.eventually("agent socket", func() bool {
		select {
		case <-p.done:
			fc.t.Fatalf("agent exited:\n%s", p.log())
		default:
		}
		_, err := os.Stat(sock)
		return err == nil
	})
	return sock, p
}

// checkExact asserts a run's figures are what a fault-free run gives: every
// token, and energy within 1 % of the trace's constant power × time.
func checkExact(t *testing.T, row map[string]string, tokens int, gpus int, powerW float64) {
	t.Helper()
	if row["tokens_processed"] != fmt.Sprint(tokens) {
		t.Errorf("tokens_processed %s, want exactly %d", row["tokens_processed"], tokens)
	}
	wall, warm := num(t, row, "wall_s"), num(t, row, "warmup_s")
	within(t, "energy_total_J", num(t, row, "energy_total_J"), float64(gpus)*powerW*wall, 0.01)
	within(t, "energy_J", num(t, row, "energy_J"), float64(gpus)*powerW*(wall-warm), 0.01)
	if row["complete"] != "yes" || row["lost_batches"] != "0" {
		t.Errorf("complete %q lost_batches %q, want yes and 0", row["complete"], row["lost_batches"])
	}
}

// steps sends n steps of tokens each, 100 ms apart, and returns the tokens.
func steps(tr *trainer, run string, from, n, tokens int) int {
	return stepsWith(tr, run, from, n, tokens, nil)
}

// stepsWith is steps calling each (unless nil) before every step.
func stepsWith(tr *trainer, run string, from, n, tokens int, each func()) int {
	for i := from; i < from+n; i++ {
		time.Sleep(100 * time.Millisecond)
		if each != nil {
			each()
		}
		tr.send(`{"event":"step","run_id":%q,"step":%d,"tokens":%d}`, run, i, tokens)
	}
	tr.sync()
	return n * tokens
}

func collectorOutage(t *testing.T, sig syscall.Signal, down time.Duration) {
	t.Parallel()
	fc := newFaultCluster(t)
	sock, _ := fc.agentWith("n", "replay:"+writeTrace(t, 2, 300, 300, 120), filepath.Join(t.TempDir(), "spool"))
	tr := dialTrainer(t, sock)
	tr.send(`{"event":"run_start","run_id":"r","gpus":[0,1],"warmup_s":1}`)
	sent := steps(tr, "r", 1, 25, 512)
	fc.col.stop(sig)
	sent += steps(tr, "r", 26, int(down/(100*time.Millisecond)), 512)
	fc.startCollector()
	sent += steps(tr, "r", 1000, 15, 512)
	tr.send(`{"event":"run_end","run_id":"r"}`)
	tr.sync()
	fc.waitEnded("r")
	checkExact(t, fc.csvRow("r"), sent, 2, 300)
}

// (a) The collector is killed (SIGKILL) mid-run and restarted on the same
// address and database: batches it committed were acked or are deduplicated
// when re-sent, the rest wait in the agent's spool.
func TestFaultCollectorKilledMidRun(t *testing.T) { collectorOutage(t, syscall.SIGKILL, 2*time.Second) }

// (b) The collector is unreachable for 5 s mid-run (stopped, started again).
func TestFaultCollectorDownFor5s(t *testing.T) { collectorOutage(t, syscall.SIGTERM, 5*time.Second) }

// lossRun runs r with the collector down long enough that the agent's spool
// (bounded by flags, or by a small disk) must drop batches, and checks the
// run is reported incomplete by exactly what was dropped. The node has
// RAPL counters (a fixture) that rise only while r runs, so its host
// energy is lost with the dropped batches too.
func lossRun(t *testing.T, spoolDir string, gpus int, down time.Duration, extra ...string) {
	fc := newFaultCluster(t)
	rapl := newRAPLNode(t)
	extra = append(extra, "--sysfs-root", rapl.sysfs, "--procfs-root", rapl.procfs, "--shutdown-timeout", "35s")
	sock, agent := fc.agentWith("n", fmt.Sprintf("sim:%d", gpus), spoolDir, extra...)
	tr := dialTrainer(t, sock)
	// On GPU 0 only: the others idle, so the node's dropped batches hold
	// idle GPU energy besides the run's.
	tr.send(`{"event":"run_start","run_id":"r","warmup_s":0,"gpus":[0]}`)
	tr.sync()
	// 10 J of CPU package and 1 J of DRAM per step: at most 110 J a second.
	var hostJ float64
	burn := func() {
		rapl.add("intel-rapl:0", 10)
		rapl.add("intel-rapl:0:0", 1)
		hostJ += 11
	}
	sent := stepsWith(tr, "r", 1, 20, 1000, burn)
	fc.col.stop(syscall.SIGTERM)
	sent += stepsWith(tr, "r", 21, int(down/(100*time.Millisecond)), 1000, burn)
	fc.startCollector()
	sent += stepsWith(tr, "r", 1000, 10, 1000, burn)
	tr.send(`{"event":"run_end","run_id":"r"}`)
	tr.sync()
	// A graceful stop flushes: once the agent is gone every batch it kept,
	// and the loss reports they carry, is in the collector.
	agent.stop(syscall.SIGTERM)
	if code := agent.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("agent exit code %d after a graceful stop", code)
	}
	r := fc.waitEnded("r")
	row := fc.csvRow("r")
	t.Logf("sent %d tokens; processed %d; lost %d tokens in %d batches (%.1f J); reasons %v",
		sent, r.TokensProcessed, r.LostTokens, r.LostBatches, r.LostEnergyJ, r.LostReasons)
	if !r.Incomplete || r.LostBatches == 0 || row["complete"] != "no" {
		t.Fatalf("run not marked incomplete: incomplete %v lost_batches %d complete %q", r.Incomplete, r.LostBatches, row["complete"])
	}
	if r.TokensProcessed+r.LostTokens != uint64(sent) {
		t.Errorf("tokens_processed %d + lost_tokens %d = %d, want exactly the %d sent", r.TokensProcessed, r.LostTokens,
			r.TokensProcessed+r.LostTokens, sent)
	}
	if row["lost_tokens"] != fmt.Sprint(r.LostTokens) || row["lost_batches"] != fmt.Sprint(r.LostBatches) {
		t.Errorf("CSV lost_tokens %s lost_batches %s", row["lost_tokens"], row["lost_batches"])
	}
	if r.LostEnergyJ <= 0 {
		t.Errorf("lost_energy_J %v", r.LostEnergyJ)
	}
	// The host energy of the dropped batches is counted lost, not gone:
	// what arrived plus what was lost is all the counters rose by while
	// the run was on, less at most the parts of the two intervals around
	// its start and end that the run was not on the node for (1 s each,
	// up to 110 J; 2 s allowed for a slow read).
	host := r.GetCpuEnergyJ() + r.GetDramEnergyJ()
	t.Logf("host energy: the counters rose by %.0f J; %.1f J arrived, %.1f J lost", hostJ, host, r.GetLostHostEnergyJ())
	if r.GetLostHostEnergyJ() <= 0 || num(t, row, "lost_host_energy_J") != r.GetLostHostEnergyJ() {
		t.Errorf("lost_host_energy_J %v (CSV %q), want > 0", r.GetLostHostEnergyJ(), row["lost_host_energy_J"])
	}
	if got := host + r.GetLostHostEnergyJ(); got > hostJ+1e-6 || got < hostJ-4*110 {
		t.Errorf("host energy %.1f J arrived + %.1f J lost = %.1f J, want the %.0f J the counters rose by (at most 440 J less)",
			host, r.GetLostHostEnergyJ(), got, hostJ)
	}
	if out := fc.cli("report", "r"); !strings.Contains(out, "INCOMPLETE: ") || !strings.Contains(out, " J host energy (CPU+DRAM), ") {
		t.Errorf("report does not say INCOMPLETE: with the host energy lost:\n%s", out)
	}
	// The node's side (trainmeter usage): the same batches dropped, and
	// the run's lost part plus the node's lost idle part is the node's
	// lost total, for GPU and host energy alike (runs + idle = node).
	var usage trainmeterv1.UsageResponse
	if err := protojson.Unmarshal([]byte(fc.cli("usage", "--json")), &usage); err != nil || len(usage.GetNodes()) != 1 {
		t.Fatalf("usage --json: %v, nodes %v", err, usage.GetNodes())
	}
	nu := usage.GetNodes()[0]
	t.Logf("node n lost %d batches: GPU %.1f J (idle %.1f J), host %.1f J (idle %.1f J)", nu.GetLostBatches(),
		nu.GetLostEnergyJ(), nu.GetLostIdleEnergyJ(), nu.GetLostHostEnergyJ(), nu.GetLostIdleHostEnergyJ())
	if nu.GetLostIdleEnergyJ() <= 0 {
		t.Errorf("the node's dropped batches hold no idle GPU energy: %v", nu)
	}
	if nu.GetLostBatches() < r.LostBatches {
		t.Errorf("node lost %d batches, fewer than its run's %d", nu.GetLostBatches(), r.LostBatches)
	}
	within(t, "node's lost GPU energy − its idle part", nu.GetLostEnergyJ()-nu.GetLostIdleEnergyJ(), r.LostEnergyJ, 1e-6)
	within(t, "node's lost host energy − its idle part", nu.GetLostHostEnergyJ()-nu.GetLostIdleHostEnergyJ(), r.GetLostHostEnergyJ(), 1e-6)
	if out := fc.cli("usage"); !strings.Contains(out, "INCOMPLETE: dropped on the agents") || !strings.Contains(out, "IDLE HOST kWh") {
		t.Errorf("usage does not show the node's dropped batches:\n%s", out)
	}
	if !strings.Contains(agent.log(), "dropped the oldest batches") {
		t.Errorf("agent log says nothing about dropping")
	}
}

// (c) The spool is bounded to 4 KiB (about 9 batches of 2 GPUs) and the
// collector is down 8 s: the oldest batches are dropped, counted and
// reported per run.
func TestFaultSpoolFullDropsOldestAndMarksRunIncomplete(t *testing.T) {
	t.Parallel()
	lossRun(t, filepath.Join(t.TempDir(), "spool"), 2, 8*time.Second, "--spool-max-bytes", "4096")
}

// noTmpfs skips TestFaultSpoolDiskFull, or fails it where CI requires it.
func noTmpfs(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("TRAINMETER_REQUIRE_TMPFS") == "1" {
		t.Fatalf("%s (TRAINMETER_REQUIRE_TMPFS=1)", why)
	}
	t.Skipf("skipped: %s (set TRAINMETER_REQUIRE_TMPFS=1 to fail instead)", why)
}

// (d) The spool lies on a 16 KiB tmpfs: writes fail with ENOSPC, handled
// like a full spool (needs root to mount). Where it cannot mount one it
// skips, or fails under TRAINMETER_REQUIRE_TMPFS=1 (.ci/run sets it).
func TestFaultSpoolDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		noTmpfs(t, "mounting a tmpfs for a real full disk needs root (run the e2e tests as root to include it)")
	}
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "spool")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", dir).CombinedOutput(); err != nil {
		noTmpfs(t, fmt.Sprintf("cannot mount a tmpfs here: %v: %s", err, strings.TrimSpace(string(out))))
	}
	// Cleanups run last-registered first: the agent (started below) stops,
	// then this unmounts, then the temp dir is removed.
	var once sync.Once
	unmount := func() { once.Do(func() { _ = exec.Command("umount", "-l", dir).Run() }) }
	t.Cleanup(unmount)
	lossRun(t, dir, 8, 8*time.Second)
}

// (e) The agent's spool was left with a torn last record and garbage after
// it: the agent starts, says what it discarded, and keeps serving.
func TestFaultCorruptSpoolAtStart(t *testing.T) {
	t.Parallel()
	fc := newFaultCluster(t)
	spool := filepath.Join(t.TempDir(), "spool")
	sock, agent := fc.agentWith("n", "sim:1", spool)
	tr := dialTrainer(t, sock)
	tr.send(`{"event":"run_start","run_id":"before","warmup_s":0}`)
	steps(tr, "before", 1, 5, 100)
	fc.col.stop(syscall.SIGTERM) // the next batches stay unacked in the spool
	steps(tr, "before", 6, 20, 100)
	tr.conn.Close()
	agent.stop(syscall.SIGTERM) // cannot flush: the spool keeps them

	segs, _ := filepath.Glob(filepath.Join(spool, "seg-*"))
	if len(segs) == 0 {
		t.Fatal("no spool segment left")
	}
	last := segs[len(segs)-1]
	b, err := os.ReadFile(last)
	if err != nil {
		t.Fatal(err)
	}
	torn := append(b[:len(b)-9:len(b)-9], []byte("\x00garbage\xff\xfe not a record")...)
	if err := os.WriteFile(last, torn, 0o640); err != nil {
		t.Fatal(err)
	}

	fc.startCollector()
	sock, agent = fc.agentWith("n", "sim:1", spool)
	tr = dialTrainer(t, sock)
	tr.send(`{"event":"run_start","run_id":"after","warmup_s":0}`)
	sent := steps(tr, "after", 1, 15, 777)
	tr.send(`{"event":"run_end","run_id":"after"}`)
	tr.sync()
	fc.waitEnded("after")
	if row := fc.csvRow("after"); row["tokens_processed"] != fmt.Sprint(sent) {
		t.Errorf("run after the corrupt spool: tokens_processed %s, want %d", row["tokens_processed"], sent)
	}
	if log := agent.log(); !strings.Contains(log, "truncating a corrupt or torn record") || !strings.Contains(log, "bytes_discarded=") {
		t.Errorf("agent did not log what it discarded:\n%s", log)
	}
	// The batches before the torn one were re-sent: the first run got them.
	fc.eventually("run before re-sent", func() bool {
		resp, err := fc.q.GetRun(context.Background(), &trainmeterv1.GetRunRequest{RunId: "before"})
		return err == nil && resp.Run.TokensProcessed > 500
	})
}

// (e2) The agent's spool was written by another spool format (a newer
// agent's): the agent says which directory and file, and the way out, and
// stays up without touching it, so that systemd does not restart it in a
// loop; it exits cleanly when stopped.
func TestFaultSpoolOfAnotherFormatAtStart(t *testing.T) {
	t.Parallel()
	spool := filepath.Join(t.TempDir(), "spool")
	if err := os.MkdirAll(spool, 0o750); err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"version":2,"boot_id":"b"}`)
	state := filepath.Join(spool, "state")
	if err := os.WriteFile(state, fmt.Appendf(body, "\n%08x\n", crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli))), 0o640); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(state)
	p := startProc(t, "trainmeter-agent", "--collector", testkit.FreeAddr(t), "--socket", filepath.Join(t.TempDir(), "agent.sock"),
		"--node", "n", "--gpu", "sim:1", "--spool", spool)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.log(), "move it aside") {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal logged:\n%s", p.log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
	select {
	case <-p.done:
		t.Fatalf("the agent exited (a restart loop under systemd):\n%s", p.log())
	default:
	}
	log := p.log()
	for _, want := range []string{"spool dir " + spool, state, "spool format 2", "this agent reads 1", "run the agent that wrote it"} {
		if !strings.Contains(log, want) {
			t.Errorf("log does not say %q:\n%s", want, log)
		}
	}
	p.stop(syscall.SIGTERM)
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0", code)
	}
	if after, _ := os.ReadFile(state); string(after) != string(before) {
		t.Errorf("the refused state file changed:\n%s", after)
	}
	if strings.Contains(log, "panic") {
		t.Errorf("agent panicked:\n%s", log)
	}
}

// (f) The collector's database directory is corrupt: a clear error and a
// non-zero exit, no panic.
func TestFaultCorruptDatabaseAtStart(t *testing.T) {
	t.Parallel()
	cases := map[string]func(t *testing.T, dir string){
		"garbage MANIFEST": func(t *testing.T, dir string) {
			_ = os.MkdirAll(dir, 0o750)
			_ = os.WriteFile(filepath.Join(dir, "MANIFEST"), []byte("this is not a badger manifest at all"), 0o640)
		},
		"truncated MANIFEST of a real database": func(t *testing.T, dir string) {
			p := startProc(t, "trainmeter", "serve", "--listen", testkit.FreeAddr(t), "--data", dir)
			deadline := time.Now().Add(20 * time.Second)
			for {
				if fi, err := os.Stat(filepath.Join(dir, "MANIFEST")); err == nil && fi.Size() > 8 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no MANIFEST written")
				}
				time.Sleep(50 * time.Millisecond)
			}
			p.stop(syscall.SIGTERM)
			b, _ := os.ReadFile(filepath.Join(dir, "MANIFEST"))
			_ = os.WriteFile(filepath.Join(dir, "MANIFEST"), append(b[:4:4], 0xff, 0xff), 0o640)
		},
		"data path is a file": func(t *testing.T, dir string) {
			_ = os.WriteFile(dir, []byte("x"), 0o640)
		},
	}
	for name, corrupt := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "data")
			corrupt(t, dir)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, filepath.Join(binDir, "trainmeter"), "serve", "--listen", testkit.FreeAddr(t), "--data", dir).CombinedOutput()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() <= 0 {
				t.Fatalf("serve on a corrupt database: err %v (want a non-zero exit)\n%s", err, out)
			}
			s := string(out)
			if strings.Contains(s, "panic") || strings.Contains(s, "goroutine ") {
				t.Errorf("serve panicked:\n%s", s)
			}
			if !strings.Contains(s, dir) || !strings.Contains(s, "store") {
				t.Errorf("error does not name the store and the directory:\n%s", s)
			}
			t.Logf("exit %d: %s", ee.ExitCode(), strings.TrimSpace(s))
		})
	}
}

package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/testkit"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// fakeAgent accepts trainer connections and records their events.
type fakeAgent struct {
	path string
	mu   sync.Mutex
	evs  []map[string]any
	ln   net.Listener
	wg   sync.WaitGroup
}

func newFakeAgent(t *testing.T) *fakeAgent {
	t.Helper()
	dir, err := os.MkdirTemp("", "tmrun") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	a := &fakeAgent{path: filepath.Join(dir, "a.sock")}
	if a.ln, err = net.Listen("unix", a.path); err != nil {
		t.Fatal(err)
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for {
			c, err := a.ln.Accept()
			if err != nil {
				return
			}
			a.wg.Add(1)
			go func() {
				defer a.wg.Done()
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					var m map[string]any
					if json.Unmarshal(sc.Bytes(), &m) == nil {
						a.mu.Lock()
						a.evs = append(a.evs, m)
						a.mu.Unlock()
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { a.ln.Close(); a.wg.Wait() })
	return a
}

func (a *fakeAgent) events() []map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]map[string]any(nil), a.evs...)
}

func (a *fakeAgent) waitEvents(t *testing.T, n int) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if evs := a.events(); len(evs) >= n {
			return evs
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("agent got %v, want %d events", a.events(), n)
	return nil
}

func testOptions(socket string) (*runOptions, *bytes.Buffer, *testkit.Buffer) {
	var out bytes.Buffer
	errb := &testkit.Buffer{}
	return &runOptions{socket: socket, runID: "r1", statusEvery: time.Hour,
		reportWait: time.Second, tick: time.Second, stdin: strings.NewReader(""), stdout: &out, stderr: errb}, &out, errb
}

func TestRunPassesExitCodeAndStatus(t *testing.T) {
	ag := newFakeAgent(t)
	o, _, _ := testOptions(ag.path)
	o.start.Start = &trainmeterv1.RunStart{Metadata: &trainmeterv1.RunMetadata{Model: "m"}}
	if code := runCommand(o, []string{"sh", "-c", "exit 3"}); code != 3 {
		t.Fatalf("exit code %d, want 3", code)
	}
	evs := ag.waitEvents(t, 2)
	start, end := evs[0], evs[1]
	if start["event"] != "run_start" || start["run_id"] != "r1" || start["model"] != "m" ||
		start["attribute_pid"] != float64(os.Getpid()) || !strings.HasPrefix(start["client_id"].(string), "trainmeter-run-") {
		t.Errorf("run_start %v", start)
	}
	for _, k := range []string{"dataset", "backend", "optimizer", "precision", "batch_size", "seq_len", "warmup_s", "gpus"} {
		if _, ok := start[k]; ok {
			t.Errorf("run_start sends %q though it was not given", k)
		}
	}
	if end["event"] != "run_end" || end["run_id"] != "r1" || end["status"] != "exit 3" {
		t.Errorf("run_end %v", end)
	}
}

func TestRunForwardsSIGTERM(t *testing.T) {
	ag := newFakeAgent(t)
	o, _, _ := testOptions(ag.path)
	sigs := make(chan os.Signal, 1)
	sigs <- syscall.SIGTERM // read only once the child has started
	o.signals = sigs
	t0 := time.Now()
	if code := runCommand(o, []string{"sleep", "30"}); code != 128+15 {
		t.Fatalf("exit code %d, want 143", code)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("took %v: SIGTERM not forwarded", d)
	}
	if end := ag.waitEvents(t, 2)[1]; end["status"] != "signal SIGTERM" {
		t.Errorf("run_end %v", end)
	}
}

func TestRunChildHandlesForwardedSignal(t *testing.T) {
	ag := newFakeAgent(t)
	o, _, _ := testOptions(ag.path)
	ready := filepath.Join(t.TempDir(), "ready")
	sigs := make(chan os.Signal)
	o.signals = sigs
	go func() {
		for range 500 {
			if _, err := os.Stat(ready); err == nil {
				sigs <- syscall.SIGTERM
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	code := runCommand(o, []string{"sh", "-c", `trap 'exit 7' TERM; touch "$0"; while :; do sleep 0.05; done`, ready})
	if code != 7 {
		t.Fatalf("exit code %d, want 7 (the child's own handler)", code)
	}
}

func TestRunWithoutAgentStillRunsTheCommand(t *testing.T) {
	o, out, errb := testOptions(filepath.Join(t.TempDir(), "missing.sock"))
	code := runCommand(o, []string{"sh", "-c", `echo "id=$TRAINMETER_RUN_ID sock=$TRAINMETER_SOCKET"; exit 5`})
	if code != 5 {
		t.Fatalf("exit code %d, want 5", code)
	}
	if want := "id=r1 sock=" + o.socket; !strings.Contains(out.String(), want) {
		t.Errorf("stdout %q, want %q", out.String(), want)
	}
	if n := strings.Count(errb.String(), "agent not reachable"); n != 1 {
		t.Errorf("stderr %q: want one warning", errb.String())
	}
}

func TestRunCommandNotFound(t *testing.T) {
	ag := newFakeAgent(t)
	o, _, errb := testOptions(ag.path)
	if code := runCommand(o, []string{"/nonexistent/trainer"}); code != 127 {
		t.Fatalf("exit code %d, want 127", code)
	}
	if len(ag.events()) != 0 || !strings.Contains(errb.String(), "/nonexistent/trainer") {
		t.Errorf("events %v, stderr %q", ag.events(), errb.String())
	}
}

func TestRunCommandFlags(t *testing.T) {
	ag := newFakeAgent(t)
	dead := "127.0.0.1:1" // no collector: the command still runs and passes its exit code
	out, err := run(t, map[string]string{EnvSocket: ag.path}, "run", "--collector", dead, "--run-id", "x",
		"--model", "llama", "--batch-size", "8", "--warmup", "30s", "--report-wait", "100ms", "sh", "-c", "exit 4")
	var exit *ExitError
	if !errors.As(err, &exit) || exit.Code != 4 {
		t.Fatalf("err %v, want exit 4; output %s", err, out)
	}
	start := ag.waitEvents(t, 2)[0]
	if start["run_id"] != "x" || start["model"] != "llama" || start["batch_size"] != float64(8) || start["warmup_s"] != float64(30) {
		t.Errorf("run_start %v", start)
	}
	if !strings.Contains(out, "from the collector") || !strings.Contains(out, "trainmeter report x") {
		t.Errorf("output %q: want a note that the collector is unreachable", out)
	}
	// Exit 0 is no error; a generated run id names the command.
	ag2 := newFakeAgent(t)
	if out, err := run(t, nil, "run", "--socket", ag2.path, "--collector", dead, "--", "true"); err != nil {
		t.Fatalf("err %v: %s", err, out)
	}
	if id := ag2.waitEvents(t, 2)[0]["run_id"].(string); !strings.HasPrefix(id, "true-") {
		t.Errorf("generated run id %q", id)
	}
	if _, err := run(t, nil, "run"); err == nil {
		t.Error("run without a command accepted")
	}
}

func TestRunStatusLine(t *testing.T) {
	s := &runStatus{o: &runOptions{runID: "r"}}
	if got := s.line(5*time.Second, nil); got != "trainmeter r | 0:05 | waiting for the collector" {
		t.Errorf("line %q", got)
	}
	r := &trainmeterv1.RunReport{EnergyTotalJ: 1000, WallS: 2, TokensProcessed: 500}
	if got := s.line(3*time.Second, r); got != "trainmeter r | 0:03 | - W | 1.0 kJ | 500 tok | 2 J/tok" {
		t.Errorf("first line %q", got)
	}
	r = &trainmeterv1.RunReport{EnergyTotalJ: 3000, WallS: 4, TokensProcessed: 1000, CostUsd: ptrF(0.5),
		EnergyCostUsd: ptrF(0.25), TotalCostUsd: ptrF(0.75), Ended: true}
	if got := s.line(3725*time.Second, r); got != "trainmeter r | 1:02:05 | 1000 W | 3.0 kJ | 1000 tok | 3 J/tok | $0.750" {
		t.Errorf("second line %q", got)
	}
	// A live run with a plan shows its projected cost.
	r.Ended, r.ProjectionBasis, r.ProjectedCostUsd = false, "tokens", ptrF(3)
	if got := s.line(3725*time.Second, r); got != "trainmeter r | 1:02:05 | 1000 W | 3.0 kJ | 1000 tok | 3 J/tok | $0.75 (→ $3.00)" {
		t.Errorf("projected line %q", got)
	}
	// A capped run shows its cap.
	maxCost := 5.0
	r.MaxCostUsd = &maxCost
	if got := s.line(3725*time.Second, r); got != "trainmeter r | 1:02:05 | 1000 W | 3.0 kJ | 1000 tok | 3 J/tok | $0.75 (→ $3.00) of max $5.00" {
		t.Errorf("capped line %q", got)
	}
}

// TestRunRefusesRunStartKeysAsLabels: a --label whose key run_start reads
// itself would set that field at the agent instead of a label; every such
// key is refused, the ones the agent added later (resume) too, because the
// CLI and the agent share one list (pkg/trainerwire).
func TestRunRefusesRunStartKeysAsLabels(t *testing.T) {
	for _, key := range []string{"model", "attribute_pid", "resume"} {
		out, err := run(t, nil, "run", "--label", key+"=x", "--", "true")
		if err == nil || !strings.Contains(err.Error(), "is a run_start field") {
			t.Errorf("--label %s=x: %v (%s), want it refused as a run_start field", key, err, out)
		}
	}
}

func ptrF(v float64) *float64 { return &v }

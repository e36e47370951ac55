package e2e

import (
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// oomScript raises, inside a run, an exception shaped like PyTorch's
// out-of-memory error (module torch.cuda), its message on two lines.
const oomScript = `
import sys, time
sys.path.insert(0, "clients/python")
import trainmeter
OutOfMemoryError = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch.cuda"})
with trainmeter.start(run_id=sys.argv[1], socket_path=sys.argv[2], warmup_s=0) as run:
    for step in range(1, 6):
        time.sleep(0.05)
        run.step(step=step, tokens=100)
    raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB <GPU 0>\nsee é")
`

// TestEndErrorKept: the exception a trainer's run ended with, sent by the
// Python client in run_end, is kept through the agent and the collector and
// shown in report --json (end_error), the CSV (end_error) and the report.
func TestEndErrorKept(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	c := startCollector(t)
	sock := c.startAgent("oom-node", "sim:1")
	c.waitStreaming("oom-node")

	if out, err := runPython(t, oomScript, "oom", sock); err == nil {
		t.Fatalf("the raising script exited 0: %s", out)
	}
	const want = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB <GPU 0>\nsee é"
	if r := c.waitEnded("oom"); r.GetEndStatus() != "error" {
		t.Fatalf("end status %q, want error", r.GetEndStatus())
	}
	var js map[string]any
	if err := json.Unmarshal([]byte(c.cli("report", "oom", "--json")), &js); err != nil || js["end_error"] != want {
		t.Errorf("report --json end_error %q (%v), want %q", js["end_error"], err, want)
	}
	if row := c.csvRow("oom"); row["end_error"] != want || row["end_status"] != "error" {
		t.Errorf("CSV end_status %q end_error %q, want error and %q", row["end_status"], row["end_error"], want)
	}
	if rep := c.cli("report", "oom"); !strings.Contains(rep, "run oom (ended: error)\n  cause:             "+strconv.Quote(want)+"\n") {
		t.Errorf("report does not show the cause %s:\n%s", strconv.Quote(want), rep)
	}
}

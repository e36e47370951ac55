package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// hfDriver plays a transformers Trainer's callback sequence (the library
// cannot be installed here) around the real HF callback, against the real
// agent: 20 optimizer steps of 1,000 tokens on a 1,000,000-parameter model,
// the loss logged every 5 steps.
const hfDriver = `
import sys, time
sys.path.insert(0, "clients/python")
from trainmeter.integrations import hf

class NS:
    def __init__(self, **kw):
        self.__dict__.update(kw)

class Weight:
    def __init__(self, n):
        self.n = n
    def numel(self):
        return self.n

class Model:
    config = NS(_name_or_path="tiny-lm")
    def parameters(self):
        return iter([Weight(900_000), Weight(100_000)])

def call(hook, **kw):
    # transformers' TrainerCallback has every hook as a no-op.
    f = getattr(cb, hook, None)
    if f is not None:
        f(args, state, control, **kw)

cb = hf.TrainmeterCallback(run_id=sys.argv[2], socket_path=sys.argv[1], tokens_per_step=1000, warmup_s=0)
args = NS(per_device_train_batch_size=8, gradient_accumulation_steps=1, bf16=True, process_index=0, world_size=1)
state = NS(global_step=0, max_steps=20, num_input_tokens_seen=0, is_world_process_zero=True, epoch=0.0)
control = NS(should_training_stop=False, should_log=False)
call("on_train_begin", model=Model())
for i in range(1, 21):
    call("on_step_begin")
    time.sleep(0.05)
    state.global_step = i
    control.should_log = i % 5 == 0
    call("on_step_end")
    if control.should_log:
        call("on_log", logs={"loss": round(3.0 - 0.1 * i, 4), "learning_rate": 1e-4})
call("on_train_end")
print("errors", cb.run.stats().errors_from_agent)
`

// TestHFCallbackFillsFLOPsAndLoss: the HF callback's run has the model's
// parameter count (so the collector computes FLOPs) and its logged loss.
func TestHFCallbackFillsFLOPsAndLoss(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	c := startCollector(t)
	sock := c.startAgent("hf-node", "sim:1")
	c.waitStreaming("hf-node")
	script := filepath.Join(t.TempDir(), "hf_driver.py")
	if err := os.WriteFile(script, []byte(hfDriver), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("python3", script, sock, "hf-e2e")
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "errors 0\n" {
		t.Fatalf("driver: %v\n%s", err, out)
	}
	c.waitEnded("hf-e2e")
	row := c.csvRow("hf-e2e")
	if row["model"] != "tiny-lm" || row["tokens_processed"] != "20000" {
		t.Fatalf("model %q tokens %q", row["model"], row["tokens_processed"])
	}
	if f := num(t, row, "flops_total"); f != 6*1e6*20000 {
		t.Errorf("flops_total %v, want 6 × 1e6 params × 20,000 tokens = 1.2e11", f)
	}
	if l := num(t, row, "last_loss"); l != 1.0 {
		t.Errorf("last_loss %v, want 1.0 (logged at step 20)", l)
	}
}

// TestClientSaysWhenARunIsNotMeasured: a script whose run_start the real
// agent refuses (a GPU the node does not have), and one pointed at a socket
// where no agent listens, both train to the end, exit 0, and say once on
// stderr that the run is not being measured.
func TestClientSaysWhenARunIsNotMeasured(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	c := startCollector(t)
	sock := c.startAgent("quiet-node", "sim:2")
	c.waitStreaming("quiet-node")
	wrong := filepath.Join(t.TempDir(), "wrong.sock")
	for _, tc := range []struct {
		name, socket, want string
	}{
		{"refused", sock, `trainmeter: the agent refused run refused: run_start: gpus: gpu 7: not on this node (it has 2 GPUs)`},
		{"unreachable", wrong, "trainmeter: agent not reachable at " + wrong + " ("},
	} {
		cmd := exec.Command("python3", "clients/python/examples/train_sim.py", "--socket", tc.socket, "--run-id", tc.name,
			"--gpus", "7", "--duration-s", "1", "--step-time", "0.05")
		cmd.Dir = ".."
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v\n%s\n%s", tc.name, err, out, stderr.String())
		}
		if !strings.Contains(string(out), "steps=20 ") {
			t.Errorf("%s: training did not run to the end:\n%s", tc.name, out)
		}
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if len(lines) != 1 || !strings.HasPrefix(lines[0], tc.want) {
			t.Errorf("%s: stderr %q, want one line starting %q", tc.name, stderr.String(), tc.want)
		}
	}
}

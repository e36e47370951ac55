package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// trackerDriver plays a trainer that reports to MLflow (the Hugging Face
// callback with report_to=["mlflow"]) or to W&B (the Lightning callback with a
// WandbLogger), against the real agent, with trainmeter's figures read from
// the real collector by the real CLI. mlflow and wandb cannot be installed
// here: the stand-ins of clients/python/tests/trackers_standin.py take their
// place in sys.modules. It prints what the stand-in recorded, as JSON.
const trackerDriver = `
import json, sys, time
sys.path.insert(0, "clients/python")
sys.path.insert(0, "clients/python/tests")
from trackers_standin import StandinMlflow, StandinWandb
sock, run_id, tracker = sys.argv[1:4]
opts = {"interval_s": 0.3, "finish_timeout_s": 20}

class NS:
    def __init__(self, **kw):
        self.__dict__.update(kw)

if tracker == "mlflow":
    mlflow = sys.modules["mlflow"] = StandinMlflow()
    from trainmeter.integrations import hf
    mlflow.start_run()  # HF's MLflowCallback starts the run before the other callbacks run
    cb = hf.TrainmeterCallback(run_id=run_id, socket_path=sock, tokens_per_step=1000, warmup_s=0,
                               gpu_price_per_hour=2.0, figures_options=opts)
    args = NS(per_device_train_batch_size=8, gradient_accumulation_steps=1, bf16=True, process_index=0,
              world_size=1, report_to=["mlflow"])
    state = NS(global_step=0, max_steps=40, num_input_tokens_seen=0, is_world_process_zero=True, epoch=0.0)
    control = NS(should_training_stop=False, should_log=False)
    cb.on_train_begin(args, state, control)
    for i in range(1, 41):
        cb.on_step_begin(args, state, control)
        time.sleep(0.05)
        state.global_step = i
        cb.on_step_end(args, state, control)
    mlflow.end_run()  # MLflowCallback.on_train_end comes before ours
    cb.on_train_end(args, state, control)
    print(json.dumps(mlflow.dump()))
else:
    wandb = sys.modules["wandb"] = StandinWandb()
    from trainmeter.integrations import lightning
    class WandbLogger:
        experiment = wandb.init(project="e2e")
    class Trainer:
        global_step = 0
        is_global_zero = True
        loggers = [WandbLogger()]
    trainer = Trainer()
    cb = lightning.TrainmeterCallback(run_id=run_id, socket_path=sock, tokens_per_step=1000, warmup_s=0,
                                      gpu_price_per_hour=2.0, figures_options=opts)
    cb.on_train_start(trainer, NS(hparams={"model_name": "tiny"}))
    for i in range(1, 41):
        cb.on_train_batch_start(trainer, None, {}, i - 1)
        time.sleep(0.05)
        trainer.global_step = i
        cb.on_train_batch_end(trainer, None, {"loss": 1.0}, {}, i - 1)
    cb.on_train_end(trainer, None)
    print(json.dumps(wandb.run.dump()))
`

// trackerFigures maps the integration's metric names to the report's JSON keys
// (clients/python/trainmeter/integrations/_figures.py, REPORT_FIGURES).
var trackerFigures = map[string]string{
	"trainmeter/energy_j":           "energy_total_j",
	"trainmeter/energy_kwh":         "energy_kwh",
	"trainmeter/j_per_token":        "j_per_token",
	"trainmeter/tok_per_s":          "tok_per_s",
	"trainmeter/avg_power_w":        "avg_power_w",
	"trainmeter/cost_usd":           "total_cost_usd",
	"trainmeter/usd_per_mtok":       "usd_per_mtok",
	"trainmeter/projected_cost_usd": "projected_cost_usd",
	"trainmeter/co2_kg":             "co2_kg",
	"trainmeter/mfu":                "mfu",
}

// TestTrackersLogTheCollectorsFigures: a run reported through the HF callback
// to MLflow and one through the Lightning callback to W&B get trainmeter's
// figures in the tracker's run while they train, and at the end exactly the
// figures `trainmeter report RUN --json` gives for the ended run; a figure the
// report has as null (CO2: no carbon intensity configured) is not logged.
func TestTrackersLogTheCollectorsFigures(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	c := startCollector(t)
	sock := c.startAgent("tracker-node", "sim:1")
	c.waitStreaming("tracker-node")
	script := filepath.Join(t.TempDir(), "tracker_driver.py")
	if err := os.WriteFile(script, []byte(trackerDriver), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tracker := range []string{"mlflow", "wandb"} {
		t.Run(tracker, func(t *testing.T) {
			run := "tracked-" + tracker
			cmd := exec.Command("python3", script, sock, run, tracker)
			cmd.Dir = ".."
			cmd.Env = append(os.Environ(), "TRAINMETER_CLI="+filepath.Join(binDir, "trainmeter"),
				"TRAINMETER_COLLECTOR="+c.addr, "TRAINMETER_CONSOLE_URL=http://console.example:7434")
			out, err := cmd.Output()
			if err != nil {
				stderr := ""
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = string(ee.Stderr)
				}
				t.Fatalf("driver: %v\n%s\n%s", err, out, stderr)
			}
			c.waitEnded(run)
			var report map[string]any
			if err := json.Unmarshal([]byte(c.cli("report", run, "--json")), &report); err != nil {
				t.Fatal(err)
			}
			var logs []map[string]float64 // each log call's metrics, in order
			var params map[string]string
			if tracker == "mlflow" {
				var d struct {
					Runs []struct {
						Metrics [][]any           `json:"metrics"`
						Params  map[string]string `json:"params"`
						Tags    map[string]string `json:"tags"`
					} `json:"runs"`
				}
				if err := json.Unmarshal(out, &d); err != nil {
					t.Fatalf("%v\n%s", err, out)
				}
				if len(d.Runs) != 1 {
					t.Fatalf("MLflow got %d runs, want the trainer's one", len(d.Runs))
				}
				params = d.Runs[0].Params
				if d.Runs[0].Tags["trainmeter_run_id"] != run {
					t.Errorf("tags %v", d.Runs[0].Tags)
				}
				for _, m := range d.Runs[0].Metrics {
					k := m[0].(string)
					if len(logs) == 0 || hasKey(logs[len(logs)-1], k) {
						logs = append(logs, map[string]float64{})
					}
					logs[len(logs)-1][k] = m[1].(float64)
				}
			} else {
				var d struct {
					History []map[string]float64 `json:"history"`
					Summary map[string]any       `json:"summary"`
					Config  map[string]string    `json:"config"`
				}
				if err := json.Unmarshal(out, &d); err != nil {
					t.Fatalf("%v\n%s", err, out)
				}
				logs, params = d.History, d.Config
				for name, key := range trackerFigures {
					if v, ok := report[key].(float64); ok && d.Summary[name] != v {
						t.Errorf("summary %s = %v, report %s = %v", name, d.Summary[name], key, v)
					}
				}
			}
			if params["trainmeter_run_id"] != run || params["trainmeter_console_url"] != "http://console.example:7434/runs/"+run {
				t.Errorf("params %v", params)
			}
			// Over time: the timer logged while the run trained, energy growing.
			if len(logs) < 3 {
				t.Fatalf("%d logs, want timer logs during the run and the final one: %v", len(logs), logs)
			}
			if logs[0]["trainmeter/energy_j"] >= logs[len(logs)-1]["trainmeter/energy_j"] {
				t.Errorf("energy did not grow over the logs: %v", logs)
			}
			final := logs[len(logs)-1]
			t.Logf("%d logs; final %v", len(logs), final)
			for name, key := range trackerFigures {
				want, known := report[key].(float64)
				got, logged := final[name]
				switch {
				case known && !logged:
					t.Errorf("%s not logged; report %s = %v", name, key, want)
				case !known && logged:
					t.Errorf("%s logged as %v; report %s is %v (unknown: not logged)", name, got, key, report[key])
				case known && got != want:
					t.Errorf("%s = %v, report %s = %v", name, got, key, want)
				}
			}
			for _, key := range []string{"energy_total_j", "j_per_token", "tok_per_s", "total_cost_usd"} {
				if _, ok := report[key].(float64); !ok {
					t.Errorf("report %s is %v: the test means to compare a known figure", key, report[key])
				}
			}
			if report["co2_kg"] != nil {
				t.Errorf("report co2_kg %v: the test means to check an unknown figure", report["co2_kg"])
			}
		})
	}
}

func hasKey(m map[string]float64, k string) bool {
	_, ok := m[k]
	return ok
}

"""trainmeter.integrations.mlflow / .wandb against stand-ins of mlflow and wandb
(tests/trackers_standin.py: neither library can be installed here) and a stand-in
`trainmeter report --json` (a script printing a report the test writes; the e2e
test e2e/trackers_test.go runs the real CLI, agent and collector)."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)
for p in (PKG_ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from trainmeter.integrations import _figures, hf, lightning  # noqa: E402
from trainmeter.integrations import mlflow as tm_mlflow, wandb as tm_wandb  # noqa: E402
from test_client import Base, wait_until  # noqa: E402
from test_integrations import NS, FakeTrainer, hf_args  # noqa: E402
from trackers_standin import StandinMlflow, StandinWandb  # noqa: E402

REPORT = {"run_id": "r", "wall_s": 12.0, "ended": False, "energy_total_j": 3600.0, "energy_kwh": 0.001,
          "j_per_token": 0.25, "tok_per_s": 1200.0, "avg_power_w": 300.0, "total_cost_usd": 0.02,
          "usd_per_mtok": 1.5, "projected_cost_usd": 0.5, "co2_kg": None, "mfu": None}
WANT = {"trainmeter/energy_j": 3600.0, "trainmeter/energy_kwh": 0.001, "trainmeter/j_per_token": 0.25,
        "trainmeter/tok_per_s": 1200.0, "trainmeter/avg_power_w": 300.0, "trainmeter/cost_usd": 0.02,
        "trainmeter/usd_per_mtok": 1.5, "trainmeter/projected_cost_usd": 0.5}
ADVICE = {"event": "advice", "kind": "dataloader", "num_workers": 6, "prefetch_factor": 4,
          "reason": "data-bound: 30% of each step waits for data", "classification": "data-bound",
          "expected_gain": 0.2, "data_wait_share": 0.3}

FAKE_CLI = textwrap.dedent("""\
    #!%s
    import json, os, sys
    with open(os.environ["FAKE_CLI_ARGV"], "a") as f:
        f.write(json.dumps(sys.argv[1:]) + "\\n")
    path = os.environ["FAKE_REPORT"]
    if not os.path.exists(path):
        sys.stderr.write('trainmeter: run "%%s" not found\\n' %% sys.argv[2])
        sys.exit(1)
    sys.stdout.write(open(path).read())
    """) % sys.executable


class TrackerBase(Base):
    def setUp(self):
        super().setUp()
        self.cli = os.path.join(self.dir, "trainmeter")
        with open(self.cli, "w") as f:
            f.write(FAKE_CLI)
        os.chmod(self.cli, 0o755)
        self.report_path = os.path.join(self.dir, "report.json")
        self.argv_path = os.path.join(self.dir, "argv")
        os.environ.update(FAKE_REPORT=self.report_path, FAKE_CLI_ARGV=self.argv_path, TRAINMETER_CLI=self.cli)
        os.environ.pop("TRAINMETER_CONSOLE_URL", None)
        self.mlflow = StandinMlflow()
        self.wandb = StandinWandb()
        saved = {k: sys.modules.get(k) for k in ("mlflow", "wandb")}
        sys.modules["mlflow"], sys.modules["wandb"] = self.mlflow, self.wandb

        def restore():
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v

        self.addCleanup(restore)
        self.reporters = []
        self.addCleanup(lambda: [r.stop() for r in self.reporters])

    def write_report(self, **kw):
        rep = dict(REPORT, **kw)
        tmp = self.report_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rep, f)
        os.replace(tmp, self.report_path)

    def argvs(self):
        with open(self.argv_path) as f:
            return [json.loads(x) for x in f]

    def keep(self, rep):
        self.assertIsNotNone(rep)
        self.reporters.append(rep)
        return rep


def metrics_by_log(run):
    """MLflow stand-in metrics grouped per log call: [(step, {key: value}), ...]."""
    out = []
    for k, v, step, thread in run.metrics:
        if not out or k in out[-1][1] or out[-1][0] != step:
            out.append((step, {}))
        out[-1][1][k] = v
    return out


class TestMlflow(TrackerBase):
    def test_timer_then_final_whole_run(self):
        a = self.agent()
        os.environ["TRAINMETER_CONSOLE_URL"] = "http://gpu-box:7434/"
        self.mlflow.start_run()
        run = self.start(run_id="ml/1")
        mrun = self.mlflow.runs[self.mlflow.active_run().info.run_id]
        self.write_report()
        rep = self.keep(tm_mlflow.attach(run, interval_s=0.05, collector="10.0.0.1:7433"))
        run.step(step=7, tokens=100)
        a.wait_lines(0, 2)
        a.send(dict(ADVICE, run_id="ml/1"))
        self.assertTrue(wait_until(lambda: run.advice() is not None))
        self.assertTrue(wait_until(lambda: any("trainmeter/advice/num_workers" in m for _, m in metrics_by_log(mrun))))
        self.assertTrue(wait_until(lambda: len(metrics_by_log(mrun)) >= 3))
        step, last = metrics_by_log(mrun)[-1]
        self.assertEqual(step, 7)
        self.assertEqual(last, dict(WANT, **{"trainmeter/advice/num_workers": 6.0,
                                             "trainmeter/advice/prefetch_factor": 4.0,
                                             "trainmeter/advice/expected_gain": 0.2,
                                             "trainmeter/advice/data_wait_share": 0.3}))
        self.assertNotIn("trainmeter/co2_kg", {k for k, *_ in mrun.metrics})  # null: unknown, never 0
        self.assertEqual(mrun.params, {"trainmeter_run_id": "ml/1",
                                       "trainmeter_console_url": "http://gpu-box:7434/runs/ml%2F1"})
        self.assertEqual(mrun.tags, mrun.params)
        self.assertIn(["report", "ml/1", "--json", "--collector", "10.0.0.1:7433"], self.argvs())
        # The timer logs by run id from its own thread: no stray run was started.
        self.assertEqual(list(self.mlflow.runs), [mrun.run_id])
        self.assertTrue(all(t.startswith("trainmeter-figures") for *_, t in mrun.metrics))

        # The trainer's MLflow run ends first (as HF's MLflowCallback does),
        # then the trainmeter run; the collector has the end a moment later.
        self.mlflow.end_run()
        run.end()
        self.write_report(ended=False, energy_total_j=4000.0)
        threading.Timer(0.4, lambda: self.write_report(ended=True, energy_total_j=5000.0, j_per_token=0.3,
                                                       co2_kg=0.0021)).start()
        final = rep.finish(timeout_s=10)
        self.assertEqual(final["trainmeter/energy_j"], 5000.0)
        step, last = metrics_by_log(mrun)[-1]
        self.assertEqual((step, last["trainmeter/energy_j"], last["trainmeter/j_per_token"], last["trainmeter/co2_kg"]),
                         (7, 5000.0, 0.3, 0.0021))
        self.assertEqual(mrun.tags["trainmeter.advice"], ADVICE["reason"])
        self.assertFalse(rep._thread.is_alive())
        n = len(mrun.metrics)
        time.sleep(0.2)
        self.assertEqual(len(mrun.metrics), n)  # stopped: nothing more
        self.assertEqual(rep.finish(), {})  # idempotent
        self.assertEqual(list(self.mlflow.runs), [mrun.run_id])

    def test_unknown_figures_are_not_logged(self):
        self.agent()
        self.mlflow.start_run()
        mrun = self.mlflow.runs[self.mlflow.active_run().info.run_id]
        run = self.start(run_id="u1")
        rep = self.keep(tm_mlflow.attach(run, interval_s=0.05))
        # The collector does not know the run yet: the CLI fails, nothing logged.
        self.assertTrue(wait_until(lambda: len(self.argvs()) >= 2 if os.path.exists(self.argv_path) else False))
        self.assertEqual(mrun.metrics, [])
        self.assertIn("not found", rep.fetcher.last_error)
        # Known run, no measured second yet: its zeros are not readings.
        self.write_report(wall_s=0, energy_total_j=0, energy_kwh=0, j_per_token=None, tok_per_s=None,
                          avg_power_w=None, total_cost_usd=None, usd_per_mtok=None, projected_cost_usd=None)
        n = len(self.argvs())
        self.assertTrue(wait_until(lambda: len(self.argvs()) >= n + 2))
        self.assertEqual(mrun.metrics, [])
        self.assertNotIn("trainmeter_console_url", mrun.params)  # no console URL given
        # Only what the report knows.
        self.write_report(j_per_token=None, tok_per_s=None, total_cost_usd=None, usd_per_mtok=None,
                          projected_cost_usd=None, avg_power_w=None)
        self.assertTrue(wait_until(lambda: mrun.metrics))
        rep.stop()
        self.assertEqual(set(metrics_by_log(mrun)[-1][1]), {"trainmeter/energy_j", "trainmeter/energy_kwh"})

    def test_no_active_run_logs_nothing(self):
        self.agent()
        run = self.start(run_id="n1")
        with self.assertLogs("trainmeter", "WARNING") as cm:
            self.assertIsNone(tm_mlflow.attach(run))
        self.assertIn("no active MLflow run", cm.output[0])
        self.assertEqual(self.mlflow.runs, {})

    def test_missing_cli_warns_once_and_logs_advice(self):
        a = self.agent()
        self.mlflow.start_run()
        mrun = self.mlflow.runs[self.mlflow.active_run().info.run_id]
        run = self.start(run_id="c1")
        a.wait_lines(0, 1)
        a.send(dict(ADVICE, run_id="c1"))
        self.assertTrue(wait_until(lambda: run.advice() is not None))
        with self.assertLogs("trainmeter", "WARNING") as cm:
            rep = self.keep(tm_mlflow.attach(run, interval_s=0.05, cli=os.path.join(self.dir, "nope")))
            self.assertTrue(wait_until(lambda: len(metrics_by_log(mrun)) >= 3))
        self.assertEqual(len([x for x in cm.output if "cannot read the run's figures" in x]), 1)
        self.assertEqual(set(metrics_by_log(mrun)[-1][1]), {"trainmeter/advice/" + k for k in (
            "num_workers", "prefetch_factor", "expected_gain", "data_wait_share")})
        # finish() does not wait for an end the CLI can never report.
        run.end()
        done = threading.Thread(target=rep.finish, kwargs={"timeout_s": 600})
        done.start()
        done.join(60)  # a hang detector: with the wait, finish() would take 600 s
        self.assertFalse(done.is_alive())


class TestWandb(TrackerBase):
    def test_log_summary_config(self):
        a = self.agent()
        os.environ["TRAINMETER_CONSOLE_URL"] = "https://tm.example.com/console"
        wrun = self.wandb.init(project="p")
        run = self.start(run_id="wb1")
        self.write_report()
        rep = self.keep(tm_wandb.attach(run, interval_s=0.05))
        run.step(step=3, tokens=10)
        a.wait_lines(0, 2)
        self.assertTrue(wait_until(lambda: any(r.get("trainmeter/step") == 3 for r in wrun.history)))
        row = [r for r in wrun.history if r.get("trainmeter/step") == 3][-1]
        self.assertEqual(row, dict(WANT, **{"trainmeter/step": 3}))
        self.assertEqual(wrun.defined, {"trainmeter/step": None, "trainmeter/*": "trainmeter/step"})
        link = "https://tm.example.com/console/runs/wb1"
        self.assertEqual(dict(wrun.config), {"trainmeter_run_id": "wb1", "trainmeter_console_url": link})
        run.end()
        self.write_report(ended=True, total_cost_usd=0.03)
        rep.finish(timeout_s=5)
        self.assertEqual(wrun.summary["trainmeter/cost_usd"], 0.03)
        self.assertEqual(wrun.summary["trainmeter_console_url"], link)
        self.assertNotIn("trainmeter/co2_kg", wrun.summary)
        self.assertFalse(rep._thread.is_alive())

    def test_no_run(self):
        self.agent()
        run = self.start(run_id="wb2")
        with self.assertLogs("trainmeter", "WARNING"):
            self.assertIsNone(tm_wandb.attach(run))


class TestCallbacksEnableIt(TrackerBase):
    def test_hf_report_to_mlflow(self):
        self.agent()
        self.write_report(ended=True)
        self.mlflow.start_run()  # HF's MLflowCallback runs before ours and starts it
        mrun = self.mlflow.runs[self.mlflow.active_run().info.run_id]
        cb = hf.TrainmeterCallback(run_id="hf-ml", socket_path=self.sock, tokens_per_step=100,
                                   figures_options={"interval_s": 0.05, "finish_timeout_s": 2})
        args = hf_args(report_to=["mlflow", "tensorboard"])
        state = NS(global_step=0, max_steps=2, num_input_tokens_seen=0, is_world_process_zero=True, epoch=0.0)
        control = NS(should_training_stop=False, should_log=False)
        cb.on_train_begin(args, state, control, model=None)
        self.runs.append(cb.run)
        self.assertEqual(len(cb.figures), 1)
        state.global_step = 1
        cb.on_step_begin(args, state, control)
        cb.on_step_end(args, state, control)
        self.mlflow.end_run()  # MLflowCallback.on_train_end comes first
        cb.on_train_end(args, state, control)
        self.assertEqual(cb.figures, [])
        self.assertEqual(mrun.params["trainmeter_run_id"], "hf-ml")
        self.assertEqual(metrics_by_log(mrun)[-1], (1, WANT))
        self.assertEqual(list(self.mlflow.runs), [mrun.run_id])

    def test_hf_without_trackers_or_off(self):
        self.agent()
        for report_to, flag in ((["tensorboard"], None), ("none", None), (["mlflow", "wandb"], False)):
            cb = hf.TrainmeterCallback(socket_path=self.sock, tokens_per_step=1, report_figures=flag)
            state = NS(global_step=0, max_steps=2, num_input_tokens_seen=0, is_world_process_zero=True, epoch=0.0)
            cb.on_train_begin(hf_args(report_to=report_to), state, NS(should_training_stop=False))
            self.runs.append(cb.run)
            self.assertEqual(cb.figures, [], report_to)
        self.assertEqual(self.mlflow.runs, {})
        self.assertIsNone(self.wandb.run)

    def test_hf_report_to_wandb_main_process_only(self):
        self.agent()
        self.write_report(ended=True)
        wrun = self.wandb.init()
        for main in (False, True):
            cb = hf.TrainmeterCallback(run_id="hf-wb", socket_path=self.sock, tokens_per_step=1,
                                       figures_options={"interval_s": 60, "finish_timeout_s": 2})
            state = NS(global_step=0, max_steps=2, num_input_tokens_seen=0, is_world_process_zero=main, epoch=0.0)
            control = NS(should_training_stop=False)
            cb.on_train_begin(hf_args(report_to="wandb"), state, control)
            self.runs.append(cb.run)
            self.assertEqual(len(cb.figures), int(main))
            cb.on_train_end(hf_args(report_to="wandb"), state, control)
        self.assertEqual(wrun.summary["trainmeter/j_per_token"], 0.25)
        self.assertEqual(len(wrun.history), 1)  # the final log of rank 0

    def test_lightning_loggers(self):
        self.agent()
        self.write_report(ended=True)
        mrun_id = self.mlflow.start_run().info.run_id
        self.mlflow.end_run()  # Lightning's MLFlowLogger logs by run id, with no active run
        wrun = self.wandb.init()

        class MLFlowLogger:
            run_id = mrun_id

        class WandbLogger:
            experiment = wrun

        class TensorBoardLogger:
            pass

        trainer = FakeTrainer(loggers=[TensorBoardLogger(), MLFlowLogger(), WandbLogger()])
        cb = lightning.TrainmeterCallback(run_id="pl-1", socket_path=self.sock, tokens_per_step=8,
                                          figures_options={"interval_s": 60, "finish_timeout_s": 2})
        cb.on_train_start(trainer, NS(hparams={"model_name": "m"}))
        self.runs.append(cb.run)
        self.assertEqual(len(cb.figures), 2)
        cb.on_train_end(trainer, NS())
        mrun = self.mlflow.runs[mrun_id]
        self.assertEqual(metrics_by_log(mrun)[-1][1], WANT)
        self.assertEqual(mrun.params, {"trainmeter_run_id": "pl-1"})
        self.assertEqual(wrun.summary["trainmeter/tok_per_s"], 1200.0)
        self.assertEqual(list(self.mlflow.runs), [mrun_id])

    def test_lightning_not_rank_zero(self):
        self.agent()
        wrun = self.wandb.init()

        class WandbLogger:
            experiment = wrun

        trainer = FakeTrainer(loggers=[WandbLogger()], is_global_zero=False)
        cb = lightning.TrainmeterCallback(socket_path=self.sock, tokens_per_step=8)
        cb.on_train_start(trainer, NS(hparams={}))
        self.runs.append(cb.run)
        self.assertEqual(cb.figures, [])


class TestImportedOnlyWhenUsed(unittest.TestCase):
    def test_no_tracker_import_at_load(self):
        code = textwrap.dedent("""
            import sys
            sys.path.insert(0, %r)
            import trainmeter, trainmeter.dist, trainmeter.loader
            from trainmeter.integrations import hf, lightning, mlflow, wandb, _figures
            print(sorted(m for m in ("mlflow", "wandb") if m in sys.modules))
            """) % PKG_ROOT
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        self.assertEqual(out.strip(), "[]")


class TestConsoleLink(unittest.TestCase):
    def test_link(self):
        self.assertEqual(_figures.console_link("a b/c", "http://h:7434"), "http://h:7434/runs/a%20b%2Fc")
        self.assertIsNone(_figures.console_link("r", ""))


if __name__ == "__main__":
    unittest.main()

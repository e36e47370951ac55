import inspect
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)
if PKG_ROOT not in sys.path:
    sys.path.insert(0, PKG_ROOT)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import trainmeter  # noqa: E402
from fakeagent import FakeAgent, strict_loads  # noqa: E402
from trainmeter.metadata import METADATA_KEYS  # noqa: E402

ENV_KEYS = ("TRAINMETER_SOCKET", "TRAINMETER_RUN_ID", "CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK")

# Fast settings for tests.
FAST = dict(reconnect_min_s=0.05, reconnect_max_s=0.1)


def wait_until(pred, timeout=5.0, interval=0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


class Base(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tm-")
        self.sock = os.path.join(self.dir, "agent.sock")
        env = mock.patch.dict(os.environ)
        env.start()
        self.addCleanup(env.stop)
        for k in ENV_KEYS:
            os.environ.pop(k, None)
        self.agents = []
        self.runs = []

    def tearDown(self):
        for r in self.runs:
            r.end(timeout=0.2)
        for a in self.agents:
            a.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def agent(self, **kw):
        a = FakeAgent(self.sock, **kw)
        self.agents.append(a)
        return a

    def start(self, **kw):
        kw.setdefault("socket_path", self.sock)
        for k, v in FAST.items():
            kw.setdefault(k, v)
        r = trainmeter.start(**kw)
        self.runs.append(r)
        return r


class TestProtocol(Base):
    def test_exact_lines(self):
        a = self.agent()
        run = self.start(
            run_id="r1",
            model="llama-3-8b",
            dataset="sft",
            backend="unsloth",
            optimizer="adamw_torch",
            batch_size=8,
            grad_accum=4,
            seq_len=2048,
            precision="bf16",
            seed=42,
            notes="lora r=32",
            warmup_s=60,
            gpus=[0, 1],
            num_workers=6,
            prefetch_factor=2,
            planned_steps=5000,
            gpu_price_per_hour=2.1,
            budget_scope="llama-3-8b",
            client_id="c0ffee",
        )
        run.step(step=17, tokens=65536, samples=32, data_wait_s=0.012, compute_s=0.41, loss=2.31)
        run.eval(epoch=1, val_loss=1.93, accuracy=0.71)
        run.end()
        self.assertTrue(a.wait_lines(0, 4))
        self.assertTrue(a.wait_eof(0))
        raw = a.raw_lines(0)
        self.assertEqual(
            raw,
            [
                b'{"event":"run_start","run_id":"r1","model":"llama-3-8b","dataset":"sft",'
                b'"backend":"unsloth","optimizer":"adamw_torch","batch_size":8,"grad_accum":4,'
                b'"seq_len":2048,"precision":"bf16","seed":42,"notes":"lora r=32","warmup_s":60,'
                b'"gpus":[0,1],"num_workers":6,"prefetch_factor":2,"planned_steps":5000,'
                b'"gpu_price_per_hour":2.1,"budget_scope":"llama-3-8b","client_id":"c0ffee"}',
                b'{"event":"step","run_id":"r1","step":17,"tokens":65536,"tokens_total":65536,"samples":32,'
                b'"data_wait_s":0.012,"compute_s":0.41,"loss":2.31}',
                b'{"event":"eval","run_id":"r1","epoch":1,"val_loss":1.93,"accuracy":0.71}',
                b'{"event":"run_end","run_id":"r1"}',
            ],
        )
        st = run.stats()
        self.assertEqual(st.sent, 4)
        self.assertEqual(st.dropped, 0)
        self.assertEqual(st.reconnects, 0)

    def test_many_steps_tokens_add_up(self):
        a = self.agent()
        run = self.start(run_id="r2", model="m")
        for i in range(500):
            run.step(tokens=100, samples=2)
        run.end()
        self.assertTrue(a.wait_lines(0, 502))
        evs = a.events(0)
        steps = [e for e in evs if e["event"] == "step"]
        self.assertEqual([e["step"] for e in steps], list(range(1, 501)))  # auto-numbered
        self.assertEqual(sum(e["tokens"] for e in steps), 50000)
        self.assertEqual(evs[0]["event"], "run_start")
        self.assertEqual(evs[-1], {"event": "run_end", "run_id": "r2"})
        self.assertEqual(run.stats().sent, 502)

    def test_none_values_not_sent_and_extras(self):
        a = self.agent()
        run = self.start(run_id="r3", model="m", dataset=None)
        run.step(step=1, tokens=10, loss=None, lr=1e-4)
        run.end()
        self.assertTrue(a.wait_lines(0, 3))
        evs = a.events(0)
        self.assertEqual(evs[0].pop("client_id") != "", True)
        self.assertEqual(evs[0], {"event": "run_start", "run_id": "r3", "model": "m"})
        self.assertEqual(evs[1], {"event": "step", "run_id": "r3", "step": 1, "tokens": 10, "tokens_total": 10, "lr": 1e-4})

    def test_nan_and_inf_never_sent(self):
        a = self.agent()
        run = self.start(run_id="r4")
        run.step(step=1, tokens=10, loss=float("nan"), compute_s=float("inf"), data_wait_s=0.1)
        run.eval(epoch=1, val_loss=float("-inf"), accuracy=0.5)
        run.end()
        self.assertTrue(a.wait_lines(0, 4))
        for line in a.raw_lines(0):
            self.assertNotIn(b"NaN", line)
            self.assertNotIn(b"Infinity", line)
            strict_loads(line.decode())  # must parse as strict JSON
        evs = a.events(0)
        self.assertEqual(evs[1], {"event": "step", "run_id": "r4", "step": 1, "tokens": 10, "tokens_total": 10, "data_wait_s": 0.1})
        self.assertEqual(evs[2], {"event": "eval", "run_id": "r4", "epoch": 1, "accuracy": 0.5})
        self.assertEqual(run.stats().nonfinite_dropped, 3)

    def test_numpy_like_and_unserialisable_values_do_not_raise(self):
        class Scalar:  # stands in for a 0-d tensor / numpy scalar
            def __init__(self, v):
                self.v = v

            def item(self):
                return self.v

        a = self.agent()
        run = self.start(run_id="r5")
        run.step(step=1, tokens=Scalar(7), loss=Scalar(float("nan")), blob=object())
        run.end()
        self.assertTrue(a.wait_lines(0, 3))
        ev = a.events(0)[1]
        self.assertEqual(ev["tokens"], 7)
        self.assertNotIn("loss", ev)
        self.assertIsInstance(ev["blob"], str)

    def test_env_socket_and_run_id(self):
        a = self.agent()
        os.environ["TRAINMETER_SOCKET"] = self.sock
        os.environ["TRAINMETER_RUN_ID"] = "from-env"
        run = trainmeter.start(model="m", **FAST)
        self.runs.append(run)
        self.assertEqual(run.run_id, "from-env")
        self.assertEqual(run.socket_path, self.sock)
        run.end()
        self.assertTrue(a.wait_lines(0, 2))
        self.assertEqual(a.events(0)[0]["run_id"], "from-env")
        # explicit arguments win over the environment
        os.environ["TRAINMETER_SOCKET"] = "/nonexistent/x.sock"
        run2 = self.start(run_id="explicit")
        self.assertEqual(run2.run_id, "explicit")
        self.assertEqual(run2.socket_path, self.sock)

    def test_default_socket_and_generated_run_id(self):
        run = trainmeter.start(end_timeout=0.1)
        self.runs.append(run)
        self.assertEqual(run.socket_path, "/run/trainmeter/agent.sock")
        self.assertTrue(run.run_id)
        run2 = trainmeter.start(end_timeout=0.1)
        self.runs.append(run2)
        self.assertNotEqual(run.run_id, run2.run_id)

    def test_cuda_visible_devices_and_ranks(self):
        a = self.agent()
        os.environ.update(CUDA_VISIBLE_DEVICES="2,3", RANK="1", WORLD_SIZE="4", LOCAL_RANK="1")
        run = self.start(run_id="dist", gpus=[2, 3])
        run.end()
        self.assertTrue(a.wait_lines(0, 2))
        ev = a.events(0)[0]
        self.assertTrue(ev.pop("client_id"))
        self.assertEqual(
            ev,
            {
                "event": "run_start",
                "run_id": "dist",
                "gpus": [2, 3],
                "cuda_visible_devices": "2,3",
                "rank": 1,
                "world_size": 4,
                "local_rank": 1,
            },
        )

    def test_context_manager(self):
        a = self.agent()
        with self.start(run_id="cm") as run:
            run.step(step=1, tokens=1)
        self.assertTrue(run.ended)
        self.assertTrue(a.wait_lines(0, 3))
        self.assertEqual(a.events(0)[-1], {"event": "run_end", "run_id": "cm"})

        with self.assertRaises(RuntimeError):
            with self.start(run_id="cm2") as run2:
                raise RuntimeError("boom")
        self.assertTrue(a.wait_lines(1, 2))
        self.assertEqual(a.events(1)[-1], {"event": "run_end", "run_id": "cm2", "status": "error", "error": "RuntimeError: boom"})

    def test_exception_cause_is_sent_bounded(self):
        # The exception as the agent keeps it: module.Type: message, at most
        # 1024 bytes of UTF-8 cut at a character boundary.
        a = self.agent()
        oom = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch.cuda"})
        with self.assertRaises(RuntimeError):
            with self.start(run_id="oom") as run:
                raise oom("CUDA out of memory. " + "é" * 600)
        self.assertTrue(a.wait_lines(0, 2))
        end = a.events(0)[-1]
        self.assertEqual(end["status"], "error")
        cause = end["error"]
        self.assertTrue(cause.startswith("torch.cuda.OutOfMemoryError: CUDA out of memory. é"), cause[:60])
        self.assertLessEqual(len(cause.encode("utf-8")), 1024)
        self.assertGreaterEqual(len(cause.encode("utf-8")), 1023)
        self.assertEqual(trainmeter.client.describe_exception(KeyError, KeyError()), "KeyError")

    def test_calls_after_end_are_noops(self):
        a = self.agent()
        run = self.start(run_id="after")
        run.end()
        run.end()
        run.step(step=1, tokens=1)
        run.eval(epoch=1)
        self.assertTrue(a.wait_eof(0))
        self.assertEqual([e["event"] for e in a.events(0)], ["run_start", "run_end"])


class TestNeverBlocks(Base):
    def test_agent_absent(self):
        t0 = time.monotonic()
        run = self.start(run_id="absent", model="m")
        for i in range(1000):
            run.step(step=i, tokens=1000, samples=1, data_wait_s=0.01, compute_s=0.1, loss=1.0)
        run.eval(epoch=1, val_loss=1.0)
        t_steps = time.monotonic() - t0
        run.end()
        t_all = time.monotonic() - t0
        # Below the 1 s connect timeout and backoff: nothing waited on I/O.
        self.assertLess(t_steps, 0.9)
        self.assertLess(t_all, 0.9)
        st = run.stats()
        self.assertEqual(st.sent, 0)
        self.assertEqual(st.dropped, 1002)  # 1000 steps + eval + run_end
        self.assertFalse(st.connected)

    def test_agent_absent_default_backoff_end_is_fast(self):
        # With the default 1-5 s backoff, end() must still return at once.
        run = trainmeter.start(run_id="absent2", socket_path=self.sock)
        self.runs.append(run)
        time.sleep(0.05)
        for i in range(100):
            run.step(tokens=1)
        t0 = time.monotonic()
        run.end()
        self.assertLess(time.monotonic() - t0, 0.9)  # not the 1-5 s backoff, not end_timeout

    def test_queue_full_drops_counted(self):
        run = self.start(run_id="full", queue_size=10, reconnect_min_s=5, reconnect_max_s=5)
        t0 = time.monotonic()
        for i in range(5000):
            run.step(tokens=1)
        self.assertLess(time.monotonic() - t0, 0.9)  # the 5 s backoff never reached step()
        run.end(timeout=0.3)
        st = run.stats()
        self.assertEqual(st.sent, 0)
        self.assertGreater(st.dropped_queue_full, 0)
        self.assertEqual(st.dropped, 5001)

    def test_agent_never_reads(self):
        a = self.agent(read=False)
        run = self.start(run_id="wedged", queue_size=100, send_timeout=0.3, end_timeout=0.5, max_buffer_bytes=64 * 1024)
        pad = "x" * 2000
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < 1.0:  # "train" for 1 s against a wedged agent
            run.step(tokens=1, notes=pad)
            n += 1
            if n % 100 == 0:
                time.sleep(0.001)
        worst = 0.0
        for i in range(2000):
            t = time.monotonic()
            run.step(tokens=1, notes=pad)
            worst = max(worst, time.monotonic() - t)
        self.assertLess(worst, 0.9)  # below the 1 s that any socket wait here would take
        t1 = time.monotonic()
        run.end()
        self.assertLess(time.monotonic() - t1, 3.0)  # end_timeout is 0.5 s; a wedge would be forever
        st = run.stats()
        self.assertGreater(st.dropped, 0)
        self.assertGreaterEqual(st.connects, 1)
        # the send timeout made it give up on the wedged connection and reconnect
        self.assertGreaterEqual(st.reconnects, 1)
        self.assertTrue(a.wait_conns(2))


class TestAgentToClient(Base):
    def test_advice_stop_error(self):
        a = self.agent()
        run = self.start(run_id="r1")
        self.assertTrue(a.wait_lines(0, 1))
        self.assertIsNone(run.advice())
        self.assertFalse(run.should_stop())
        self.assertIsNone(run.stop_reason)

        a.send({"event": "error", "error": "step: tokens must be a non-negative integer", "line": 3})
        adv = {"event": "advice", "run_id": "r1", "kind": "dataloader", "num_workers": 10, "prefetch_factor": 4, "reason": "data wait 30%"}
        a.send(adv)
        # advice / stop for another run on the same connection are ignored
        a.send({"event": "stop", "run_id": "other", "reason": "not me"})
        self.assertTrue(wait_until(lambda: run.advice() is not None))
        self.assertEqual(run.advice(), trainmeter.Advice(kind="dataloader", num_workers=10, prefetch_factor=4, reason="data wait 30%"))
        self.assertTrue(wait_until(lambda: run.stats().errors_from_agent == 1))
        self.assertEqual(run.errors()[-1].line, 3)
        time.sleep(0.05)
        self.assertFalse(run.should_stop())

        # a later advice replaces the earlier one; junk lines are ignored
        a.conns[0]["sock"].sendall(b"not json\n\n[1,2]\n")
        adv2 = dict(adv, num_workers=12)
        a.send(adv2)
        self.assertTrue(wait_until(lambda: getattr(run.advice(), "num_workers", None) == 12))

        a.send({"event": "stop", "run_id": "r1", "reason": "budget llama-3-8b exceeded (100%)"})
        self.assertTrue(wait_until(run.should_stop))
        self.assertEqual(run.stop_reason, "budget llama-3-8b exceeded (100%)")
        run.end()


    def test_refused_run_start_outlives_the_step_errors_it_causes(self):
        # A refused run_start makes every later step fail too; the refusal is
        # the error that says what to do, so more step errors than errors()
        # keeps must not push it out.
        a = self.agent()
        run = self.start(run_id="r1")
        self.assertTrue(a.wait_lines(0, 1))
        refusal = 'run_start: run "r1" already ended on this node; pick a new run_id or pass resume=True'
        a.send({"event": "error", "error": refusal, "line": 1})
        for i in range(25):
            a.send({"event": "error", "error": 'step: unknown run_id "r1" (send run_start first)', "line": i + 2})
        self.assertTrue(wait_until(lambda: run.stats().errors_from_agent == 26))
        errs = run.errors()
        self.assertEqual(errs[0].error, refusal)
        self.assertEqual(errs[-1].line, 26)
        self.assertLessEqual(len(errs), 11)
        run.end()


class TestSpeaksUp(Base):
    """A run that is not being measured says so, once, on stderr; it never raises."""

    def test_unreachable_agent_warns_once_on_stderr(self):
        code = (
            "import sys; sys.path.insert(0, %r)\n"
            "import trainmeter\n"
            "for rid in ('first', 'second'):\n"
            "    run = trainmeter.start(run_id=rid, socket_path=%r, reconnect_min_s=0.05, reconnect_max_s=0.1)\n"
            "    for i in range(20):\n"
            "        run.step(tokens=10)\n"
            "        __import__('time').sleep(0.01)\n"
            "    run.end()\n"
            "print('trained')\n"
        ) % (PKG_ROOT, os.path.join(self.dir, "no", "agent.sock"))
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "trained\n")
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertIn("trainmeter: agent not reachable at %s" % os.path.join(self.dir, "no", "agent.sock"), lines[0])
        self.assertIn("run first is not being measured", lines[0])
        self.assertIn("TRAINMETER_SOCKET", lines[0])

    def test_agent_refusing_run_start_warns_once(self):
        a = self.agent()
        with self.assertLogs("trainmeter", "WARNING") as logs:
            run = self.start(run_id="r1")
            self.assertTrue(a.wait_lines(0, 1))
            refusal = {"event": "error", "error": 'run_start: run "r1" already ended on this node; use a new run_id', "line": 1}
            a.send(refusal)
            a.send({"event": "error", "error": "step: run \"r1\" not started on this connection", "line": 2})
            a.send(refusal)
            self.assertTrue(wait_until(lambda: run.stats().errors_from_agent == 3))
            run.step(tokens=1)  # still never raises
            run.end()
        warnings = [r.getMessage() for r in logs.records if r.levelname == "WARNING"]
        self.assertEqual(len(warnings), 1, warnings)
        self.assertIn("the agent refused run r1: run_start: run \"r1\" already ended", warnings[0])

    def test_reachable_agent_is_quiet(self):
        a = self.agent()
        with mock.patch.object(trainmeter.client.log, "warning") as warn:
            run = self.start(run_id="quiet")
            run.step(tokens=1)
            run.end()
        self.assertTrue(a.wait_eof(0))
        warn.assert_not_called()


class TestReconnect(Base):
    def test_reconnect_resends_run_start(self):
        a = self.agent()
        run = self.start(run_id="rc", model="m", gpus=[0])
        run.step(step=1, tokens=10)
        self.assertTrue(a.wait_lines(0, 2))
        a.close()  # agent goes away
        self.assertTrue(wait_until(lambda: not run.stats().connected))
        for i in range(20):  # dropped while the agent is down
            run.step(step=2 + i, tokens=10)
            time.sleep(0.005)
        first_client_id = a.events(0)[0]["client_id"]
        b = self.agent()  # agent restarts on the same path
        self.assertTrue(b.wait_conns(1))
        self.assertTrue(b.wait_lines(0, 1))
        self.assertTrue(wait_until(lambda: run.stats().connected))
        run.step(step=100, tokens=10)
        run.end()
        self.assertTrue(b.wait_lines(0, 3))
        evs = b.events(0)
        # The same process keeps its client_id, and its cumulative total
        # counts the 20 dropped steps, so the agent can credit them.
        self.assertEqual(evs[0].pop("client_id"), first_client_id)
        self.assertEqual(evs[0], {"event": "run_start", "run_id": "rc", "model": "m", "gpus": [0]})
        self.assertEqual(evs[-2], {"event": "step", "run_id": "rc", "step": 100, "tokens": 10, "tokens_total": 220})
        self.assertEqual(evs[-1], {"event": "run_end", "run_id": "rc"})
        st = run.stats()
        self.assertEqual(st.reconnects, 1)
        self.assertGreater(st.dropped, 0)
        # 22 steps + run_end + run_start on each of the 2 connections
        self.assertEqual(st.sent + st.dropped, 22 + 1 + 2)

    def test_agent_appears_later(self):
        run = self.start(run_id="late", model="m")
        run.step(step=1, tokens=1)
        self.assertTrue(wait_until(lambda: run.stats().dropped == 1))
        a = self.agent()
        self.assertTrue(a.wait_lines(0, 1))
        run.step(step=2, tokens=1)
        run.end()
        self.assertTrue(a.wait_lines(0, 3))
        self.assertEqual([e["event"] for e in a.events(0)], ["run_start", "step", "run_end"])
        self.assertEqual(a.events(0)[1]["step"], 2)


class TestExamples(Base):
    def test_train_sim_end_to_end(self):
        a = self.agent()
        script = os.path.join(PKG_ROOT, "examples", "train_sim.py")
        t0 = time.monotonic()
        p = subprocess.run(
            [sys.executable, script, "--socket", self.sock, "--run-id", "sim1", "--model", "tiny",
             "--gpus", "0,1", "--duration-s", "0.6", "--step-time", "0.05", "--tokens-per-s", "20000",
             "--data-wait-frac", "0.2", "--epochs", "2", "--batch-size", "4", "--grad-accum", "2"],
            capture_output=True, text=True, timeout=20,
        )
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertIn("steps=12", p.stdout)
        self.assertTrue(a.wait_eof(0))
        evs = a.events(0)
        self.assertEqual(evs[0]["event"], "run_start")
        self.assertEqual(evs[0]["gpus"], [0, 1])
        self.assertEqual(evs[0]["model"], "tiny")
        steps = [e for e in evs if e["event"] == "step"]
        self.assertEqual(len(steps), 12)
        self.assertTrue(all(e["tokens"] == 1000 for e in steps))
        self.assertTrue(all(e["samples"] == 8 for e in steps))
        self.assertAlmostEqual(steps[0]["data_wait_s"], 0.01)
        self.assertAlmostEqual(steps[0]["compute_s"], 0.04)
        self.assertEqual(len([e for e in evs if e["event"] == "eval"]), 2)
        self.assertEqual(evs[-1]["event"], "run_end")

    def test_train_sim_honours_stop(self):
        a = self.agent()
        script = os.path.join(PKG_ROOT, "examples", "train_sim.py")
        p = subprocess.Popen(
            [sys.executable, script, "--socket", self.sock, "--run-id", "sim2",
             "--duration-s", "10", "--step-time", "0.02"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            self.assertTrue(a.wait_lines(0, 3, timeout=5))
            a.send({"event": "stop", "run_id": "sim2", "reason": "budget exceeded"})
            out, err = p.communicate(timeout=5)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("budget exceeded", out)

    def test_train_sim_budget_scope_and_labels(self):
        a = self.agent()
        script = os.path.join(PKG_ROOT, "examples", "train_sim.py")
        p = subprocess.run(
            [sys.executable, script, "--socket", self.sock, "--run-id", "sim3", "--duration-s", "0.1",
             "--step-time", "0.05", "--budget-scope", "llama-3-8b", "--label", "team=nlp", "--label", "project=x=y"],
            capture_output=True, text=True, timeout=20,
        )
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(a.wait_eof(0))
        start = a.events(0)[0]
        self.assertEqual(start["event"], "run_start")
        self.assertEqual(start["budget_scope"], "llama-3-8b")
        self.assertEqual(start["team"], "nlp")
        self.assertEqual(start["project"], "x=y")
        for bad in ("team", "model=x", "=v"):
            p = subprocess.run([sys.executable, script, "--socket", self.sock, "--label", bad],
                               capture_output=True, text=True, timeout=20)
            self.assertEqual(p.returncode, 2, bad)
            self.assertIn("--label", p.stderr)

    def test_train_torch_compiles(self):
        import py_compile

        py_compile.compile(
            os.path.join(PKG_ROOT, "examples", "train_torch.py"),
            cfile=os.path.join(self.dir, "train_torch.pyc"),
            doraise=True,
        )


class TestTypedStart(Base):
    """start() takes the run metadata as typed keywords, exactly
    METADATA_KEYS, and free labels in labels={...}."""

    CLIENT_OPTIONS = ("labels", "queue_size", "send_timeout", "connect_timeout", "reconnect_min_s",
                      "reconnect_max_s", "end_timeout", "max_buffer_bytes", "gpu_uuids", "client_id")

    def test_signature_is_metadata_keys(self):
        params = inspect.signature(trainmeter.start).parameters
        self.assertEqual(list(params)[:2], ["run_id", "socket_path"])
        kw = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
        self.assertEqual(tuple(n for n in kw if n not in self.CLIENT_OPTIONS), METADATA_KEYS)
        self.assertEqual(kw[len(METADATA_KEYS):], list(self.CLIENT_OPTIONS))
        self.assertFalse(any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()))
        for n in METADATA_KEYS:
            self.assertIsNone(params[n].default, n)  # None: not sent

    def test_unknown_keyword_raises_at_start(self):
        threads = threading.active_count()
        with self.assertRaisesRegex(TypeError, "batch_sise"):
            trainmeter.start(run_id="typo", socket_path=self.sock, batch_sise=8)
        with self.assertRaisesRegex(TypeError, "batch_sise"):
            trainmeter.Run(run_id="typo", socket_path=self.sock, metadata={"batch_sise": 8})
        self.assertEqual(threading.active_count(), threads)  # nothing was started

    def test_callbacks_refuse_unknown_keywords_when_created(self):
        from trainmeter.integrations import hf, lightning

        for cb in (hf.TrainmeterCallback, lightning.TrainmeterCallback):
            with self.assertRaisesRegex(TypeError, "batch_sise"):
                cb(run_id="typo", batch_sise=8)
            cb(run_id="ok", batch_size=8, labels={"team": "nlp"})

    def test_labels_sent_as_keys_of_their_own(self):
        a = self.agent()
        run = self.start(run_id="lb", model="m", batch_size=8, labels={"team": "nlp", "priority": "high", "n": 3,
                                                                        "on": True, "gone": None})
        run.end()
        self.assertTrue(a.wait_eof(0))
        ev = a.events(0)[0]
        self.assertTrue(ev.pop("client_id"))
        self.assertEqual(ev, {"event": "run_start", "run_id": "lb", "model": "m", "batch_size": 8, "team": "nlp",
                              "priority": "high", "n": 3, "on": True})

    def test_bad_labels_raise(self):
        for labels, exc in (({"model": "x"}, ValueError), ({"client_id": "x"}, ValueError), ({"run_id": "x"}, ValueError),
                            ({"team": ["a"]}, TypeError), ({"team": {"a": 1}}, TypeError), ({1: "x"}, TypeError),
                            (["team"], TypeError)):
            with self.assertRaises(exc, msg=repr(labels)):
                trainmeter.start(run_id="bad", socket_path=self.sock, labels=labels)

    def test_public_names(self):
        for name in trainmeter.__all__:
            self.assertTrue(hasattr(trainmeter, name), name)
        self.assertNotIn("encode_event", trainmeter.__all__)
        self.assertTrue(os.path.exists(os.path.join(PKG_ROOT, "trainmeter", "py.typed")))
        with open(os.path.join(PKG_ROOT, "pyproject.toml")) as f:
            self.assertIn('trainmeter = ["py.typed"]', f.read())


class TestSenderBlocks(Base):
    def test_idle_sender_does_not_wake(self):
        a = self.agent()
        run = self.start(run_id="idle")
        run.step(step=1, tokens=1)
        self.assertTrue(a.wait_lines(0, 2))
        self.assertTrue(wait_until(lambda: run.stats().sent == 2 and run._waiting))
        before = run._wakeups
        time.sleep(0.2)  # the old loop polled every 20 ms: 10 passes here
        self.assertEqual(run._wakeups, before)
        # Work wakes it at once, and an advice from the agent too.
        run.step(step=2, tokens=1)
        self.assertTrue(a.wait_lines(0, 3, timeout=1))
        a.send({"event": "advice", "run_id": "idle", "kind": "dataloader", "num_workers": 3, "prefetch_factor": 2})
        self.assertTrue(wait_until(lambda: run.advice() is not None, timeout=1))
        t0 = time.monotonic()
        run.end()
        self.assertLess(time.monotonic() - t0, 0.5)
        self.assertTrue(a.wait_eof(0))
        self.assertEqual([e["event"] for e in a.events(0)], ["run_start", "step", "step", "run_end"])


if __name__ == "__main__":
    unittest.main()

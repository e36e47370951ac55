"""examples/train_torch.py runs on the installed PyTorch (1.13 rejected the
encoder's is_causal keyword that 2.x takes) and reports every step."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from torchenv import HERE, PKG_ROOT, require_torch

sys.path.insert(0, os.path.join(PKG_ROOT, "tests"))
from fakeagent import FakeAgent  # noqa: E402

TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--seq-len", "16", "--vocab", "128", "--batch-size", "4"]


@require_torch
class TrainTorchExampleTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tm-torch-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.agent = FakeAgent(os.path.join(self.dir, "agent.sock"))
        self.addCleanup(self.agent.close)

    def run_example(self, *args):
        p = subprocess.run(
            [sys.executable, os.path.join(PKG_ROOT, "examples", "train_torch.py"), "--socket", self.agent.path,
             "--run-id", "torch-example"] + TINY + list(args),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120, cwd=HERE)
        out = p.stdout.decode(errors="replace")
        self.assertEqual(p.returncode, 0, out)
        return out

    def steps(self):
        self.assertTrue(self.agent.wait_conns(1))
        self.assertTrue(self.agent.wait_eof(0))
        return [e for e in self.agent.events(0) if e.get("event") == "step"]

    def test_fp32_without_workers(self):
        out = self.run_example("--steps", "6", "--epochs", "2", "--num-workers", "0", "--precision", "fp32")
        self.assertIn("train_torch: rank=0 steps=6 tokens=%d " % (6 * 4 * 16), out)
        steps = self.steps()
        self.assertEqual([s["step"] for s in steps], list(range(1, 7)))
        self.assertTrue(all(s["tokens"] == 4 * 16 for s in steps))
        self.assertTrue(all(s["data_wait_s"] >= 0 and s["compute_s"] > 0 for s in steps), steps)

    def test_bf16_with_two_workers(self):
        out = self.run_example("--steps", "4", "--epochs", "2", "--num-workers", "2")
        self.assertIn("train_torch: rank=0 steps=4 ", out)
        self.assertEqual(len(self.steps()), 4)


if __name__ == "__main__":
    unittest.main()

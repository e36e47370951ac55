"""TimedLoader, rebuild_dataloader, DDP run ids, GPU UUID mapping and the
Hugging Face / Lightning callbacks, driven with duck-typed stand-ins (no torch)
against the fake agent."""

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import types
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)
for p in (PKG_ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import trainmeter  # noqa: E402
from trainmeter import dist, loader as tl  # noqa: E402
from trainmeter.integrations import hf, lightning  # noqa: E402
from test_client import Base  # noqa: E402

try:
    import torch  # noqa: F401

    TORCH = True
except Exception:
    TORCH = False


class Clock:
    """A manual clock: tests set .t before each call that reads it."""

    def __init__(self, t=100.0):
        self.t = t

    def __call__(self):
        return self.t


def without_client_id(evs):
    out = []
    for e in evs:
        e = dict(e)
        if e["event"] == "run_start":
            assert e.pop("client_id")
        out.append(e)
    return out


# --------------------------------------------------------------- TimedLoader


class ClockedIterable:
    """Each next() advances the clock by the given wait (the 'data wait')."""

    def __init__(self, clock, waits):
        self.clock, self.waits = clock, waits

    def __iter__(self):
        for i, w in enumerate(self.waits):
            self.clock.t += w
            yield {"input_ids": [[1] * 4] * 2, "i": i}

    def __len__(self):
        return len(self.waits)


class TestTimedLoader(Base):
    def test_timings_per_batch(self):
        clk = Clock()
        src = ClockedIterable(clk, [0.5, 0.25, 0.125])
        src.dataset = "ds"
        loader = trainmeter.TimedLoader(src, clock=clk)
        self.assertEqual(len(loader), 3)
        self.assertEqual(loader.dataset, "ds")  # delegated
        got = []
        for batch in loader:
            got.append((batch["i"], loader.last_data_wait_s, loader.last_compute_s))
            clk.t += 2.0  # compute
        self.assertEqual(got, [(0, 0.5, None), (1, 0.25, 2.0), (2, 0.125, 2.0)])
        self.assertEqual(loader.batches, 3)

    def test_take_timings_sums_micro_batches(self):
        clk = Clock()
        loader = trainmeter.TimedLoader(ClockedIterable(clk, [0.5, 0.25, 0.125, 0.0]), clock=clk)
        windows = []
        for i, _ in enumerate(loader, start=1):
            clk.t += 1.0
            if i % 2 == 0:  # grad accumulation 2
                windows.append(loader.take_timings())
        self.assertEqual(windows, [(0.75, 2.0), (0.125, 2.0)])
        self.assertEqual(loader.take_timings(), (None, None))

    def test_run_step_picks_up_timings(self):
        a = self.agent()
        clk = Clock()
        run = self.start(run_id="tl")
        loader = trainmeter.TimedLoader(ClockedIterable(clk, [0.5, 0.25]), run=run, clock=clk)
        for batch in loader:
            clk.t += 1.5
            run.step(tokens=trainmeter.count_tokens(batch))
        # explicit values win; nothing new since the last step -> nothing filled in
        run.step(tokens=1, data_wait_s=0.0)
        run.end()
        self.assertTrue(a.wait_eof(0))
        self.assertEqual(
            without_client_id(a.events(0)),
            [
                {"event": "run_start", "run_id": "tl"},
                {"event": "step", "run_id": "tl", "step": 1, "tokens": 8, "tokens_total": 8, "data_wait_s": 0.5, "compute_s": 1.5},
                {"event": "step", "run_id": "tl", "step": 2, "tokens": 8, "tokens_total": 16, "data_wait_s": 0.25, "compute_s": 1.5},
                {"event": "step", "run_id": "tl", "step": 3, "tokens": 1, "tokens_total": 17, "data_wait_s": 0.0},
                {"event": "run_end", "run_id": "tl"},
            ],
        )

    def test_loader_step_helper(self):
        a = self.agent()
        clk = Clock()
        run = self.start(run_id="tl2")
        loader = trainmeter.TimedLoader(ClockedIterable(clk, [0.5]), clock=clk)
        for _ in loader:
            clk.t += 1.0
            loader.step(run, step=7, tokens=3, compute_s=0.9)
        run.end()
        self.assertTrue(a.wait_eof(0))
        self.assertEqual(
            a.events(0)[1],
            {"event": "step", "run_id": "tl2", "step": 7, "tokens": 3, "tokens_total": 3, "data_wait_s": 0.5, "compute_s": 0.9},
        )

    def test_real_clock_measures_blocking(self):
        def slow():
            for i in range(2):
                time.sleep(0.05)
                yield i

        loader = trainmeter.TimedLoader(slow())
        for _ in loader:
            self.assertGreaterEqual(loader.last_data_wait_s, 0.04)


# --------------------------------------------------------------- rebuild


class FakeSampler:
    pass


class _InfiniteConstantSampler:
    pass


class FakeDataLoader:
    """Mimics torch.utils.data.DataLoader's constructor and the attributes it keeps."""

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None,
                 persistent_workers=False, pin_memory_device=""):
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing")
        if num_workers == 0 and persistent_workers:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if num_workers == 0 and multiprocessing_context is not None:
            raise ValueError("multiprocessing_context can only be used with multi-process loading")
        if batch_sampler is not None and (batch_size != 1 or sampler is not None or drop_last):
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last")
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor if num_workers > 0 and prefetch_factor is not None else (2 if num_workers > 0 else None)
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.persistent_workers = persistent_workers
        self.generator = generator
        self.collate_fn = collate_fn or "default_collate"
        if batch_sampler is not None:
            self.batch_size, self.drop_last, self.sampler, self.batch_sampler = None, False, "inner", batch_sampler
        else:
            self.batch_size, self.drop_last = batch_size, drop_last
            self.sampler = sampler or FakeSampler()
            self.batch_sampler = ("BatchSampler", self.sampler, batch_size, drop_last)
        self.kwargs = dict(batch_size=batch_size, sampler=sampler, batch_sampler=batch_sampler, num_workers=num_workers,
                           prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                           multiprocessing_context=multiprocessing_context, drop_last=drop_last)

    def __iter__(self):
        return iter(range(3))


class AdviceRun:
    """Stands in for trainmeter.Run: only advice() matters here."""

    def __init__(self):
        self.latest = None

    def advice(self):
        return dict(self.latest) if self.latest is not None else None


class TestEvalReportsTheLoader(Base):
    """eval() says which DataLoader settings the epoch ran with: those of the
    loader the TimedLoader / AdaptiveLoader iterated, not a rebuilt one that
    has not run yet (the collector measures each epoch's throughput against
    them, docs/recommendations.md)."""

    def test_eval_carries_the_settings_the_epoch_ran_with(self):
        a = self.agent()
        run = self.start(run_id="ev")
        timed = trainmeter.TimedLoader(FakeDataLoader(list(range(3)), num_workers=0), run=run)
        run.eval(epoch=0)  # no epoch iterated yet: nothing to report
        list(timed)
        run.eval(epoch=1, val_loss=1.5)
        rebuilt = trainmeter.rebuild_dataloader(timed, num_workers=2, prefetch_factor=4)
        run.eval(epoch=1)  # rebuilt but not iterated: still epoch 1's loader
        list(rebuilt)
        run.eval(epoch=2)
        run.eval(epoch=2, num_workers=7)  # the caller's own value wins
        al = trainmeter.AdaptiveLoader(FakeDataLoader(list(range(3)), num_workers=3, prefetch_factor=5), run)
        list(al)
        run.eval(epoch=3)
        run.end()
        self.assertTrue(a.wait_eof(0))
        evals = [{k: v for k, v in e.items() if k in ("epoch", "num_workers", "prefetch_factor", "val_loss")}
                 for e in a.events(0) if e["event"] == "eval"]
        self.assertEqual(evals, [
            {"epoch": 0},
            {"epoch": 1, "num_workers": 0, "val_loss": 1.5},
            {"epoch": 1, "num_workers": 0},
            {"epoch": 2, "num_workers": 2, "prefetch_factor": 4},
            {"epoch": 2, "num_workers": 7},
            {"epoch": 3, "num_workers": 3, "prefetch_factor": 5},
        ])


class TestAdaptiveLoader(unittest.TestCase):
    def test_applies_advice_at_the_next_epoch_only(self):
        run = AdviceRun()
        al = trainmeter.AdaptiveLoader(FakeDataLoader("ds", batch_size=4, num_workers=2, prefetch_factor=2), run)
        self.assertEqual(list(al), [0, 1, 2])  # epoch 1: no advice
        first = al.loader
        # Advice arrives mid-epoch (with the collector's extra figures): the
        # running epoch keeps its loader.
        it = iter(al)
        run.latest = {"event": "advice", "run_id": "r", "kind": "dataloader", "num_workers": 3, "prefetch_factor": 3,
                      "reason": "data-bound", "classification": "data-bound", "data_wait_share": 0.5,
                      "gpu_utilization": 0.5, "ram_usage": 0.3, "expected_gain": 0.5, "max_workers": 15}
        self.assertEqual(list(it), [0, 1, 2])
        self.assertIs(al.loader, first)
        list(al)  # epoch 3 starts with the advice applied
        self.assertIsNot(al.loader, first)
        self.assertEqual((al.loader.num_workers, al.loader.prefetch_factor, al.batch_size), (3, 3, 4))
        self.assertEqual(al.adjustments, [{"epoch": 3, "num_workers": 3, "prefetch_factor": 3,
                                           "reason": "data-bound", "classification": "data-bound"}])
        self.assertEqual(al.last_advice.expected_gain, 0.5)
        # The same advice again is not re-applied.
        second = al.loader
        list(al)
        self.assertIs(al.loader, second)
        self.assertEqual(len(al.adjustments), 1)

    def test_advice_is_applied_relative_to_the_real_loader(self):
        # The run was started without num_workers/prefetch_factor: the
        # collector assumed 2/2 and advised 3/3 for a data-bound run. The
        # loader really has 8/4: it must get more workers and prefetch, not 3/3.
        run = AdviceRun()
        al = trainmeter.AdaptiveLoader(FakeDataLoader("ds", batch_size=4, num_workers=8, prefetch_factor=4), run)
        list(al)
        run.latest = {"event": "advice", "run_id": "r", "kind": "dataloader", "num_workers": 3, "prefetch_factor": 3,
                      "from_num_workers": 2, "from_prefetch_factor": 2, "classification": "data-bound",
                      "max_workers": 15, "reason": "data-bound: num_workers 2→3 and prefetch_factor 2→3"}
        list(al)
        self.assertEqual((al.loader.num_workers, al.loader.prefetch_factor), (12, 6))
        self.assertEqual(al.adjustments[0]["num_workers"], 12)
        # The CPU bound caps the increase.
        run.latest = dict(run.latest, num_workers=5, prefetch_factor=4, from_num_workers=3, from_prefetch_factor=3)
        list(al)
        self.assertEqual((al.loader.num_workers, al.loader.prefetch_factor), (15, 8))
        # A memory-bound reduction 4→3 prefetch on a loader at 8: down, by the same ratio.
        run.latest = {"event": "advice", "run_id": "r", "kind": "dataloader", "num_workers": 5, "prefetch_factor": 3,
                      "from_num_workers": 5, "from_prefetch_factor": 4, "classification": "memory-bound", "max_workers": 15}
        list(al)
        self.assertEqual((al.loader.num_workers, al.loader.prefetch_factor), (15, 6))

    def test_advice_without_baseline_against_its_class_is_refused(self):
        # An older collector sends no from_*: an advice for a data-bound run
        # that would cut the loader's workers is not applied.
        run = AdviceRun()
        al = trainmeter.AdaptiveLoader(FakeDataLoader("ds", batch_size=4, num_workers=8, prefetch_factor=4), run)
        first = al.loader
        run.latest = {"event": "advice", "run_id": "r", "kind": "dataloader", "num_workers": 3, "prefetch_factor": 3,
                      "classification": "data-bound"}
        with self.assertLogs("trainmeter", level="WARNING"):
            list(al)
        self.assertIs(al.loader, first)
        self.assertEqual(al.adjustments, [])
        # Going the advised way, the absolute values are kept.
        self.assertEqual(tl.advised_settings(
            {"kind": "dataloader", "num_workers": 10, "prefetch_factor": 3, "classification": "data-bound"}, 8, 4), (10, None))

    def test_advised_settings_when_the_loader_matches_the_baseline(self):
        adv = {"kind": "dataloader", "num_workers": 6, "prefetch_factor": 3, "from_num_workers": 4,
               "from_prefetch_factor": 2, "classification": "data-bound", "max_workers": 15}
        self.assertEqual(tl.advised_settings(adv, 4, 2), (6, 3))
        # From no workers (PyTorch keeps prefetch_factor None then: 2 with workers).
        adv = dict(adv, num_workers=1, from_num_workers=0, prefetch_factor=3, from_prefetch_factor=2)
        self.assertEqual(tl.advised_settings(adv, 0, None), (1, 3))
        # Memory-bound down to no workers.
        adv = {"kind": "dataloader", "num_workers": 0, "prefetch_factor": 1, "from_num_workers": 1,
               "from_prefetch_factor": 1, "classification": "memory-bound"}
        self.assertEqual(tl.advised_settings(adv, 1, 1), (0, 1))
        self.assertEqual(tl.advised_settings(None, 1, 1), (None, None))

    def test_broken_run_never_raises(self):
        class Broken:
            def advice(self):
                raise RuntimeError("boom")
        al = trainmeter.AdaptiveLoader(FakeDataLoader("ds"), Broken())
        self.assertEqual(list(al), [0, 1, 2])
        self.assertEqual(al.adjustments, [])


class TestRebuild(unittest.TestCase):
    def test_rebuild_with_advice(self):
        s = FakeSampler()
        dl = FakeDataLoader("ds", batch_size=8, sampler=s, num_workers=2, prefetch_factor=2, drop_last=True,
                            pin_memory=True, persistent_workers=True, worker_init_fn=print, timeout=5,
                            multiprocessing_context="spawn", generator="g", collate_fn=len, pin_memory_device="cuda")
        new = trainmeter.rebuild_dataloader(
            dl, {"event": "advice", "run_id": "r", "kind": "dataloader", "num_workers": 10, "prefetch_factor": 4, "reason": "x"})
        self.assertIsNot(new, dl)
        self.assertIs(type(new), FakeDataLoader)
        self.assertEqual(new.dataset, "ds")
        self.assertIs(new.sampler, s)
        self.assertEqual((new.num_workers, new.prefetch_factor, new.batch_size, new.drop_last), (10, 4, 8, True))
        self.assertEqual((new.pin_memory, new.persistent_workers, new.worker_init_fn, new.timeout), (True, True, print, 5))
        self.assertEqual((new.multiprocessing_context, new.generator, new.collate_fn, new.pin_memory_device),
                         ("spawn", "g", len, "cuda"))

    def test_agent_advice_with_prefetch_zero_keeps_prefetch(self):
        dl = FakeDataLoader("ds", batch_size=4, num_workers=2, prefetch_factor=3)
        self.assertIs(trainmeter.rebuild_dataloader(dl, {"kind": "dataloader", "num_workers": 2, "prefetch_factor": 0}), dl)
        new = trainmeter.rebuild_dataloader(dl, {"kind": "dataloader", "num_workers": 8, "prefetch_factor": 0})
        self.assertEqual((new.num_workers, new.prefetch_factor), (8, 3))

    def test_to_zero_workers_drops_worker_only_options(self):
        dl = FakeDataLoader("ds", batch_size=4, num_workers=4, prefetch_factor=8, persistent_workers=True,
                            multiprocessing_context="fork")
        new = trainmeter.rebuild_dataloader(dl, num_workers=0)
        self.assertEqual((new.num_workers, new.prefetch_factor, new.persistent_workers, new.multiprocessing_context),
                         (0, None, False, None))

    def test_from_zero_workers(self):
        dl = FakeDataLoader("ds", batch_size=4)
        new = trainmeter.rebuild_dataloader(dl, {"kind": "dataloader", "num_workers": 6})
        self.assertEqual((new.num_workers, new.prefetch_factor), (6, 2))

    def test_custom_batch_sampler_kept(self):
        dl = FakeDataLoader("ds", batch_sampler="my-bs", num_workers=1)
        new = trainmeter.rebuild_dataloader(dl, num_workers=3, prefetch_factor=3)
        self.assertEqual(new.batch_sampler, "my-bs")
        self.assertEqual((new.num_workers, new.prefetch_factor, new.batch_size), (3, 3, None))

    def test_iterable_dataset_gets_no_sampler(self):
        dl = FakeDataLoader("stream", batch_size=2, sampler=_InfiniteConstantSampler())
        new = trainmeter.rebuild_dataloader(dl, num_workers=2)
        self.assertIsNone(new.kwargs["sampler"])
        self.assertEqual((new.num_workers, new.batch_size), (2, 2))

    def test_unchanged_or_unusable_returns_same_loader(self):
        dl = FakeDataLoader("ds", batch_size=4, num_workers=2, prefetch_factor=2)
        self.assertIs(trainmeter.rebuild_dataloader(dl, None), dl)
        self.assertIs(trainmeter.rebuild_dataloader(dl, {"kind": "dataloader", "num_workers": 2, "prefetch_factor": 2}), dl)
        self.assertIs(trainmeter.rebuild_dataloader(dl, {"kind": "batch_size", "num_workers": 9}), dl)
        self.assertIs(trainmeter.rebuild_dataloader(dl, {"num_workers": "lots"}), dl)

        class Broken(FakeDataLoader):
            def __init__(self, *a, **k):
                if k:
                    raise TypeError("no")
                FakeDataLoader.__init__(self, "ds")

        b = Broken()
        self.assertIs(trainmeter.rebuild_dataloader(b, {"num_workers": 4}), b)  # never raises
        lst = [1, 2, 3]
        self.assertIs(trainmeter.rebuild_dataloader(lst, {"num_workers": 4}), lst)  # no .dataset

    def test_timed_loader_rebuilt_and_reattached(self):
        class FakeRun:
            def __init__(self):
                self.attached = []

            def attach_loader(self, l):
                self.attached.append(l)

        run = FakeRun()
        dl = FakeDataLoader("ds", batch_size=4, num_workers=1)
        timed = trainmeter.TimedLoader(dl, run=run)
        self.assertIs(trainmeter.rebuild_dataloader(timed, None), timed)
        new = trainmeter.rebuild_dataloader(timed, {"kind": "dataloader", "num_workers": 5})
        self.assertIsInstance(new, trainmeter.TimedLoader)
        self.assertEqual(new.loader.num_workers, 5)
        self.assertEqual(run.attached, [timed, new])
        self.assertEqual(list(new), [0, 1, 2])


class TestCountTokens(unittest.TestCase):
    def test_count(self):
        class T:
            def __init__(self, n, s):
                self.n, self.s = n, s

            def numel(self):
                return self.n

            def sum(self):
                return self

            def item(self):
                return self.s

        self.assertEqual(trainmeter.count_tokens({"input_ids": T(64, 0), "attention_mask": T(64, 50)}), 64)
        self.assertEqual(trainmeter.count_tokens({"input_ids": T(64, 0), "attention_mask": T(64, 50)}, non_padding=True), 50)
        self.assertEqual(trainmeter.count_tokens({"attention_mask": [[1, 1, 0], [1, 0, 0]]}, non_padding=True), 3)
        self.assertEqual(trainmeter.count_tokens({"input_ids": [[1, 2, 3], [4, 5, 6]]}), 6)
        self.assertIsNone(trainmeter.count_tokens(("x", "y")))
        self.assertIsNone(trainmeter.count_tokens({"pixels": 1}))


# --------------------------------------------------------------- DDP / GPUs


SMI = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaaaaaa-0000-0000-0000-000000000000)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbbbbbb-0000-0000-0000-000000000000)
  MIG 1g.10gb     Device  0: (UUID: MIG-cccccccc-0000-0000-0000-000000000000)
GPU 2: NVIDIA H100 80GB HBM3 (UUID: GPU-dddddddd-0000-0000-0000-000000000000)
"""
UA, UB, UD = ("GPU-%s-0000-0000-0000-000000000000" % (c * 8) for c in "abd")


class TestDist(Base):
    def test_rank_info(self):
        self.assertEqual(dist.rank_info({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "x"}), {"rank": 3, "world_size": 8})

    def test_derive_run_id(self):
        self.assertIsNone(dist.derive_run_id(env={}))
        self.assertIsNone(dist.derive_run_id(env={"WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "abc"}))
        self.assertEqual(dist.derive_run_id(env={"WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "5c6a-1f"}), "te-5c6a-1f")
        self.assertEqual(dist.derive_run_id(4, env={"TORCHELASTIC_RUN_ID": "my job/1"}), "te-my_job_1")
        self.assertEqual(dist.derive_run_id(env={"WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "77",
                                                 "SLURM_STEP_ID": "0"}), "slurm-77.0")
        base = {"WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
        a = dist.derive_run_id(env=dict(base, RANK="0", LOCAL_RANK="0"))
        b = dist.derive_run_id(env=dict(base, RANK="1", LOCAL_RANK="1"))
        self.assertEqual(a, b)  # ranks agree (same launcher = our parent here)
        self.assertRegex(a, r"^ddp-[^-]+.*-[0-9a-f]{12}$")
        self.assertNotEqual(a, dist.derive_run_id(env=dict(base, MASTER_PORT="29501")))
        # mp.spawn / Lightning style (no torchelastic): keyed on the process group
        c = dist.derive_run_id(env={"WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
        self.assertTrue(c.startswith("ddp-"))
        self.assertNotEqual(c, a)

    def test_slurm_job_run_id(self):
        # The agent's run of the job: slurm-<cluster>-<job>, on every rank.
        self.assertIsNone(dist.slurm_job_run_id(env={}))
        self.assertIsNone(dist.slurm_job_run_id(env={"SLURM_JOB_ID": "x"}))
        self.assertEqual(dist.slurm_job_run_id(env={"SLURM_JOB_ID": "812", "SLURM_CLUSTER_NAME": "hpc one"}), "slurm-hpc_one-812")
        self.assertEqual(dist.slurm_job_run_id(env={"SLURM_JOB_ID": "812"}), "slurm-812")

    def test_run_in_slurm_job_joins_the_jobs_run(self):
        self.agent()
        os.environ.update(SLURM_JOB_ID="4242", SLURM_CLUSTER_NAME="tm", WORLD_SIZE="2", TORCHELASTIC_RUN_ID="abc")
        self.assertEqual(self.start().run_id, "slurm-tm-4242")
        os.environ["TRAINMETER_RUN_ID"] = "mine"  # a run of its own, named: kept
        self.assertEqual(self.start().run_id, "mine")

    def test_run_uses_derived_id_and_rank_keys(self):
        a = self.agent()
        os.environ.update(WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", TORCHELASTIC_RUN_ID="abc123")
        run = self.start()
        self.assertEqual(run.run_id, "te-abc123")
        run.step(tokens=5)
        run.end()
        self.assertTrue(a.wait_eof(0))
        os.environ["TRAINMETER_RUN_ID"] = "explicit"
        self.assertEqual(self.start().run_id, "explicit")
        self.assertEqual(
            without_client_id(a.events(0)),
            [
                {"event": "run_start", "run_id": "te-abc123", "rank": 1, "world_size": 2, "local_rank": 1, "gpus": [1]},
                {"event": "step", "run_id": "te-abc123", "step": 1, "tokens": 5, "tokens_total": 5},
                {"event": "run_end", "run_id": "te-abc123"},
            ],
        )

    def rank_start(self, **kw):
        a = self.agent()
        run = self.start(run_id="lr", **kw)
        run.end()
        self.assertTrue(a.wait_eof(0))
        return without_client_id(a.events(0))[0]

    def test_local_rank_names_the_gpu(self):
        # torchrun: LOCAL_RANK set, CUDA_VISIBLE_DEVICES not; without a GPU
        # named the agent would give the rank every GPU of the node.
        self.fake_smi("exit 3\n")
        os.environ.update(WORLD_SIZE="2", RANK="1", LOCAL_RANK="1")
        with self.assertLogs("trainmeter", "INFO") as logs:
            ev = self.rank_start()
        self.assertEqual(ev["gpus"], [1])
        self.assertNotIn("cuda_visible_devices", ev)
        self.assertTrue(any("reporting GPU 1 (LOCAL_RANK=1" in m for m in logs.output), logs.output)
        # With nvidia-smi (same GPU models): the rank's GPU as its UUID.
        self.fake_smi("cat <<'EOF'\n%sEOF\n" % SMI)
        self.assertEqual(self.rank_start()["gpus"], [UB])

    def test_local_rank_gives_way(self):
        self.fake_smi("exit 3\n")
        os.environ.update(WORLD_SIZE="2", LOCAL_RANK="1")
        self.assertEqual(self.rank_start(gpus=[0, 1])["gpus"], [0, 1])  # named by the script
        os.environ["CUDA_VISIBLE_DEVICES"] = "3"
        ev = self.rank_start()
        self.assertNotIn("gpus", ev)  # the agent reads cuda_visible_devices
        self.assertEqual(ev["cuda_visible_devices"], "3")
        del os.environ["CUDA_VISIBLE_DEVICES"], os.environ["LOCAL_RANK"]
        self.assertNotIn("gpus", self.rank_start())  # a single process may use every GPU

    def test_torch_current_device(self):
        class Cuda:
            def __init__(self, cur, initialized=True):
                self.cur, self.initialized = cur, initialized

            def is_available(self):
                return True

            def is_initialized(self):
                return self.initialized

            def current_device(self):
                if not self.initialized:
                    raise AssertionError("must not initialise CUDA")
                return self.cur

        env = {"LOCAL_RANK": "1"}
        cases = [
            (None, (1, "LOCAL_RANK=1")),
            (Cuda(5), (5, "torch.cuda.current_device()")),  # set_device(5): a launcher's own mapping
            (Cuda(1), (1, "LOCAL_RANK=1 = torch.cuda.current_device()")),
            (Cuda(0), (1, "LOCAL_RANK=1")),  # model.to(local_rank) without set_device
            (Cuda(5, initialized=False), (1, "LOCAL_RANK=1")),
        ]
        for cuda, want in cases:
            mods = {"torch": types.SimpleNamespace(cuda=cuda)} if cuda is not None else {}
            with mock.patch.dict(sys.modules, mods):
                if cuda is None:
                    sys.modules.pop("torch", None)
                self.assertEqual(dist.rank_gpu(env=env), want)
        self.assertEqual(dist.rank_gpu(local_rank=2, env={}), (2, "LOCAL_RANK=2"))
        self.assertIsNone(dist.rank_gpu(env={}))
        self.assertIsNone(dist.rank_gpu(env={"LOCAL_RANK": "x"}))

    def test_parse_nvidia_smi(self):
        self.assertEqual(dist.parse_nvidia_smi_l(SMI), [(0, "NVIDIA H100 80GB HBM3", UA), (1, "NVIDIA H100 80GB HBM3", UB),
                                                         (2, "NVIDIA H100 80GB HBM3", UD)])
        self.assertIsNone(dist.parse_nvidia_smi_l("No devices were found\n"))

    def test_cuda_visible_mapping(self):
        table = dist.parse_nvidia_smi_l(SMI)
        m = dist.cuda_visible_gpu_uuids
        self.assertEqual(m("2,0", table, env={}), [UD, UA])
        self.assertEqual(m("GPU-bbbb", table, env={}), [UB])  # prefix completed
        for bad in ("", "-1", "0,7", "0,,1", "MIG-cccccccc", "GPU-", "x", "0,0"):
            self.assertIsNone(m(bad, table, env={}), bad)
        mixed = [(0, "NVIDIA A100", UA), (1, "NVIDIA H100", UB)]
        self.assertIsNone(m("0", mixed, env={}))  # CUDA fastest-first order may differ
        self.assertEqual(m("1", mixed, env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}), [UB])
        self.assertEqual(m("GPU-aaaa", mixed, env={}), [UA])  # UUIDs need no ordering

    def fake_smi(self, body):
        bindir = os.path.join(self.dir, "bin")
        os.makedirs(bindir, exist_ok=True)
        path = os.path.join(bindir, "nvidia-smi")
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + body)
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
        p = mock.patch.object(dist, "_table_cache", None)
        p.start()
        self.addCleanup(p.stop)
        q = mock.patch.object(dist, "_from_pynvml", lambda: None)
        q.start()
        self.addCleanup(q.stop)

    def test_run_start_sends_uuids_from_nvidia_smi(self):
        self.fake_smi("cat <<'EOF'\n%sEOF\n" % SMI)
        a = self.agent()
        os.environ["CUDA_VISIBLE_DEVICES"] = "1,2"
        run = self.start(run_id="g")
        run.end()
        self.assertTrue(a.wait_eof(0))
        ev = without_client_id(a.events(0))[0]
        self.assertEqual(ev, {"event": "run_start", "run_id": "g", "cuda_visible_devices": "1,2", "gpus": [UB, UD]})
        # cached: a second run does not run nvidia-smi again
        self.fake_smi("exit 1\n")
        dist._table_cache = (True, dist.parse_nvidia_smi_l(SMI))
        self.assertEqual(dist.cuda_visible_gpu_uuids("0"), [UA])

    def test_no_mapping_when_gpus_given_or_disabled_or_smi_fails(self):
        self.fake_smi("exit 3\n")
        a = self.agent()
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
        for kw in ({"gpus": [0]}, {"gpu_uuids": False}, {}):
            run = self.start(run_id="n", **kw)
            run.end()
        self.assertTrue(a.wait_eof(2))
        starts = [without_client_id(a.events(i))[0] for i in range(3)]
        self.assertEqual(starts[0], {"event": "run_start", "run_id": "n", "gpus": [0], "cuda_visible_devices": "0"})
        self.assertEqual(starts[1], {"event": "run_start", "run_id": "n", "cuda_visible_devices": "0"})
        self.assertEqual(starts[2], {"event": "run_start", "run_id": "n", "cuda_visible_devices": "0"})

    def test_hanging_nvidia_smi_is_bounded(self):
        self.fake_smi("exec sleep 30\n")
        with mock.patch.object(dist, "_NVIDIA_SMI_TIMEOUT_S", 0.2):
            t0 = time.monotonic()
            self.assertIsNone(dist.cuda_visible_gpu_uuids("0", env={}))
            self.assertLess(time.monotonic() - t0, 5)
            # and start() itself returns at once: mapping runs on the sender thread
            t0 = time.monotonic()
            dist._table_cache = None
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
            run = self.start(run_id="h")
            self.assertLess(time.monotonic() - t0, 0.15 + 0.9)
            run.end(timeout=0.1)


# --------------------------------------------------------------- Hugging Face


class NS:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class Tensor:
    """A parameter: numel() elements (ds_numel: a DeepSpeed ZeRO-3 partition)."""

    def __init__(self, n, ds_numel=None):
        self.n = n
        if ds_numel is not None:
            self.ds_numel = ds_numel

    def numel(self):
        return self.n


class Module:
    """parameters() as torch yields them: each tensor once, a tied one too."""

    def __init__(self, *sizes):
        self.tensors = [Tensor(n) for n in sizes]

    def parameters(self):
        # torch dedups tied weights itself; yield one twice to check ours too
        return iter(self.tensors + self.tensors[:1])


def hf_args(**kw):
    d = dict(per_device_train_batch_size=8, gradient_accumulation_steps=4, seed=42, bf16=True, fp16=False,
             optim=NS(value="adamw_torch_fused"), dataloader_num_workers=6, dataloader_prefetch_factor=None,
             include_num_input_tokens_seen=False, process_index=0, world_size=1, local_process_index=0)
    d.update(kw)
    return NS(**d)


class TestHF(Base):
    def drive(self, cb, args, state, control, clk, seen=(), metrics=None):
        model = NS(config=NS(_name_or_path="meta-llama/Llama-3-8B"))
        cb.on_init_end(args, state, control)
        cb.on_train_begin(args, state, control, model=model)
        for i, s in enumerate(seen, start=1):
            clk.t += 0.25  # data wait
            cb.on_step_begin(args, state, control)
            clk.t += 1.0  # compute
            state.global_step = i
            state.num_input_tokens_seen = s
            cb.on_step_end(args, state, control)
        if metrics is not None:
            state.epoch = 1.0
            cb.on_evaluate(args, state, control, metrics=metrics)
        cb.on_train_end(args, state, control)

    def test_full_run(self):
        a = self.agent()
        clk = Clock()
        cb = hf.TrainmeterCallback(run_id="hf1", socket_path=self.sock, gpu_price_per_hour=2.5, reconnect_min_s=0.05)
        cb._clock = clk
        args = hf_args()
        state = NS(global_step=0, max_steps=100, num_input_tokens_seen=0, is_world_process_zero=True, epoch=0.0)
        control = NS(should_training_stop=False)
        self.drive(cb, args, state, control, clk, seen=(4096, 8192), metrics={"eval_loss": 1.5, "eval_accuracy": 0.5, "epoch": 1.0})
        self.runs.append(cb.run)
        self.assertTrue(args.include_num_input_tokens_seen)  # turned on for us
        self.assertTrue(a.wait_eof(0))
        self.assertEqual(
            without_client_id(a.events(0)),
            [
                {"event": "run_start", "run_id": "hf1", "backend": "transformers", "model": "meta-llama/Llama-3-8B",
                 "batch_size": 8, "grad_accum": 4, "seed": 42, "num_workers": 6, "precision": "bf16",
                 "optimizer": "adamw_torch_fused", "planned_steps": 100, "gpu_price_per_hour": 2.5},
                {"event": "step", "run_id": "hf1", "step": 1, "tokens": 4096, "tokens_total": 4096, "samples": 32,
                 "compute_s": 1.0},
                {"event": "step", "run_id": "hf1", "step": 2, "tokens": 4096, "tokens_total": 8192, "samples": 32,
                 "data_wait_s": 0.25, "compute_s": 1.0},
                {"event": "eval", "run_id": "hf1", "epoch": 1, "val_loss": 1.5, "accuracy": 0.5, "num_workers": 6},
                {"event": "run_end", "run_id": "hf1"},
            ],
        )
        self.assertFalse(control.should_training_stop)

    def test_ddp_rank_share_and_no_eval_off_main(self):
        a = self.agent()
        clk = Clock()
        os.environ.update(TORCHELASTIC_RUN_ID="job9")
        cb = hf.TrainmeterCallback(socket_path=self.sock, model="m", reconnect_min_s=0.05)
        cb._clock = clk
        args = hf_args(process_index=1, world_size=2, local_process_index=1, fp16=True, bf16=False, optim="adafactor")
        state = NS(global_step=0, max_steps=0, num_input_tokens_seen=0, is_world_process_zero=False, epoch=0.0)
        control = NS(should_training_stop=False)
        # HF gathers num_input_tokens_seen over ranks: 1001 then 2000 more
        self.drive(cb, args, state, control, clk, seen=(1001, 3001), metrics={"eval_loss": 2.0})
        self.runs.append(cb.run)
        self.assertTrue(a.wait_eof(0))
        evs = without_client_id(a.events(0))
        self.assertEqual(evs[0]["run_id"], "te-job9")
        self.assertEqual((evs[0]["precision"], evs[0]["optimizer"], evs[0]["model"]), ("fp16", "adafactor", "m"))
        self.assertEqual((evs[0]["rank"], evs[0]["world_size"], evs[0]["local_rank"]), (1, 2, 1))
        self.assertEqual([e["tokens"] for e in evs if e["event"] == "step"], [500, 1000])  # rank 1's shares
        self.assertEqual([e["event"] for e in evs], ["run_start", "step", "step", "run_end"])  # eval only on rank 0
        from trainmeter.integrations._common import share

        self.assertEqual([share(1001, 2, r) for r in (0, 1)], [501, 500])
        self.assertEqual([share(10, 4, r) for r in range(4)], [4, 2, 2, 2])

    def test_tokens_per_step_and_stop(self):
        a = self.agent()
        clk = Clock()
        cb = hf.TrainmeterCallback(run_id="hf3", socket_path=self.sock, tokens_per_step=1000, reconnect_min_s=0.05)
        cb._clock = clk
        args = hf_args()
        state = NS(global_step=0, max_steps=10, num_input_tokens_seen=0, is_world_process_zero=True, epoch=0.0)
        control = NS(should_training_stop=False)
        cb.on_train_begin(args, state, control, model=None)
        self.runs.append(cb.run)
        self.assertFalse(args.include_num_input_tokens_seen)  # not needed: tokens_per_step given
        cb.on_step_begin(args, state, control)
        state.global_step = 1
        cb.on_step_end(args, state, control)
        self.assertTrue(a.wait_lines(0, 2))
        a.send({"event": "stop", "run_id": "hf3", "reason": "budget m exceeded (100%)"})
        self.assertTrue(self.wait(cb.run.should_stop))
        cb.on_step_begin(args, state, control)
        state.global_step = 2
        cb.on_step_end(args, state, control)
        self.assertTrue(control.should_training_stop)
        cb.on_train_end(args, state, control)
        self.assertTrue(a.wait_eof(0))
        evs = a.events(0)
        self.assertEqual([e.get("tokens") for e in evs if e["event"] == "step"], [1000, 1000])
        self.assertEqual(evs[-1], {"event": "run_end", "run_id": "hf3", "status": "stopped"})

    def test_user_run_not_ended_and_no_tokens_warns(self):
        a = self.agent()
        run = self.start(run_id="mine")
        cb = hf.TrainmeterCallback(run=run, count_input_tokens=False)
        args, state, control = hf_args(), NS(global_step=0), NS(should_training_stop=False)
        cb.on_train_begin(args, state, control)
        cb.on_step_begin(args, state, control)
        state.global_step = 1
        with self.assertLogs("trainmeter", "WARNING"):
            cb.on_step_end(args, state, control)
        cb.on_train_end(args, state, control)
        self.assertFalse(run.ended)
        self.assertTrue(a.wait_lines(0, 2))
        self.assertEqual(a.events(0)[1]["tokens"], 0)

    def test_params_and_logged_loss(self):
        a = self.agent()
        clk = Clock()
        cb = hf.TrainmeterCallback(run_id="hf4", socket_path=self.sock, tokens_per_step=100, reconnect_min_s=0.05)
        cb._clock = clk
        args, state = hf_args(), NS(global_step=0, max_steps=3, num_input_tokens_seen=0, is_world_process_zero=True, epoch=0.0)
        control = NS(should_training_stop=False, should_log=False)
        cb.on_train_begin(args, state, control, model=Module(4096, 4096, 1000))
        self.runs.append(cb.run)
        for step, should_log, logs in ((1, False, None), (2, True, {"loss": 2.25, "learning_rate": 1e-4, "epoch": 0.5}),
                                       (3, True, None)):
            cb.on_step_begin(args, state, control)
            state.global_step = step
            control.should_log = should_log  # set by the Trainer's DefaultFlowCallback, which runs first
            cb.on_step_end(args, state, control)
            if logs is not None:
                cb.on_log(args, state, control, logs=logs)
        # Step 3's log never came (e.g. logging disabled): sent at the end, without loss.
        cb.on_train_end(args, state, control)
        self.assertTrue(a.wait_eof(0))
        evs = without_client_id(a.events(0))
        self.assertEqual(evs[0]["params"], 9192)  # the tensor yielded twice, once
        steps = [e for e in evs if e["event"] == "step"]
        self.assertEqual([(e["step"], e.get("loss")) for e in steps], [(1, None), (2, 2.25), (3, None)])
        self.assertEqual([e["event"] for e in evs], ["run_start", "step", "step", "step", "run_end"])

    def test_params_keyword_wins(self):
        a = self.agent()
        cb = hf.TrainmeterCallback(run_id="hf5", socket_path=self.sock, params=7_000_000_000, reconnect_min_s=0.05)
        state = NS(global_step=0, max_steps=1, num_input_tokens_seen=0, is_world_process_zero=True, epoch=0.0)
        cb.on_train_begin(hf_args(), state, NS(should_training_stop=False), model=Module(10))
        cb.on_train_end(hf_args(), state, NS(should_training_stop=False))
        self.assertTrue(a.wait_eof(0))
        self.assertEqual(a.events(0)[0]["params"], 7_000_000_000)

    def wait(self, pred, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return True
            time.sleep(0.01)
        return pred()


# --------------------------------------------------------------- Lightning


class FakeTrainer:
    def __init__(self, **kw):
        self.global_step = 0
        self.precision = "bf16-mixed"
        self.accumulate_grad_batches = 2
        self.max_steps = -1
        self.estimated_stepping_batches = 50
        self.train_dataloader = NS(num_workers=4, prefetch_factor=2, batch_size=2)
        self.global_rank, self.world_size, self.local_rank = 0, 1, 0
        self.is_global_zero = True
        self.sanity_checking = False
        self.callback_metrics = {}
        self.current_epoch = 0
        self.should_stop = False
        self.__dict__.update(kw)


class Scalar:
    def __init__(self, v):
        self.v = v

    def item(self):
        return self.v

    def detach(self):
        return self


class TestLightning(Base):
    def batch(self):
        return {"input_ids": [[1] * 16, [2] * 16]}

    def run_batches(self, cb, trainer, clk, n, losses=None):
        module = NS(hparams={"model_name": "gpt2-small"})
        for i in range(n):
            clk.t += 0.5  # fetch
            cb.on_train_batch_start(trainer, module, self.batch(), i)
            clk.t += 1.0
            if (i + 1) % trainer.accumulate_grad_batches == 0:
                trainer.global_step += 1
            cb.on_train_batch_end(trainer, module, {"loss": Scalar(3.0 - i)}, self.batch(), i)

    def test_full_fit(self):
        a = self.agent()
        clk = Clock()
        os.environ["PL_GLOBAL_SEED"] = "7"
        cb = lightning.TrainmeterCallback(run_id="pl1", socket_path=self.sock, reconnect_min_s=0.05)
        cb._clock = clk
        trainer = FakeTrainer()
        module = NS(hparams={"model_name": "gpt2-small"})
        trainer.sanity_checking = True
        cb.on_validation_end(trainer, module)  # sanity check: no run yet, no eval
        trainer.sanity_checking = False
        cb.on_train_start(trainer, module)
        self.runs.append(cb.run)
        self.run_batches(cb, trainer, clk, 4)
        cb.on_validation_start(trainer, module)
        clk.t += 30  # validation time is not data wait
        trainer.callback_metrics = {"val_loss": Scalar(1.25), "val_acc": Scalar(0.75), "train_loss": Scalar(9)}
        cb.on_validation_end(trainer, module)
        self.run_batches(cb, trainer, clk, 1)  # half an accumulation, flushed at the end
        cb.on_train_end(trainer, module)
        self.assertTrue(a.wait_eof(0))
        self.assertEqual(
            without_client_id(a.events(0)),
            [
                {"event": "run_start", "run_id": "pl1", "backend": "lightning", "model": "gpt2-small", "precision": "bf16",
                 "grad_accum": 2, "planned_steps": 50, "seed": 7, "num_workers": 4, "prefetch_factor": 2, "batch_size": 2},
                {"event": "step", "run_id": "pl1", "step": 1, "tokens": 64, "tokens_total": 64, "samples": 4,
                 "data_wait_s": 0.5, "compute_s": 2.0, "loss": 2.0},
                {"event": "step", "run_id": "pl1", "step": 2, "tokens": 64, "tokens_total": 128, "samples": 4,
                 "data_wait_s": 1.0, "compute_s": 2.0, "loss": 0.0},
                {"event": "eval", "run_id": "pl1", "epoch": 1, "val_loss": 1.25, "accuracy": 0.75, "num_workers": 4,
                 "prefetch_factor": 2},
                {"event": "step", "run_id": "pl1", "step": 2, "tokens": 32, "tokens_total": 160, "samples": 2,
                 "compute_s": 1.0, "loss": 3.0},
                {"event": "run_end", "run_id": "pl1"},
            ],
        )

    def test_eval_epoch_is_epochs_completed(self):
        # Lightning's current_epoch is 0-based and still the epoch just
        # trained when its end-of-epoch validation runs: 1 epoch completed.
        self.assertEqual(lightning._epochs_completed(FakeTrainer(current_epoch=0)), 1)
        self.assertEqual(lightning._epochs_completed(FakeTrainer(current_epoch=4, is_last_batch=True)), 5)
        # A validation in the middle of the 5th epoch: 4 completed.
        self.assertEqual(lightning._epochs_completed(FakeTrainer(current_epoch=4, is_last_batch=False)), 4)
        self.assertIsNone(lightning._epochs_completed(FakeTrainer(current_epoch=None)))

    def test_stop_tokens_fn_ranks_and_exception(self):
        a = self.agent()
        clk = Clock()
        cb = lightning.TrainmeterCallback(run_id="pl2", socket_path=self.sock, tokens_fn=lambda b: 10,
                                          reconnect_min_s=0.05)
        cb._clock = clk
        trainer = FakeTrainer(accumulate_grad_batches=1, max_steps=9, precision="16-mixed", global_rank=3,
                              world_size=4, local_rank=1, is_global_zero=False, train_dataloader=None)
        module = NS(hparams={})
        cb.on_train_start(trainer, module)
        self.runs.append(cb.run)
        self.run_batches(cb, trainer, clk, 1)
        self.assertTrue(a.wait_lines(0, 2))
        a.send({"event": "stop", "run_id": "pl2", "reason": "budget"})
        deadline = time.monotonic() + 5
        while not cb.run.should_stop() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.run_batches(cb, trainer, clk, 1)
        self.assertTrue(trainer.should_stop)
        trainer.callback_metrics = {"val_loss": Scalar(1.0)}
        cb.on_validation_end(trainer, module)  # not global zero: no eval
        cb.on_exception(trainer, module, KeyboardInterrupt())
        self.assertTrue(a.wait_eof(0))
        evs = without_client_id(a.events(0))
        self.assertEqual(evs[0], {"event": "run_start", "run_id": "pl2", "backend": "lightning", "model": "NS",
                                  "precision": "fp16", "grad_accum": 1, "planned_steps": 9, "rank": 3, "world_size": 4,
                                  "local_rank": 1, "gpus": [1]})
        self.assertEqual([e["tokens"] for e in evs if e["event"] == "step"], [10, 10])
        self.assertEqual([e["event"] for e in evs], ["run_start", "step", "step", "run_end"])
        self.assertEqual(evs[-1], {"event": "run_end", "run_id": "pl2", "status": "error", "error": "KeyboardInterrupt"})

    def test_tokens_per_step_counts_optimizer_steps(self):
        # The same option, and meaning, as the HF callback's: this rank's
        # tokens per optimizer step, whatever the micro-batches.
        a = self.agent()
        cb = lightning.TrainmeterCallback(run_id="pl5", socket_path=self.sock, tokens_per_step=100, reconnect_min_s=0.05)
        cb._clock = Clock()
        trainer = FakeTrainer()  # 2 micro-batches per optimizer step
        cb.on_train_start(trainer, NS(hparams={}))
        self.runs.append(cb.run)
        self.run_batches(cb, trainer, cb._clock, 5)  # 2 steps and half of a third
        cb.on_train_end(trainer, NS(hparams={}))
        self.assertTrue(a.wait_eof(0))
        self.assertEqual([e["tokens"] for e in a.events(0) if e["event"] == "step"], [100, 100, 50])

    def test_params_and_logged_loss(self):
        a = self.agent()
        clk = Clock()
        cb = lightning.TrainmeterCallback(run_id="pl3", socket_path=self.sock, tokens_per_step=10, reconnect_min_s=0.05)
        cb._clock = clk
        trainer = FakeTrainer(accumulate_grad_batches=1)
        module = Module(1000, 24)
        module.hparams = {}
        module.tensors.append(Tensor(0, ds_numel=500))  # a ZeRO-3 partition
        cb.on_train_start(trainer, module)
        self.runs.append(cb.run)
        cb.on_train_batch_start(trainer, module, self.batch(), 0)
        trainer.global_step = 1
        cb.on_train_batch_end(trainer, module, {"loss": Scalar(2.5)}, self.batch(), 0)
        # Manual optimisation: training_step returned nothing; the module logged train_loss.
        trainer.callback_metrics = {"train_loss": Scalar(2.0)}
        cb.on_train_batch_start(trainer, module, self.batch(), 1)
        trainer.global_step = 2
        cb.on_train_batch_end(trainer, module, None, self.batch(), 1)
        cb.on_train_end(trainer, module)
        self.assertTrue(a.wait_eof(0))
        evs = without_client_id(a.events(0))
        self.assertEqual(evs[0]["params"], 1524)
        self.assertEqual([e.get("loss") for e in evs if e["event"] == "step"], [2.5, 2.0])

    @unittest.skipUnless(TORCH, "torch not installed")
    def test_params_of_a_real_torch_module(self):
        import torch

        class LM(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(100, 16)
                self.body = torch.nn.Linear(16, 32)
                self.head = torch.nn.Linear(16, 100, bias=False)
                self.head.weight = self.emb.weight  # tied: counted once

        a = self.agent()
        cb = lightning.TrainmeterCallback(run_id="pl4", socket_path=self.sock, reconnect_min_s=0.05)
        cb.on_train_start(FakeTrainer(), LM())
        cb.on_train_end(FakeTrainer(), LM())
        self.assertTrue(a.wait_eof(0))
        self.assertEqual(a.events(0)[0]["params"], 100 * 16 + 16 * 32 + 32)
        hcb = hf.TrainmeterCallback(run_id="hf6", socket_path=self.sock, reconnect_min_s=0.05)
        state = NS(global_step=0, max_steps=1, num_input_tokens_seen=0, is_world_process_zero=True, epoch=0.0)
        hcb.on_train_begin(hf_args(), state, NS(should_training_stop=False), model=LM())
        hcb.on_train_end(hf_args(), state, NS(should_training_stop=False))
        self.assertTrue(a.wait_eof(1))
        self.assertEqual(a.events(1)[0]["params"], 100 * 16 + 16 * 32 + 32)

    def test_precision_names(self):
        p = lightning.precision_name
        self.assertEqual([p(x) for x in ("bf16-mixed", "bf16-true", "16-mixed", 16, "32-true", 32, "64", "transformer-engine", None)],
                         ["bf16", "bf16", "fp16", "fp16", "fp32", "fp32", "fp64", "fp8", None])


_STUB_CALLBACK = """
class Callback:
    def on_train_start(self, trainer, pl_module):
        pass

    @property
    def state_key(self):
        return type(self).__qualname__
"""


class TestLightningImportOrder(unittest.TestCase):
    """The callback must be a Callback of the Lightning the Trainer comes
    from, whichever is imported first: trainmeter's module, lightning.pytorch
    or pytorch_lightning. Stand-in packages on disk, real imports, one fresh
    interpreter per order."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tm-pl-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        for pkg in ("lightning", os.path.join("lightning", "pytorch"), "pytorch_lightning"):
            os.makedirs(os.path.join(self.dir, pkg), exist_ok=True)
            with open(os.path.join(self.dir, pkg, "__init__.py"), "w") as f:
                f.write("" if pkg == "lightning" else _STUB_CALLBACK)

    def check(self, body):
        code = "import sys; sys.path[:0] = [%r, %r]\n" % (self.dir, PKG_ROOT) + textwrap.dedent(body)
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def test_trainmeter_first_then_pytorch_lightning(self):
        self.check("""
            from trainmeter.integrations.lightning import TrainmeterCallback
            import pytorch_lightning as pl
            cb = TrainmeterCallback(tokens_per_step=8)
            assert isinstance(cb, pl.Callback), type(cb).__mro__
            assert isinstance(cb, TrainmeterCallback)
            assert type(cb).on_train_start is TrainmeterCallback.on_train_start  # our hooks, not the no-ops
            assert cb.state_key == "TrainmeterCallback"
            assert "lightning.pytorch" not in sys.modules  # the other flavour is not imported for nothing
            import copy, pickle
            for twin in (pickle.loads(pickle.dumps(cb)), copy.deepcopy(cb)):
                assert isinstance(twin, pl.Callback) and twin.tokens_per_step == 8, twin
        """)

    def test_lightning_first_and_both(self):
        self.check("""
            import lightning.pytorch as L
            from trainmeter.integrations.lightning import TrainmeterCallback
            assert isinstance(TrainmeterCallback(), L.Callback)
            assert "pytorch_lightning" not in sys.modules
            import pytorch_lightning as pl
            cb = TrainmeterCallback()
            assert isinstance(cb, L.Callback) and isinstance(cb, pl.Callback)
        """)

    def test_nothing_imported_yet(self):
        self.check("""
            from trainmeter.integrations.lightning import TrainmeterCallback
            cb = TrainmeterCallback()  # imports the first Lightning found
            import lightning.pytorch as L
            assert isinstance(cb, L.Callback)
        """)


class TestImportLight(unittest.TestCase):
    def test_import_trainmeter_needs_no_frameworks(self):
        import subprocess

        code = ("import sys; sys.path.insert(0, %r); import trainmeter; "
                "bad = [m for m in ('torch', 'transformers', 'lightning', 'pytorch_lightning', 'numpy', "
                "'trainmeter.integrations.hf') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)") % PKG_ROOT
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)


if __name__ == "__main__":
    unittest.main()

"""TimedLoader and rebuild_dataloader on a real torch.utils.data.DataLoader:
workers 0 and 2, prefetch_factor, persistent_workers, a map-style and an
iterable dataset whose items take a known time to load."""

import gc
import multiprocessing
import time
import unittest

from torchenv import require_torch, torch

import trainmeter

if torch is not None:
    from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

    class SlowMap(Dataset):
        """Item i is i, after `delay` seconds (sleep: the same on a loaded machine)."""

        def __init__(self, n, delay=0.0):
            self.n, self.delay = n, delay

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.delay:
                time.sleep(self.delay)
            return i

    class SlowStream(IterableDataset):
        """0..n-1, sharded across workers so each id comes once per epoch."""

        def __init__(self, n, delay=0.0):
            self.n, self.delay = n, delay

        def __iter__(self):
            w = get_worker_info()
            start, step = (w.id, w.num_workers) if w is not None else (0, 1)
            for i in range(start, self.n, step):
                if self.delay:
                    time.sleep(self.delay)
                yield i


def ids(batch):
    return [int(x) for x in batch]


def advice(from_nw, to_nw, from_pf=2, to_pf=2):
    return {"kind": "dataloader", "classification": "data-bound", "num_workers": to_nw, "prefetch_factor": to_pf,
            "from_num_workers": from_nw, "from_prefetch_factor": from_pf, "max_workers": 8}


@require_torch
class TorchLoaderTest(unittest.TestCase):
    def tearDown(self):
        # Every worker process must be gone once the loaders are unreachable.
        gc.collect()
        deadline = time.monotonic() + 10
        while multiprocessing.active_children() and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.05)
        self.assertEqual(multiprocessing.active_children(), [], "DataLoader workers left running")

    # ------------------------------------------------------------ timings

    # The upper bounds leave as much slack as the figure itself (a sleep on a
    # loaded CI machine overruns by tens of ms): a wait that took in the
    # compute, or a compute that took in the load, would still exceed them.

    def test_timed_loader_no_workers_waits_for_every_item(self):
        delay, bs, compute = 0.05, 4, 0.2
        tl = trainmeter.TimedLoader(DataLoader(SlowMap(20, delay), batch_size=bs, num_workers=0))
        waits, computes = [], []
        for _ in tl:
            time.sleep(compute)
            w, c = tl.take_timings()
            waits.append(w)
            computes.append(c)
        self.assertEqual(len(waits), 5)
        for w in waits:  # the loop loads the batch itself: bs × delay, every step
            self.assertGreaterEqual(w, bs * delay)
            self.assertLess(w, bs * delay + compute, waits)
        for c in computes:
            self.assertGreaterEqual(c, compute)
            self.assertLess(c, compute + bs * delay, computes)
        self.assertEqual(tl.batches, 5)

    def test_timed_loader_two_workers_hide_the_load_behind_compute(self):
        # Two workers each need 40 ms per batch; a 120 ms step leaves them time:
        # after the first batch (worker start-up + load), the wait is ~0.
        delay, bs, compute = 0.01, 4, 0.12
        dl = DataLoader(SlowMap(48, delay), batch_size=bs, num_workers=2, prefetch_factor=2)
        tl = trainmeter.TimedLoader(dl)
        waits = []
        for _ in tl:
            time.sleep(compute)
            w, c = tl.take_timings()
            waits.append(w)
            self.assertGreaterEqual(c, compute)
        self.assertEqual(len(waits), 12)
        self.assertGreaterEqual(waits[0], bs * delay)
        steady = waits[2:]
        # Under half of what loading a batch in the loop costs (bs × delay).
        self.assertLess(sum(steady) / len(steady), bs * delay / 2, waits)
        del tl, dl

    def test_timed_loader_iterable_dataset_per_step(self):
        delay, bs = 0.05, 3
        tl = trainmeter.TimedLoader(DataLoader(SlowStream(12, delay), batch_size=bs, num_workers=0))
        seen = []
        for b in tl:
            seen += ids(b)
            self.assertGreaterEqual(tl.last_data_wait_s, bs * delay)
            self.assertLess(tl.last_data_wait_s, 2 * bs * delay)
        self.assertEqual(seen, list(range(12)))

    # ------------------------------------------------------------ rebuild

    def epoch_ids(self, loader):
        out = []
        for b in loader:
            out += ids(b)
        return out

    def test_rebuild_map_style_keeps_every_sample_and_the_shuffle_seed(self):
        n = 40

        def make():
            g = torch.Generator().manual_seed(1234)
            return DataLoader(SlowMap(n), batch_size=4, shuffle=True, num_workers=0, generator=g)

        reference, adapted = make(), make()
        ref_epochs = [self.epoch_ids(reference) for _ in range(3)]
        tl = trainmeter.TimedLoader(adapted)
        got = [self.epoch_ids(tl)]
        tl2 = trainmeter.rebuild_dataloader(tl, advice(0, 2))
        self.assertIsNot(tl2, tl)
        self.assertIsInstance(tl2, trainmeter.TimedLoader)
        self.assertEqual(tl2.num_workers, 2)
        self.assertIs(tl2.sampler, adapted.sampler)  # the same RandomSampler and generator
        got += [self.epoch_ids(tl2) for _ in range(2)]
        for e, ep in enumerate(got):
            self.assertEqual(sorted(ep), list(range(n)), "epoch %d lost or repeated samples" % (e + 1))
        # Same seed, same order: the rebuilt loader shuffles exactly as one never rebuilt.
        self.assertEqual(got, ref_epochs)
        self.assertNotEqual(got[1], got[2])  # and it still reshuffles each epoch
        del tl, tl2, adapted

    def test_rebuild_with_prefetch_and_persistent_workers(self):
        n = 36
        g = torch.Generator().manual_seed(7)
        dl = DataLoader(SlowMap(n), batch_size=3, shuffle=True, num_workers=2, prefetch_factor=2,
                        persistent_workers=True, generator=g)
        # PyTorch draws the workers' base seed from the loader's generator each
        # time it starts workers, which a persistent loader does once; the
        # rebuilt loader starts new ones, so its order is that of a
        # non-persistent loader with the same seed: the generator carried on.
        ref = DataLoader(SlowMap(n), batch_size=3, shuffle=True, num_workers=2, prefetch_factor=2,
                         persistent_workers=False, generator=torch.Generator().manual_seed(7))
        ref_epochs = [self.epoch_ids(ref) for _ in range(2)]
        first = self.epoch_ids(dl)
        new = trainmeter.rebuild_dataloader(dl, advice(2, 3, 2, 3))
        self.assertEqual((new.num_workers, new.prefetch_factor, new.persistent_workers), (3, 3, True))
        second = self.epoch_ids(new)
        self.assertEqual([first, second], ref_epochs)
        for ep in (first, second):
            self.assertEqual(sorted(ep), list(range(n)))
        # Fewer workers again (memory-bound advice down to none): the worker-only
        # options are dropped, as PyTorch requires for num_workers=0.
        down = trainmeter.rebuild_dataloader(new, {"kind": "dataloader", "classification": "memory-bound",
                                                   "num_workers": 0, "prefetch_factor": 0,
                                                   "from_num_workers": 3, "from_prefetch_factor": 3})
        self.assertEqual(down.num_workers, 0)
        self.assertEqual(sorted(self.epoch_ids(down)), list(range(n)))
        del dl, ref, new, down

    def test_rebuild_iterable_dataset_zero_to_two_workers(self):
        n = 30
        tl = trainmeter.TimedLoader(DataLoader(SlowStream(n), batch_size=5, num_workers=0))
        first = self.epoch_ids(tl)
        tl2 = trainmeter.rebuild_dataloader(tl, advice(0, 2))
        self.assertEqual(tl2.num_workers, 2)
        second = self.epoch_ids(tl2)
        self.assertEqual(first, list(range(n)))
        self.assertEqual(sorted(second), list(range(n)))
        del tl, tl2


if __name__ == "__main__":
    unittest.main()

"""DataLoader helpers (stdlib only; torch is never imported).

* :class:`TimedLoader` wraps any iterable of batches and measures how long each
  ``next()`` blocks (data wait) and the time between batches (compute).
* :func:`rebuild_dataloader` re-creates a PyTorch ``DataLoader`` with the
  ``num_workers`` / ``prefetch_factor`` the agent advised, keeping every other
  setting it can read.
* :func:`count_tokens` counts the tokens of a Hugging Face style batch.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from .client import Advice

log = logging.getLogger("trainmeter")

__all__ = ["TimedLoader", "AdaptiveLoader", "rebuild_dataloader", "advised_settings", "count_tokens"]


class TimedLoader:
    """Wrap a DataLoader (or any iterable) to time data wait and compute.

    ::

        loader = trainmeter.TimedLoader(DataLoader(ds, ...), run=run)
        for batch in loader:
            ...                           # forward / backward / optimizer step
            run.step(tokens=batch["input_ids"].numel())   # timings filled in

    * ``last_data_wait_s``: how long the most recent ``next()`` blocked.
    * ``last_compute_s``: time from the previous batch being handed out to the
      most recent ``next()`` call (the previous batch's compute), None for the
      first batch of each pass.
    * :meth:`take_timings` returns ``(data_wait_s, compute_s)`` summed over the
      batches since the previous call (so several micro-batches per optimizer
      step add up) and starts a new window; ``compute_s`` runs up to the call.
      A run given here (or ``run.attach_loader(loader)``) calls it from
      ``run.step()`` whenever ``data_wait_s`` / ``compute_s`` are omitted.
      ``step()`` itself stays yours to call: only you know the step's tokens.
    * :meth:`step` is ``run.step(data_wait_s=…, compute_s=…, **kw)`` with the
      timings of the window.

    Times are host wall-clock (``time.perf_counter``). CUDA runs asynchronously,
    so GPU work shows up wherever the host next waits for it (``loss.item()``,
    the optimizer step, the next host-to-device copy); pass ``sync=`` (e.g.
    ``torch.cuda.synchronize``) to wait for the GPU before each ``next()`` if
    your loop never does — at the price of less CPU/GPU overlap.

    Every ``iter()`` starts a new pass (epoch): time outside iteration (e.g.
    evaluation between epochs) is not counted. Attributes the wrapper doesn't
    have (``dataset``, ``batch_size``, ``sampler`` …) come from the wrapped loader,
    and ``len()`` is the wrapped loader's.
    """

    def __init__(self, loader: Any, run: Any = None, sync: Optional[Callable[[], Any]] = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.loader = loader
        self.run = run
        self.last_data_wait_s: Optional[float] = None
        self.last_compute_s: Optional[float] = None
        self.batches = 0  # batches handed out, over all passes
        self._sync = sync
        self._clock = clock
        self._handed: Optional[float] = None  # when the last batch was handed out
        self._mark: Optional[float] = None  # start of the current accounting window
        self._acc_wait = 0.0
        self._acc_batches = 0
        if run is not None:
            try:
                run.attach_loader(self)
            except Exception:
                log.debug("trainmeter: cannot attach loader to %r", run, exc_info=True)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.loader)
        _note_loader(self.run, self.loader)
        self._handed = None
        self._mark = None
        self._acc_wait = 0.0
        self._acc_batches = 0
        clock = self._clock
        while True:
            if self._sync is not None and self._handed is not None:
                try:
                    self._sync()
                except Exception:
                    pass
            t0 = clock()
            if self._handed is not None:
                self.last_compute_s = t0 - self._handed
            else:
                self.last_compute_s = None
            if self._mark is None:
                self._mark = t0
            try:
                batch = next(it)
            except StopIteration:
                return
            t1 = clock()
            self.last_data_wait_s = t1 - t0
            self._acc_wait += t1 - t0
            self._acc_batches += 1
            self.batches += 1
            self._handed = t1
            yield batch

    def take_timings(self) -> Tuple[Optional[float], Optional[float]]:
        """(data_wait_s, compute_s) since the previous call; (None, None) if no
        batch was handed out since. compute = elapsed − data wait."""
        if self._acc_batches == 0 or self._mark is None:
            return None, None
        now = self._clock()
        wait = self._acc_wait
        compute = max(0.0, (now - self._mark) - wait)
        self._mark = now
        self._acc_wait = 0.0
        self._acc_batches = 0
        return wait, compute

    def step(self, run: Any = None, **kwargs: Any) -> None:
        """``run.step(**kwargs)`` with this window's data_wait_s / compute_s
        (explicit keywords win). ``run`` defaults to the one given to the constructor."""
        run = run if run is not None else self.run
        w, c = self.take_timings()
        if kwargs.get("data_wait_s") is None:
            kwargs["data_wait_s"] = w
        if kwargs.get("compute_s") is None:
            kwargs["compute_s"] = c
        if run is not None:
            run.step(**kwargs)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes TimedLoader itself lacks: delegate.
        if name.startswith("__") or "loader" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["loader"], name)

    def __repr__(self) -> str:
        return "TimedLoader(%r)" % (self.loader,)


# ------------------------------------------------------------------ rebuild

def _note_loader(run: Any, loader: Any) -> None:
    """Tell the run which DataLoader settings the epoch starting now runs
    with (its next eval reports them); the innermost loader's settings."""
    note = getattr(run, "note_loader", None)
    if note is None:
        return
    while isinstance(loader, (TimedLoader, AdaptiveLoader)):
        loader = loader.loader
    try:
        note(loader)
    except Exception:
        pass


_COPY_ATTRS = ("collate_fn", "pin_memory", "timeout", "worker_init_fn", "generator", "pin_memory_device", "in_order")
_WORKER_ONLY = ("persistent_workers", "multiprocessing_context")


def _as_advice(advice: Any) -> Optional[Advice]:
    """An Advice (``run.advice()``), or an advice line as a dict, as an
    Advice; None for anything else."""
    if isinstance(advice, Mapping):
        advice = Advice.from_line(advice)
    return advice if isinstance(advice, Advice) else None


# PyTorch's prefetch_factor when the loader has workers and set none; the
# advisor's bound on prefetch advice.
_DEFAULT_PREFETCH = 2
_MAX_PREFETCH = 8


def _scale(real: int, frm: int, to: Optional[int], floor: int, cap: Optional[int]) -> int:
    """Apply the advised change frm → to to the loader's real setting: the
    same ratio (the same step when frm is 0), in the same direction, at least
    one step, within [floor, cap]; never the other way."""
    if to is None or to == frm:
        return real
    if to > frm:
        new = real + (to - frm) if frm == 0 else int(math.ceil(real * to / frm))
        new = max(new, real + 1)
        if cap is not None:
            new = min(new, cap)
        return max(new, real)
    new = int(math.floor(real * to / frm))
    new = max(min(new, real - 1), floor)
    return min(new, real)


def advised_settings(advice: Any, num_workers: int, prefetch_factor: Optional[int]) -> Tuple[Optional[int], Optional[int]]:
    """The ``(num_workers, prefetch_factor)`` an advice (an :class:`Advice`,
    ``run.advice()``, or an advice line as a dict) means for a loader that
    really has ``num_workers`` / ``prefetch_factor`` (None: that setting is
    not advised).

    The agent's advice carries absolute settings computed from what the
    collector believes the loader has (the run_start's ``num_workers`` /
    ``prefetch_factor``, assumed 2 / 2 when absent, then the last advice) and
    says so in ``from_num_workers`` / ``from_prefetch_factor``. When the real
    loader differs, the change is applied relative to it: the same ratio
    (``from`` 2 → 3 on a loader at 8 gives 12), in the same direction, capped
    by ``max_workers`` and prefetch 8 on an increase, at least 1 prefetch and
    0 workers on a decrease. Advice without ``from_*`` is taken as
    absolute, except that a value going against its ``classification``
    (fewer workers for a data-bound run, more for a memory-bound one) is
    refused.
    """
    advice = _as_advice(advice)
    if advice is None or advice.kind != "dataloader":
        return None, None
    to_nw = advice.num_workers
    to_pf = advice.prefetch_factor or None  # 0: nothing advised (the agent always sends the key)
    real_nw = num_workers or 0
    real_pf = prefetch_factor if prefetch_factor else _DEFAULT_PREFETCH
    from_nw, from_pf = advice.from_num_workers, advice.from_prefetch_factor
    if from_nw is not None and from_pf:  # the baseline the advice was computed from
        cap = advice.max_workers or None
        nw = _scale(real_nw, from_nw, to_nw, 0, cap) if to_nw is not None else None
        pf = _scale(real_pf, from_pf, to_pf, 1, _MAX_PREFETCH) if to_pf is not None else None
        return nw, pf
    direction = {"data-bound": 1, "memory-bound": -1}.get(advice.classification or "", 0)
    nw, pf = to_nw, to_pf
    if direction and nw is not None and (nw - real_nw) * direction < 0:
        log.warning("trainmeter: ignoring advised num_workers=%s: the loader has %s and the run is %s",
                    nw, real_nw, advice.classification)
        nw = None
    if direction and pf is not None and (pf - real_pf) * direction < 0:
        log.warning("trainmeter: ignoring advised prefetch_factor=%s: the loader has %s and the run is %s",
                    pf, real_pf, advice.classification)
        pf = None
    return nw, pf


def rebuild_dataloader(loader: Any, advice: Any = None, *, num_workers: Optional[int] = None,
                       prefetch_factor: Optional[int] = None) -> Any:
    """Return a loader like ``loader`` but with the advised ``num_workers`` /
    ``prefetch_factor`` (from ``advice``, e.g. ``run.advice()``, applied to the
    loader's real settings as :func:`advised_settings` says; or the keyword
    arguments, which win and are absolute), or ``loader`` itself when nothing
    changes or the loader cannot be rebuilt. Never raises.

    Call it between epochs (``for epoch …: loader = rebuild_dataloader(loader,
    run.advice())``); the old loader's workers exit when it and its iterators are
    garbage-collected. Duck-typed: it constructs
    ``type(loader)(loader.dataset, batch_size=…, num_workers=…, …)`` from the
    attributes a ``torch.utils.data.DataLoader`` keeps — the sampler (shuffling
    and its RNG state carry over, a ``DistributedSampler`` stays), or a custom
    ``batch_sampler``, ``drop_last``, ``collate_fn``, ``pin_memory``,
    ``timeout``, ``worker_init_fn``, ``generator``, ``persistent_workers``,
    ``multiprocessing_context``, ``pin_memory_device``, ``in_order`` — passing
    only the keywords the constructor accepts. With ``num_workers=0`` the
    worker-only options are left out (PyTorch rejects them). A
    :class:`TimedLoader` is rebuilt around the new inner loader, still attached
    to its run.
    """
    try:
        if isinstance(loader, TimedLoader):
            inner = rebuild_dataloader(loader.loader, advice, num_workers=num_workers,
                                       prefetch_factor=prefetch_factor)
            if inner is loader.loader:
                return loader
            return TimedLoader(inner, run=loader.run, sync=loader._sync, clock=loader._clock)

        cur_nw = getattr(loader, "num_workers", 0) or 0
        cur_pf = getattr(loader, "prefetch_factor", None)
        adv_nw, adv_pf = advised_settings(advice, cur_nw, cur_pf)
        nw = num_workers if num_workers is not None else adv_nw
        pf = prefetch_factor if prefetch_factor is not None else adv_pf
        if nw is None and pf is None:
            return loader
        new_nw = cur_nw if nw is None else nw
        if pf is not None and pf <= 0:
            pf = None
        new_pf = cur_pf if pf is None else pf
        if new_nw == cur_nw and (new_nw == 0 or new_pf == cur_pf):
            return loader
        if not hasattr(loader, "dataset"):
            log.warning("trainmeter: cannot rebuild %s: it has no .dataset", type(loader).__name__)
            return loader

        kw: Dict[str, Any] = {}
        sampler = getattr(loader, "sampler", None)
        batch_sampler = getattr(loader, "batch_sampler", None)
        batch_size = getattr(loader, "batch_size", None)
        iterable = getattr(loader, "_dataset_kind", 0) == 1 or type(sampler).__name__ == "_InfiniteConstantSampler"
        if iterable:
            kw["batch_size"] = batch_size
            kw["drop_last"] = getattr(loader, "drop_last", False)
        elif batch_size is None and batch_sampler is not None:
            kw["batch_sampler"] = batch_sampler
        else:
            if sampler is not None:
                kw["sampler"] = sampler
            kw["batch_size"] = batch_size
            kw["drop_last"] = getattr(loader, "drop_last", False)
        for a in _COPY_ATTRS:
            if hasattr(loader, a):
                kw[a] = getattr(loader, a)
        kw["num_workers"] = new_nw
        if new_nw > 0:
            for a in _WORKER_ONLY:
                if hasattr(loader, a) and getattr(loader, a) is not None:
                    kw[a] = getattr(loader, a)
            if new_pf is not None:
                kw["prefetch_factor"] = new_pf

        cls = type(loader)
        try:
            params = inspect.signature(cls).parameters
            if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
                kw = {k: v for k, v in kw.items() if k in params}
        except (TypeError, ValueError):
            pass
        new = cls(loader.dataset, **kw)
        log.info("trainmeter: rebuilt %s with num_workers=%s prefetch_factor=%s",
                 cls.__name__, new_nw, kw.get("prefetch_factor"))
        return new
    except Exception as e:
        log.warning("trainmeter: cannot rebuild %s with advised settings: %s", type(loader).__name__, e)
        return loader


# ------------------------------------------------------------------ adaptive


class AdaptiveLoader:
    """A DataLoader that follows the agent's live ``advice`` at epoch boundaries.

    ::

        loader = trainmeter.AdaptiveLoader(DataLoader(ds, num_workers=2, prefetch_factor=2), run)
        for epoch in range(epochs):
            for batch in loader:          # each iter() is an epoch boundary
                ...

    Every ``iter()`` first calls :meth:`maybe_rebuild`: when the run holds an
    ``advice`` line it has not applied yet, the inner loader is rebuilt with
    :func:`rebuild_dataloader` (never in the middle of an epoch, so no batch is
    lost or repeated). The advice is applied to the loader's real settings
    (:func:`advised_settings`): when the run was started without
    ``num_workers`` / ``prefetch_factor`` the collector assumes 2 / 2, and
    advice for a data-bound run then still means *more* workers, never fewer.
    Pass the loader's settings to :func:`trainmeter.start` so the advice's own
    figures match the loader. ``adjustments`` lists what was applied, with the epoch
    (1-based) that started with it: ``{"epoch", "num_workers", "prefetch_factor", "reason", "classification"}``.
    Advice lines may carry more keys (``data_wait_share``, ``gpu_utilization``,
    ``ram_usage``, ``expected_gain``…); they are kept in ``last_advice``.
    Attributes it lacks come from the inner loader; it never raises.
    """

    def __init__(self, loader: Any, run: Any) -> None:
        self.loader = loader
        self.run = run
        self.epoch = 0
        self.adjustments: list = []
        self.last_advice: Optional[Advice] = None
        self._applied: Optional[Advice] = None

    def maybe_rebuild(self) -> bool:
        """Apply the run's latest unapplied advice now; True if the loader changed."""
        try:
            advice = _as_advice(self.run.advice() if self.run is not None else None)
        except Exception:
            advice = None
        if not advice or advice == self._applied:
            return False
        self._applied = advice
        self.last_advice = advice
        new = rebuild_dataloader(self.loader, advice)
        if new is self.loader:
            return False
        self.loader = new
        self.adjustments.append({
            "epoch": self.epoch,
            "num_workers": getattr(new, "num_workers", None),
            "prefetch_factor": getattr(new, "prefetch_factor", None),
            "reason": advice.reason,
            "classification": advice.classification,
        })
        return True

    def __iter__(self) -> Iterator[Any]:
        self.epoch += 1  # the epoch that starts now (1-based)
        self.maybe_rebuild()
        it = iter(self.loader)
        _note_loader(self.run, self.loader)
        return it

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "loader" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["loader"], name)

    def __repr__(self) -> str:
        return "AdaptiveLoader(%r)" % (self.loader,)


# ------------------------------------------------------------------ tokens


def _numel(x: Any) -> Optional[int]:
    n = getattr(x, "numel", None)
    if callable(n):
        try:
            return int(n())
        except Exception:
            return None
    size = getattr(x, "size", None)
    if isinstance(size, int):  # numpy
        return size
    if isinstance(x, (list, tuple)):
        total = 0
        for row in x:
            if isinstance(row, (list, tuple)):
                total += len(row)
            else:
                total += 1
        return total
    return None


def count_tokens(batch: Any, non_padding: bool = False) -> Optional[int]:
    """Tokens in a Hugging Face style batch (a mapping with ``input_ids`` and/or
    ``attention_mask``), or None when the batch has neither.

    By default the number of elements of ``input_ids`` (padding included, like
    HF's ``include_num_input_tokens_seen``); this reads only the shape, so it
    never waits for the GPU. ``non_padding=True`` sums ``attention_mask``
    instead, which for a CUDA tensor waits for the GPU (a ``.item()``).
    """
    try:
        if isinstance(batch, Mapping) or (hasattr(batch, "keys") and hasattr(batch, "__getitem__")):
            keys = set(batch.keys())
            if non_padding and "attention_mask" in keys:
                m = batch["attention_mask"]
                s = m.sum() if hasattr(m, "sum") else sum(sum(r) for r in m)
                s = s.item() if hasattr(s, "item") else s
                return int(s)
            for k in ("input_ids", "attention_mask"):
                if k in keys:
                    return _numel(batch[k])
    except Exception:
        log.debug("trainmeter: cannot count tokens of batch", exc_info=True)
    return None

"""PyTorch Lightning integration.

::

    from trainmeter.integrations.lightning import TrainmeterCallback
    trainer = L.Trainer(..., callbacks=[TrainmeterCallback(tokens_per_step=16 * 2048)])

Imports may come in any order: each callback, when created, is an instance
of a subclass of ``TrainmeterCallback`` and of the ``Callback`` of every
Lightning imported at that moment (``lightning.pytorch`` and/or
``pytorch_lightning``; if neither is imported yet, the first that imports), so
either Trainer accepts it. Without Lightning it is a plain ``TrainmeterCallback``
with the same hooks. Create it after importing Lightning.

What it reports:

* ``on_train_start`` → ``run_start``: ``backend="lightning"``, model (the
  keyword, else ``pl_module.hparams.model_name`` / ``model_name_or_path``, else the
  module's class name), params (the module's parameter count, each shared tensor
  once, for FLOPs and MFU), precision (``trainer.precision``: ``bf16-mixed`` →
  ``bf16``, ``16-mixed`` → ``fp16``, ``32-true`` → ``fp32`` …), grad_accum
  (``accumulate_grad_batches``), planned_steps (``max_steps``, else
  ``estimated_stepping_batches``), seed (``PL_GLOBAL_SEED`` set by
  ``seed_everything``), num_workers / prefetch_factor / batch_size from the
  train dataloader, rank / world_size / local_rank from the trainer.
* ``on_train_batch_end`` → ``step`` once per optimizer step (when
  ``trainer.global_step`` advances; micro-batches of gradient accumulation are
  summed): ``step`` = ``trainer.global_step``, this rank's ``tokens`` (see
  below), ``samples``, ``loss`` (``outputs["loss"]``, detached; else the
  ``train_loss`` / ``train/loss`` / ``loss`` the module logged), ``data_wait_s`` =
  time from the previous batch's end to this batch's start (the fetch happens
  there; not counted across validation), ``compute_s`` = batch start → end.
* ``on_validation_end`` → ``eval`` from ``trainer.callback_metrics`` (first of
  ``val_loss``, ``val/loss``, ``valid_loss``, ``validation_loss``, ``loss/val``; and of
  ``val_acc``, ``val_accuracy``, ``val/acc``, ``val/accuracy``, ``accuracy``, ``acc``),
  ``epoch`` = epochs completed, 1-based like every ``epoch`` trainmeter reads:
  ``trainer.current_epoch + 1`` for the validation at the end of an epoch
  (Lightning's ``current_epoch`` is 0-based and not yet advanced there),
  ``current_epoch`` for a validation in the middle of one (``val_check_interval``;
  ``trainer.is_last_batch`` is False); global rank 0 only, sanity checks skipped.
* ``on_train_end`` → ``run_end`` (``status="stopped"`` after an agent stop);
  ``on_exception`` → ``run_end`` with ``status="error"``. Only for a run the
  callback started.
* A ``stop`` from the agent sets ``trainer.should_stop = True``.

Tokens, in order: ``tokens_fn(batch)`` on each batch; ``tokens_per_step``
(int: this rank's tokens per optimizer step, as for the Hugging Face
callback; a step cut short by the end of training counts its share of the
``accumulate_grad_batches`` micro-batches); else
:func:`trainmeter.count_tokens` on a dict-like batch (elements of
``input_ids``, never waiting for the GPU; ``non_padding=True`` sums
``attention_mask`` instead); else 0 with a warning, once. Every rank reports
its own batches.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._common import integer, param_count, scalar
from ..client import check_start_kwargs
from ..loader import count_tokens

log = logging.getLogger("trainmeter")

__all__ = ["TrainmeterCallback", "precision_name"]

VAL_LOSS_KEYS = ("val_loss", "val/loss", "valid_loss", "validation_loss", "loss/val")
ACCURACY_KEYS = ("val_acc", "val_accuracy", "val/acc", "val/accuracy", "accuracy", "acc")


TRAIN_LOSS_KEYS = ("train_loss", "train/loss", "loss")

_LIGHTNING = ("lightning.pytorch", "pytorch_lightning")


def _callback_bases() -> Tuple[type, ...]:
    """The ``Callback`` classes of the Lightning flavours imported now; if
    none is, of the first that imports; () without Lightning."""
    bases: List[type] = []
    for name in _LIGHTNING:
        cb = getattr(sys.modules.get(name), "Callback", None)
        if isinstance(cb, type) and cb not in bases:
            bases.append(cb)
    if not bases:
        for name in _LIGHTNING:
            try:
                cb = getattr(importlib.import_module(name), "Callback", None)
            except Exception:
                continue
            if isinstance(cb, type):
                bases.append(cb)
                break
    return tuple(bases)


_rebased: Dict[Tuple[type, ...], type] = {}
_rebased_lock = threading.Lock()


def _rebased_class(bases: Tuple[type, ...]) -> type:
    with _rebased_lock:
        cls = _rebased.get(bases)
        if cls is None:
            cls = type("TrainmeterCallback", (TrainmeterCallback,) + bases,
                       {"__module__": __name__, "__qualname__": "TrainmeterCallback"})
            _rebased[bases] = cls
        return cls


def _restore() -> Any:
    """Unpickling (``ddp_spawn``, ``copy.deepcopy``): rebuilt on the Lightning
    of the receiving process; the state follows."""
    return TrainmeterCallback.__new__(TrainmeterCallback)


def precision_name(p: Any) -> Optional[str]:
    """Lightning's precision setting as run_start ``precision``."""
    if p is None:
        return None
    s = str(p).lower()
    if "bf16" in s:
        return "bf16"
    if "transformer-engine" in s or s.startswith("8") or "fp8" in s:
        return "fp8"
    if s.startswith("16"):
        return "fp16"
    if s.startswith("32"):
        return "fp32"
    if s.startswith("64"):
        return "fp64"
    return s


def _hparam(module: Any, *names: str) -> Any:
    hp = getattr(module, "hparams", None)
    for n in names:
        try:
            if hp is not None:
                v = hp.get(n) if hasattr(hp, "get") else getattr(hp, n, None)
                if v is not None:
                    return v
        except Exception:
            pass
    return None


def _first_metric(metrics: Any, keys: Any) -> Optional[float]:
    if not metrics:
        return None
    for k in keys:
        try:
            if k in metrics:
                v = scalar(metrics[k])
                if v is not None:
                    return v
        except Exception:
            continue
    return None


def _epochs_completed(trainer: Any) -> Optional[int]:
    """Epochs completed at a validation, 1-based (the protocol's ``epoch``).

    Lightning's ``current_epoch`` counts from 0 and advances only after the
    epoch's validation, so at the end of an epoch the epochs completed are
    ``current_epoch + 1``; a validation in the middle of an epoch
    (``val_check_interval``, ``trainer.is_last_batch`` False) comes after
    ``current_epoch`` complete epochs."""
    ce = integer(getattr(trainer, "current_epoch", None))
    if ce is None or ce < 0:
        return None
    if getattr(trainer, "is_last_batch", None) is False:
        return ce
    return ce + 1


def _batch_samples(batch: Any) -> Optional[int]:
    try:
        if hasattr(batch, "keys") and hasattr(batch, "__getitem__"):
            for k in ("input_ids", "attention_mask", "labels"):
                if k in batch.keys():
                    shape = getattr(batch[k], "shape", None)
                    return int(shape[0]) if shape is not None and len(shape) > 0 else len(batch[k])
            return None
        if isinstance(batch, (list, tuple)) and batch:
            shape = getattr(batch[0], "shape", None)
            if shape is not None and len(shape) > 0:
                return int(shape[0])
        shape = getattr(batch, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    except Exception:
        pass
    return None


def _loggers(trainer: Any) -> List[Any]:
    """``trainer.loggers`` (Lightning ≥ 1.6), else ``[trainer.logger]``."""
    lgs = getattr(trainer, "loggers", None)
    if isinstance(lgs, (list, tuple)):
        return list(lgs)
    lg = getattr(trainer, "logger", None)
    return [lg] if lg is not None else []


def _loader_settings(trainer: Any) -> Dict[str, int]:
    """num_workers / prefetch_factor of the train dataloader, for eval: the
    collector labels each epoch's throughput with the loader it ran with."""
    out: Dict[str, int] = {}
    try:
        dl = getattr(trainer, "train_dataloader", None)
        if dl is None or callable(dl):  # Lightning 1.x had a method here
            return out
        nw = integer(getattr(dl, "num_workers", None))
        if nw is None or nw < 0:
            return out
        out["num_workers"] = nw
        pf = integer(getattr(dl, "prefetch_factor", None))
        if nw > 0 and pf is not None and pf > 0:
            out["prefetch_factor"] = pf
    except Exception:
        return {}
    return out


class TrainmeterCallback:
    """Report a Lightning ``Trainer.fit`` run to the trainmeter agent.

    Parameters: ``run`` (an existing :class:`trainmeter.Run`; the callback then
    never ends it), ``tokens_fn`` (``f(batch) -> int``), ``tokens_per_step``,
    ``non_padding`` (count ``attention_mask`` ones), ``stop_on_advisory``
    (default True), and any :func:`trainmeter.start` keyword, which overrides
    what is read from the trainer (an unknown one raises ``TypeError`` here).

    ``report_figures``: log the run's trainmeter figures into the trainer's
    MLflow / W&B run (``trainmeter.integrations.mlflow`` / ``.wandb``); None
    (default) does so when ``trainer.loggers`` has an ``MLFlowLogger`` or a
    ``WandbLogger``, on global rank 0. ``figures_options``: keywords for their
    ``attach`` (``interval_s``, ``console_url``, ``collector``, ...).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # Resolved per instance rather than at import: the module may be
        # imported before Lightning, or before the other Lightning flavour.
        if cls is TrainmeterCallback:
            try:
                bases = _callback_bases()
                if bases:
                    cls = _rebased_class(bases)
            except Exception:
                log.debug("trainmeter: cannot subclass Lightning's Callback", exc_info=True)
        return object.__new__(cls)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # The per-instance class is not importable by name.
        state = self.__dict__.copy()
        state["figures"] = []  # reporters hold a thread; they belong to the fit that started them
        return (_restore, (), state)

    def __init__(
        self,
        run: Any = None,
        tokens_fn: Optional[Callable[[Any], int]] = None,
        tokens_per_step: Optional[int] = None,
        non_padding: bool = False,
        stop_on_advisory: bool = True,
        report_figures: Optional[bool] = None,
        figures_options: Optional[Dict[str, Any]] = None,
        **start_kwargs: Any,
    ) -> None:
        check_start_kwargs(start_kwargs)
        try:
            super().__init__()
        except Exception:
            pass
        self.run = run
        self._own_run = run is None
        self.tokens_fn = tokens_fn
        self.tokens_per_step = tokens_per_step
        self.non_padding = non_padding
        self.stop_on_advisory = stop_on_advisory
        self.start_kwargs = start_kwargs
        self.stopped_by_agent = False
        self._clock = time.perf_counter
        self._warned_tokens = False
        self.report_figures = report_figures
        self.figures_options = dict(figures_options or {})
        self.figures: List[Any] = []  # FigureReporter per tracker
        self._reset()

    def _reset(self) -> None:
        self._last_end: Optional[float] = None
        self._batch_began: Optional[float] = None
        self._interrupted = False
        self._last_gs: Optional[int] = None
        self._acc: Dict[str, Any] = {}
        self._loss: Any = None

    # ------------------------------------------------------------ helpers

    def _metadata(self, trainer: Any, pl_module: Any) -> Dict[str, Any]:
        md: Dict[str, Any] = {"backend": "lightning"}
        name = _hparam(pl_module, "model_name", "model_name_or_path", "pretrained_model_name_or_path")
        md["model"] = str(name) if name is not None else type(pl_module).__name__
        prec = precision_name(getattr(trainer, "precision", None))
        if prec:
            md["precision"] = prec
        ga = integer(getattr(trainer, "accumulate_grad_batches", None))
        if ga is not None and ga > 0:
            md["grad_accum"] = ga
        ms = integer(getattr(trainer, "max_steps", None))
        if ms is None or ms <= 0:
            try:
                ms = integer(trainer.estimated_stepping_batches)
            except Exception:
                ms = None
        if ms is not None and ms > 0:
            md["planned_steps"] = ms
        seed = integer(os.environ.get("PL_GLOBAL_SEED"))
        if seed is not None:
            md["seed"] = seed
        dl = None
        try:
            dl = getattr(trainer, "train_dataloader", None)
            if callable(dl):  # Lightning 1.x had a method here
                dl = None
        except Exception:
            dl = None
        if dl is not None:
            for key, attr in (("num_workers", "num_workers"), ("prefetch_factor", "prefetch_factor"), ("batch_size", "batch_size")):
                v = integer(getattr(dl, attr, None))
                if v is not None:
                    md[key] = v
        if "batch_size" not in md:
            bs = integer(_hparam(pl_module, "batch_size", "train_batch_size"))
            if bs is not None:
                md["batch_size"] = bs
        params = param_count(pl_module)
        if params is not None:
            md["params"] = params
        for key, attr in (("rank", "global_rank"), ("world_size", "world_size"), ("local_rank", "local_rank")):
            v = integer(getattr(trainer, attr, None))
            if v is not None and v >= 0:
                md[key] = v
        if md.get("world_size") == 1:
            for k in ("rank", "world_size", "local_rank"):
                md.pop(k, None)
        return md

    def _tokens(self, batch: Any) -> int:
        try:
            if self.tokens_fn is not None:
                v = integer(self.tokens_fn(batch))
                return v if v is not None and v >= 0 else 0
            v = count_tokens(batch, non_padding=self.non_padding)
            if v is not None:
                return v
        except Exception:
            log.debug("trainmeter: counting tokens failed", exc_info=True)
            return 0
        if not self._warned_tokens:
            self._warned_tokens = True
            log.warning(
                "trainmeter: cannot count tokens of this batch type; give "
                "TrainmeterCallback(tokens_fn=...) or tokens_per_step=...; reporting tokens=0"
            )
        return 0

    def _emit(self, trainer: Any) -> None:
        acc, self._acc = self._acc, {}
        if not acc or self.run is None:
            return
        loss, self._loss = self._loss, None
        tokens = acc.get("tokens", 0)
        if self._fixed_tokens():
            ga = max(1, integer(getattr(trainer, "accumulate_grad_batches", None)) or 1)
            tokens = max(0, int(self.tokens_per_step)) * min(acc.get("batches", 0), ga) // ga
        self.run.step(
            step=integer(getattr(trainer, "global_step", None)),
            tokens=tokens,
            samples=acc.get("samples"),
            data_wait_s=acc.get("wait"),
            compute_s=acc.get("compute"),
            loss=loss,
        )
        if self.stop_on_advisory and self.run.should_stop():
            if not self.stopped_by_agent:
                log.warning("trainmeter: stopping training: %s", getattr(self.run, "stop_reason", "agent stop"))
            self.stopped_by_agent = True
            try:
                trainer.should_stop = True
            except Exception:
                pass

    def _fixed_tokens(self) -> bool:
        return self.tokens_fn is None and self.tokens_per_step is not None

    def _add(self, key: str, v: Any) -> None:
        if v is not None:
            self._acc[key] = self._acc.get(key, 0) + v

    def _end(self, **extra: Any) -> None:
        if self.run is not None and self._own_run:
            self.run.end(**extra)
        if self.figures:
            from ._figures import finish_all

            finish_all(self.figures)
            self.figures = []

    def _attach_figures(self, trainer: Any) -> None:
        if self.report_figures is False or self.run is None or not getattr(trainer, "is_global_zero", True):
            return
        from ._figures import attach_trackers, finish_all

        finish_all(self.figures)  # a previous fit() of this callback
        targets: List[Tuple[str, Dict[str, Any]]] = []
        for lg in _loggers(trainer):
            names = {c.__name__ for c in type(lg).__mro__}
            try:
                if "MLFlowLogger" in names:
                    # Lightning's logger keeps its own run (by id), not MLflow's active run.
                    targets.append(("mlflow", {"mlflow_run_id": lg.run_id}))
                elif "WandbLogger" in names:
                    targets.append(("wandb", {"wandb_run": lg.experiment}))
            except Exception:
                log.warning("trainmeter: cannot read the run of %s", type(lg).__name__, exc_info=True)
        if not targets and self.report_figures:
            log.warning("trainmeter: report_figures=True but the trainer has no MLFlowLogger or WandbLogger")
        self.figures = attach_trackers(self.run, targets, self.figures_options)

    # ------------------------------------------------------------ hooks

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        try:
            self._reset()
            self.stopped_by_agent = False
            self._last_gs = integer(getattr(trainer, "global_step", None))
            if self._own_run and (self.run is None or getattr(self.run, "ended", False)):
                from ..client import start

                md = self._metadata(trainer, pl_module)
                md.update(self.start_kwargs)
                self.run = start(**md)
            self._attach_figures(trainer)
        except Exception:
            log.warning("trainmeter: TrainmeterCallback.on_train_start failed", exc_info=True)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, *args: Any) -> None:
        now = self._clock()
        if self._last_end is not None and not self._interrupted:
            self._add("wait", max(0.0, now - self._last_end))
        self._interrupted = False
        self._batch_began = now

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                           *args: Any) -> None:
        try:
            now = self._clock()
            if self._batch_began is not None:
                self._add("compute", max(0.0, now - self._batch_began))
            self._batch_began = None
            self._add("batches", 1)
            if not self._fixed_tokens():
                self._add("tokens", self._tokens(batch))
            self._add("samples", _batch_samples(batch))
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is None:  # manual optimisation, or a step that returned nothing
                loss = _first_metric(getattr(trainer, "callback_metrics", None), TRAIN_LOSS_KEYS)
            if loss is not None and hasattr(loss, "detach"):
                loss = loss.detach()
            self._loss = loss if loss is not None and (hasattr(loss, "item") or isinstance(loss, (int, float))) else None
            gs = integer(getattr(trainer, "global_step", None))
            if gs is None or gs != self._last_gs:
                self._last_gs = gs
                self._emit(trainer)
            self._last_end = self._clock()
        except Exception:
            log.debug("trainmeter: on_train_batch_end failed", exc_info=True)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._interrupted = True

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._interrupted = True
        try:
            if self.run is None or getattr(trainer, "sanity_checking", False):
                return
            if not getattr(trainer, "is_global_zero", True):
                return
            metrics = getattr(trainer, "callback_metrics", None) or {}
            self.run.eval(
                epoch=_epochs_completed(trainer),
                val_loss=_first_metric(metrics, VAL_LOSS_KEYS),
                accuracy=_first_metric(metrics, ACCURACY_KEYS),
                **_loader_settings(trainer),
            )
        except Exception:
            log.debug("trainmeter: on_validation_end failed", exc_info=True)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        try:
            self._emit(trainer)  # micro-batches of an unfinished accumulation
            self._end(status="stopped" if self.stopped_by_agent else None)
        except Exception:
            log.debug("trainmeter: on_train_end failed", exc_info=True)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        try:
            from ..client import describe_exception

            self._end(status="error", error=describe_exception(type(exception), exception))
        except Exception:
            pass

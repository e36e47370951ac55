"""Hugging Face ``transformers.Trainer`` integration.

::

    from trainmeter.integrations.hf import TrainmeterCallback
    trainer = Trainer(model=model, args=args, ..., callbacks=[TrainmeterCallback()])

What it reports:

* ``on_train_begin`` → ``run_start`` with metadata from ``TrainingArguments``
  (``per_device_train_batch_size`` → batch_size, ``gradient_accumulation_steps``
  → grad_accum, ``seed``, ``bf16``/``fp16`` → precision, ``optim`` → optimizer,
  ``dataloader_num_workers`` / ``dataloader_prefetch_factor``,
  ``max_seq_length``/``max_length`` when the args have them, e.g. TRL) and the
  trainer state (``max_steps`` → planned_steps), the model name from
  ``model.config._name_or_path``, the model's parameter count (``params``, each
  shared tensor once, so the collector fills FLOPs and MFU), ``backend="transformers"``,
  and the process's rank / world size. Keywords given to the callback override all of these and
  go to :func:`trainmeter.start` (``run_id``, ``socket_path``, ``gpu_price_per_hour`` …).
* ``on_step_end`` → ``step`` with ``step=state.global_step`` (optimizer steps
  completed), this rank's ``tokens``, ``samples`` (per-device batch × grad
  accumulation), and timings: ``data_wait_s`` is the time from the previous
  ``on_step_end`` to ``on_step_begin`` (the Trainer fetches the step's first
  batch in that gap; omitted after an evaluation or checkpoint save),
  ``compute_s`` the time from ``on_step_begin`` to ``on_step_end``. On the
  steps the Trainer logs (``logging_steps``), the step carries ``loss``: the
  Trainer's logged mean training loss since its previous log. Such a step is
  sent from ``on_log``, which the Trainer calls right after ``on_step_end``.
* ``on_evaluate`` → ``eval`` (``eval_loss`` → val_loss, ``eval_accuracy`` or
  ``accuracy`` → accuracy, ``epoch`` = completed epochs), from the main process only.
* ``on_train_end`` → ``run_end`` (``status="stopped"`` after an agent stop),
  for a run the callback started.
* A ``stop`` from the agent (budget) sets ``control.should_training_stop``.

Tokens. Callbacks never see the batch, so tokens come from, in order:

1. ``tokens_per_step`` — an int (this rank's tokens per optimizer step, e.g.
   ``per_device_batch × grad_accum × seq_len`` for packed sequences) or a
   callable ``f(args, state) -> int``;
2. the Trainer's own counter ``state.num_input_tokens_seen``: unless
   ``count_input_tokens=False`` the callback turns on
   ``args.include_num_input_tokens_seen`` when it is off. The Trainer counts the
   elements of ``input_ids`` (padding included; recent versions count only
   non-padding tokens with ``include_num_input_tokens_seen="non_padding"``) and
   gathers the count over all ranks, so each rank reports an even share of the
   step's increase (the remainder on rank 0) and the ranks add up to the total.
   The gather is one tiny collective per micro-batch.
3. otherwise ``tokens=0`` (the step is still timed) and a warning, once.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Union

from ._common import integer, param_count, scalar, share
from ..client import check_start_kwargs

log = logging.getLogger("trainmeter")

__all__ = ["TrainmeterCallback"]


def _base() -> type:
    try:
        from transformers import TrainerCallback  # type: ignore

        return TrainerCallback
    except Exception:
        return object


def _precision(args: Any) -> Optional[str]:
    if getattr(args, "bf16", False) is True:
        return "bf16"
    if getattr(args, "fp16", False) is True:
        return "fp16"
    if hasattr(args, "bf16") or hasattr(args, "fp16"):
        return "fp32"
    return None


def _model_name(model: Any) -> Optional[str]:
    if model is None:
        return None
    for obj in (getattr(model, "config", None), model):
        for attr in ("_name_or_path", "name_or_path"):
            v = getattr(obj, attr, None)
            if isinstance(v, str) and v:
                return v
    return type(model).__name__


def _safe(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name, None)
    except Exception:  # properties that touch distributed state
        return None


class TrainmeterCallback(_base()):  # type: ignore[misc]
    """Report a ``transformers.Trainer`` run to the trainmeter agent.

    Parameters: ``run`` (an existing :class:`trainmeter.Run` to report into;
    the callback then never ends it), ``tokens_per_step`` (int or
    ``f(args, state)``), ``count_input_tokens`` (turn on the Trainer's token
    counter; default True), ``stop_on_advisory`` (default True), and any
    :func:`trainmeter.start` keyword (``run_id``, ``socket_path``, ``model``,
    ``gpu_price_per_hour``, …), which overrides what is read from the Trainer
    (an unknown one raises ``TypeError`` here).

    ``report_figures``: log the run's trainmeter figures into the Trainer's
    MLflow / W&B run (``trainmeter.integrations.mlflow`` / ``.wandb``); None
    (default) does so when ``args.report_to`` names "mlflow" or "wandb", on
    the main process. ``figures_options``: keywords for their ``attach``
    (``interval_s``, ``console_url``, ``collector``, ...).
    """

    def __init__(
        self,
        run: Any = None,
        tokens_per_step: Union[int, Callable[[Any, Any], int], None] = None,
        count_input_tokens: bool = True,
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
        self.tokens_per_step = tokens_per_step
        self.count_input_tokens = count_input_tokens
        self.stop_on_advisory = stop_on_advisory
        self.start_kwargs = start_kwargs
        self.stopped_by_agent = False
        self._clock = time.perf_counter
        self._step_began: Optional[float] = None
        self._last_end: Optional[float] = None
        self._interrupted = False
        self._tokens_seen: Optional[int] = None
        self._warned_tokens = False
        self._rank: Optional[int] = None
        self._world_size: Optional[int] = None
        self._samples: Optional[int] = None
        self._pending_step: Optional[Dict[str, Any]] = None
        self.report_figures = report_figures
        self.figures_options = dict(figures_options or {})
        self.figures: List[Any] = []  # FigureReporter per tracker

    # ------------------------------------------------------------ helpers

    def _enable_token_count(self, args: Any) -> None:
        if self.tokens_per_step is not None or not self.count_input_tokens or args is None:
            return
        try:
            if not getattr(args, "include_num_input_tokens_seen", False):
                args.include_num_input_tokens_seen = True
        except Exception:
            log.debug("trainmeter: cannot enable include_num_input_tokens_seen", exc_info=True)

    def _metadata(self, args: Any, state: Any, model: Any) -> Dict[str, Any]:
        md: Dict[str, Any] = {"backend": "transformers"}
        name = _model_name(model)
        if name:
            md["model"] = name
        pairs = (
            ("batch_size", "per_device_train_batch_size"),
            ("grad_accum", "gradient_accumulation_steps"),
            ("seed", "seed"),
            ("num_workers", "dataloader_num_workers"),
            ("prefetch_factor", "dataloader_prefetch_factor"),
        )
        for key, attr in pairs:
            v = integer(_safe(args, attr))
            if v is not None:
                md[key] = v
        for attr in ("max_seq_length", "max_length"):
            v = integer(_safe(args, attr))
            if v is not None and v > 0:
                md["seq_len"] = v
                break
        prec = _precision(args)
        if prec:
            md["precision"] = prec
        optim = _safe(args, "optim")
        if optim is not None:
            md["optimizer"] = str(getattr(optim, "value", optim))
        ms = integer(_safe(state, "max_steps"))
        if ms is not None and ms > 0:
            md["planned_steps"] = ms
        params = param_count(model)
        if params is not None:
            md["params"] = params
        for key, attr in (("rank", "process_index"), ("world_size", "world_size"), ("local_rank", "local_process_index")):
            v = integer(_safe(args, attr))
            if v is not None and v >= 0:
                md[key] = v
        if md.get("world_size") == 1:  # a single process: let the environment speak
            for k in ("rank", "world_size", "local_rank"):
                md.pop(k, None)
        return md

    def _step_tokens(self, args: Any, state: Any) -> int:
        tps = self.tokens_per_step
        if tps is not None:
            try:
                v = integer(tps(args, state) if callable(tps) else tps)
                if v is not None and v >= 0:
                    return v
            except Exception:
                log.debug("trainmeter: tokens_per_step failed", exc_info=True)
            return 0
        seen = integer(getattr(state, "num_input_tokens_seen", None))
        if seen is not None and seen > 0:
            last = self._tokens_seen or 0
            self._tokens_seen = seen
            if seen >= last:
                return share(seen - last, self._world_size, self._rank)
            return 0
        if not self._warned_tokens:
            self._warned_tokens = True
            log.warning(
                "trainmeter: no token count for this Trainer (give TrainmeterCallback(tokens_per_step=...) "
                "or set TrainingArguments(include_num_input_tokens_seen=True)); reporting tokens=0"
            )
        return 0

    def _is_main(self, state: Any) -> bool:
        v = getattr(state, "is_world_process_zero", None)
        if isinstance(v, bool):
            return v
        return (self._rank or 0) == 0

    def _attach_figures(self, args: Any, state: Any) -> None:
        if self.report_figures is False or self.run is None or not self._is_main(state):
            return
        from ._figures import attach_trackers, finish_all, hf_targets

        finish_all(self.figures)  # a previous train() of this callback
        names = hf_targets(getattr(args, "report_to", None))
        if not names and self.report_figures:
            log.warning("trainmeter: report_figures=True but args.report_to names neither mlflow nor wandb")
        self.figures = attach_trackers(self.run, [(n, {}) for n in names], self.figures_options)

    # ------------------------------------------------------------ hooks

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._enable_token_count(args)
        return control

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        try:
            self._enable_token_count(args)
            md = self._metadata(args, state, kwargs.get("model"))
            self._rank = md.get("rank")
            self._world_size = md.get("world_size")
            if self._rank is None or self._world_size is None:
                from .. import dist

                env = dist.rank_info()
                self._rank = self._rank if self._rank is not None else env.get("rank")
                self._world_size = self._world_size if self._world_size is not None else env.get("world_size")
            bs, ga = md.get("batch_size"), md.get("grad_accum")
            self._samples = bs * (ga or 1) if bs else None
            if self._own_run and (self.run is None or getattr(self.run, "ended", False)):
                from ..client import start

                md.update(self.start_kwargs)
                self.run = start(**md)
            self._tokens_seen = integer(getattr(state, "num_input_tokens_seen", None)) or 0
            self._step_began = None
            self._last_end = None
            self._pending_step = None
            self._interrupted = False
            self.stopped_by_agent = False
            self._attach_figures(args, state)
        except Exception:
            log.warning("trainmeter: TrainmeterCallback.on_train_begin failed", exc_info=True)
        return control

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._step_began = self._clock()
        try:
            self._flush_step()
        except Exception:
            log.debug("trainmeter: on_step_begin failed", exc_info=True)
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        try:
            now = self._clock()
            run = self.run
            if run is None:
                return control
            began = self._step_began
            wait = None
            if began is not None and self._last_end is not None and not self._interrupted:
                wait = max(0.0, began - self._last_end)
            compute = max(0.0, now - began) if began is not None else None
            self._flush_step()
            step = dict(
                step=integer(getattr(state, "global_step", None)),
                tokens=self._step_tokens(args, state),
                samples=self._samples,
                data_wait_s=wait,
                compute_s=compute,
            )
            if getattr(control, "should_log", False) is True:
                # The Trainer logs this step's loss right after on_step_end
                # (its DefaultFlowCallback has set should_log): on_log sends
                # the step with it.
                self._pending_step = step
            else:
                run.step(**step)
            self._last_end = now
            self._step_began = None
            self._interrupted = False
            if self.stop_on_advisory and run.should_stop():
                if not self.stopped_by_agent:
                    log.warning("trainmeter: stopping training: %s", getattr(run, "stop_reason", "agent stop"))
                self.stopped_by_agent = True
                control.should_training_stop = True
        except Exception:
            log.debug("trainmeter: on_step_end failed", exc_info=True)
        return control

    def _flush_step(self, loss: Optional[float] = None) -> None:
        step, self._pending_step = self._pending_step, None
        if step is not None and self.run is not None:
            self.run.step(loss=loss, **step)

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Dict[str, Any]] = None,
               **kwargs: Any) -> Any:
        try:
            # "loss" is the Trainer's mean training loss since its last log.
            self._flush_step(loss=scalar((logs or {}).get("loss")))
        except Exception:
            log.debug("trainmeter: on_log failed", exc_info=True)
        return control

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Optional[Dict[str, Any]] = None,
                    **kwargs: Any) -> Any:
        self._interrupted = True
        self._flush_step()
        try:
            if self.run is None or not self._is_main(state):
                return control
            metrics = metrics or {}
            acc = metrics.get("eval_accuracy", metrics.get("accuracy"))
            ep = scalar(getattr(state, "epoch", None))
            # The Trainer's loader never changes: saying so lets the collector
            # label each epoch's throughput with it (and not take advice as applied).
            nw = integer(_safe(args, "dataloader_num_workers"))
            pf = integer(_safe(args, "dataloader_prefetch_factor"))
            loader = {}
            if nw is not None and nw >= 0:
                loader["num_workers"] = nw
                if nw > 0 and pf is not None and pf > 0:
                    loader["prefetch_factor"] = pf
            self.run.eval(
                epoch=int(ep + 1e-6) if ep is not None and ep >= 0 else None,
                val_loss=scalar(metrics.get("eval_loss")),
                accuracy=scalar(acc),
                **loader,
            )
        except Exception:
            log.debug("trainmeter: on_evaluate failed", exc_info=True)
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._interrupted = True
        try:
            self._flush_step()
        except Exception:
            log.debug("trainmeter: on_save failed", exc_info=True)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        try:
            self._flush_step()
            if self.run is not None and self._own_run:
                self.run.end(status="stopped" if self.stopped_by_agent else None)
            if self.figures:
                from ._figures import finish_all

                finish_all(self.figures)
                self.figures = []
        except Exception:
            log.debug("trainmeter: on_train_end failed", exc_info=True)
        return control

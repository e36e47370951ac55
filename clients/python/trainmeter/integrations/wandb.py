"""Log a trainmeter run's figures into the active Weights & Biases run.

    import wandb, trainmeter
    from trainmeter.integrations import wandb as tm_wandb

    wandb.init(project="llm")
    run = trainmeter.start(model="llama-3-8b", gpu_price_per_hour=2.5)
    figures = tm_wandb.attach(run, interval_s=30, console_url="http://gpu-box:7434")
    ...  # train
    run.end()
    figures.finish()            # the whole run's figures, once the collector has them

Metrics ``trainmeter/energy_j``, ``trainmeter/j_per_token``, ``trainmeter/tok_per_s``,
``trainmeter/cost_usd``, ``trainmeter/co2_kg``, ... and ``trainmeter/advice/...`` go
through ``run.log(dict)`` every ``interval_s`` seconds, with ``trainmeter/step`` (the
trainer's step) as their x axis (``run.define_metric``); at ``finish()`` they are logged
once more and written to ``run.summary``. ``trainmeter_run_id`` and
``trainmeter_console_url`` go to ``run.config.update`` and ``run.summary``. ``wandb``
is imported when :func:`attach` is called without ``wandb_run``, never when this module is.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Sequence

from ._figures import DEFAULT_FINISH_TIMEOUT_S, DEFAULT_INTERVAL_S, PREFIX, FigureReporter, ReportFetcher, _Sink

log = logging.getLogger("trainmeter")

STEP_METRIC = PREFIX + "step"


class _WandbSink(_Sink):
    def __init__(self, run: Any) -> None:
        self.run = run

    def start(self, params: Dict[str, str]) -> None:
        self.run.config.update(params, allow_val_change=True)
        for k, v in params.items():
            self.run.summary[k] = v
        define = getattr(self.run, "define_metric", None)
        if callable(define):
            # The trainer's own step counter is W&B's x axis for these; the
            # timer's logs then do not claim a step of the trainer's log.
            define(STEP_METRIC)
            define(PREFIX + "*", step_metric=STEP_METRIC)

    def log(self, metrics: Dict[str, float], step: Optional[int]) -> None:
        row: Dict[str, Any] = dict(metrics)
        if step is not None:
            row[STEP_METRIC] = step
        self.run.log(row)

    def final(self, metrics: Dict[str, float], step: Optional[int], texts: Dict[str, str]) -> None:
        if metrics:
            self.log(metrics, step)
        for k, v in metrics.items():
            self.run.summary[k] = v
        for k, v in texts.items():
            self.run.summary[k] = v


def attach(run: Any, *, wandb_run: Any = None, interval_s: float = DEFAULT_INTERVAL_S,
           console_url: Optional[str] = None, collector: Optional[str] = None, cli: Optional[str] = None,
           cli_args: Sequence[str] = (), finish_timeout_s: float = DEFAULT_FINISH_TIMEOUT_S) -> Optional[FigureReporter]:
    """Start logging ``run``'s figures into a W&B run: ``wandb_run``, else
    ``wandb.run`` (the one ``wandb.init()`` started). Returns the reporter
    (call ``finish()`` after ``run.end()``), or None (with a warning) when
    wandb cannot be imported or no run is active; never raises.

    The other keywords are those of ``trainmeter.integrations.mlflow.attach``."""
    try:
        wrun = wandb_run
        if wrun is None:
            try:
                import wandb  # noqa: PLC0415 - imported only when used
            except Exception as e:
                log.warning("trainmeter: wandb is not importable (%s); figures not logged to W&B", e)
                return None
            wrun = wandb.run
        if wrun is None:
            log.warning("trainmeter: no active W&B run (wandb.init()); figures not logged to W&B")
            return None
        fetcher = ReportFetcher(cli=cli, collector=collector, cli_args=cli_args)
        return FigureReporter(run, _WandbSink(wrun), interval_s=interval_s, console_url=console_url,
                              fetcher=fetcher, finish_timeout_s=finish_timeout_s)
    except Exception:
        log.warning("trainmeter: could not start logging figures to W&B", exc_info=True)
        return None

"""Log a trainmeter run's figures into the active MLflow run.

    import mlflow, trainmeter
    from trainmeter.integrations import mlflow as tm_mlflow

    with mlflow.start_run():
        run = trainmeter.start(model="llama-3-8b", gpu_price_per_hour=2.5)
        figures = tm_mlflow.attach(run, interval_s=30, console_url="http://gpu-box:7434")
        ...  # train
        run.end()
        figures.finish()        # the whole run's figures, once the collector has them

Metrics ``trainmeter/energy_j``, ``trainmeter/j_per_token``, ``trainmeter/tok_per_s``,
``trainmeter/cost_usd``, ``trainmeter/co2_kg``, ... and ``trainmeter/advice/...`` go
through ``mlflow.log_metrics(dict, step=, run_id=)`` every ``interval_s`` seconds and at
``finish()``; ``trainmeter_run_id`` and ``trainmeter_console_url`` through
``mlflow.log_params`` and ``mlflow.set_tags``. ``mlflow`` is imported when
:func:`attach` is called, never when this module is.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Sequence

from ._figures import DEFAULT_FINISH_TIMEOUT_S, DEFAULT_INTERVAL_S, FigureReporter, ReportFetcher, _Sink

log = logging.getLogger("trainmeter")


class _MlflowSink(_Sink):
    """Logs into one MLflow run, by id: the timer's thread has no active run
    (MLflow keeps the active run per thread), and the trainer's run may have
    ended (``MLflowCallback`` ends it in its own ``on_train_end``) by the time
    the final figures are logged."""

    def __init__(self, mlflow: Any, run_id: str) -> None:
        self.mlflow = mlflow
        self.run_id = run_id

    def _active(self) -> bool:
        try:
            r = self.mlflow.active_run()
            return r is not None and r.info.run_id == self.run_id
        except Exception:
            return False

    def _tags(self, tags: Dict[str, str]) -> None:
        if self._active():
            self.mlflow.set_tags(tags)
        else:
            client = self.mlflow.MlflowClient()
            for k, v in tags.items():
                client.set_tag(self.run_id, k, v)

    def start(self, params: Dict[str, str]) -> None:
        if self._active():
            self.mlflow.log_params(params)
        else:
            client = self.mlflow.MlflowClient()
            for k, v in params.items():
                client.log_param(self.run_id, k, v)
        self._tags(params)

    def log(self, metrics: Dict[str, float], step: Optional[int]) -> None:
        self.mlflow.log_metrics(metrics, step=step, run_id=self.run_id)

    def final(self, metrics: Dict[str, float], step: Optional[int], texts: Dict[str, str]) -> None:
        if metrics:
            self.log(metrics, step)
        if texts:
            self._tags(texts)


def attach(run: Any, *, mlflow_run_id: Optional[str] = None, interval_s: float = DEFAULT_INTERVAL_S,
           console_url: Optional[str] = None, collector: Optional[str] = None, cli: Optional[str] = None,
           cli_args: Sequence[str] = (), finish_timeout_s: float = DEFAULT_FINISH_TIMEOUT_S) -> Optional[FigureReporter]:
    """Start logging ``run``'s figures into an MLflow run: ``mlflow_run_id``,
    else the active run. Returns the reporter (call ``finish()`` after
    ``run.end()``), or None (with a warning) when mlflow cannot be imported or
    there is no run to log into; never raises.

    ``console_url``: the console's base URL (else ``$TRAINMETER_CONSOLE_URL``;
    no link without either). ``collector``, ``cli``, ``cli_args``: how
    ``trainmeter report --json`` reaches the collector (``$TRAINMETER_COLLECTOR``,
    ``$TRAINMETER_CLI``, ``$TRAINMETER_TOKEN`` otherwise)."""
    try:
        import mlflow  # noqa: PLC0415 - imported only when used
    except Exception as e:
        log.warning("trainmeter: mlflow is not importable (%s); figures not logged to MLflow", e)
        return None
    try:
        rid = mlflow_run_id
        if rid is None:
            active = mlflow.active_run()
            rid = active.info.run_id if active is not None else None
        if not rid:
            log.warning("trainmeter: no active MLflow run (mlflow.start_run()); figures not logged to MLflow")
            return None
        fetcher = ReportFetcher(cli=cli, collector=collector, cli_args=cli_args)
        return FigureReporter(run, _MlflowSink(mlflow, str(rid)), interval_s=interval_s, console_url=console_url,
                              fetcher=fetcher, finish_timeout_s=finish_timeout_s)
    except Exception:
        log.warning("trainmeter: could not start logging figures to MLflow", exc_info=True)
        return None

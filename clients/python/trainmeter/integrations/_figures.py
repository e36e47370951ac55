"""A run's trainmeter figures, logged into an experiment tracker (stdlib only).

The agent's socket carries advice, errors and stops back to the trainer, not
the run's energy or cost: those are the collector's (it joins every node and
rank of the run, prices it and knows its carbon intensity). The figures come
from ``trainmeter report RUN --json``, the CLI every trainmeter install has:
it already speaks the collector's gRPC query API with its TLS and token
options (``$TRAINMETER_COLLECTOR``, ``$TRAINMETER_TOKEN``), and its JSON has
``null`` for an unknown figure. A figure that is null is not logged.

:class:`FigureReporter` polls the report every ``interval_s`` seconds on a
daemon thread and hands the figures to a tracker (``_Sink``); ``finish()``
stops the thread, waits (bounded) for the collector to have the ended run, and
logs the final figures. Nothing here raises into training.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
import urllib.parse
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

log = logging.getLogger("trainmeter")

ENV_CLI = "TRAINMETER_CLI"
ENV_CONSOLE_URL = "TRAINMETER_CONSOLE_URL"
DEFAULT_INTERVAL_S = 30.0
DEFAULT_FINISH_TIMEOUT_S = 15.0
PREFIX = "trainmeter/"

# Metric name (after PREFIX) -> the report's JSON key (proto field name;
# docs/cli.md, "JSON output"). Scopes are the report's: energy, cost and CO2
# over the whole run; J/token, tok/s and average power after warmup.
REPORT_FIGURES: Tuple[Tuple[str, str], ...] = (
    ("energy_j", "energy_total_j"),
    ("energy_kwh", "energy_kwh"),
    ("j_per_token", "j_per_token"),
    ("tok_per_s", "tok_per_s"),
    ("avg_power_w", "avg_power_w"),
    ("cost_usd", "total_cost_usd"),
    ("usd_per_mtok", "usd_per_mtok"),
    ("projected_cost_usd", "projected_cost_usd"),
    ("co2_kg", "co2_kg"),
    ("mfu", "mfu"),
)

# The latest advice for the run (trainmeter.Advice attributes), as metrics.
ADVICE_FIGURES: Tuple[str, ...] = (
    "num_workers",
    "prefetch_factor",
    "expected_gain",
    "data_wait_share",
    "gpu_utilization",
    "ram_usage",
)


def _number(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if f == f and f not in (float("inf"), float("-inf")) else None


def report_figures(report: Optional[Mapping]) -> Dict[str, float]:
    """The report's known figures as metrics (``trainmeter/energy_j``, ...).

    A report of a run with no measured second yet (``wall_s`` 0) gives none:
    its zeros are not readings."""
    out: Dict[str, float] = {}
    if not report or not (_number(report.get("wall_s")) or 0) > 0:
        return out
    for name, key in REPORT_FIGURES:
        v = _number(report.get(key))
        if v is not None:
            out[PREFIX + name] = v
    return out


def advice_figures(advice: Any) -> Dict[str, float]:
    """The advice's figures as metrics (``trainmeter/advice/num_workers``, ...);
    ``prefetch_factor`` 0 means nothing advised for it and is left out."""
    out: Dict[str, float] = {}
    if advice is None:
        return out
    for name in ADVICE_FIGURES:
        v = _number(getattr(advice, name, None))
        if v is None or (name == "prefetch_factor" and v == 0):
            continue
        out[PREFIX + "advice/" + name] = v
    return out


def console_link(run_id: str, console_url: Optional[str]) -> Optional[str]:
    """The run's console page under the console's base URL (argument, else
    ``$TRAINMETER_CONSOLE_URL``); None when neither is set."""
    base = console_url if console_url is not None else os.environ.get(ENV_CONSOLE_URL, "")
    base = (base or "").strip()
    if not base:
        return None
    return base.rstrip("/") + "/runs/" + urllib.parse.quote(run_id, safe="")


class ReportFetcher:
    """Runs ``trainmeter report RUN --json`` and decodes it (None on failure).

    ``cli``: the trainmeter binary (argument, else ``$TRAINMETER_CLI``, else
    ``trainmeter`` on PATH). ``collector``: ``--collector`` (else the CLI's
    own default: ``$TRAINMETER_COLLECTOR``, else ``127.0.0.1:7433``).
    ``cli_args``: more flags (``--tls-ca``, ``--token-file``, ...)."""

    def __init__(self, cli: Optional[str] = None, collector: Optional[str] = None,
                 cli_args: Sequence[str] = (), timeout_s: float = 10.0) -> None:
        self.cli = cli or os.environ.get(ENV_CLI) or "trainmeter"
        self.collector = collector
        self.cli_args = list(cli_args)
        self.timeout_s = timeout_s
        self.last_error: Optional[str] = None
        self.broken = False  # the CLI cannot be run, or its output is not a report

    def fetch(self, run_id: str) -> Optional[Dict[str, Any]]:
        argv: List[str] = [self.cli, "report", run_id, "--json"]
        if self.collector:
            argv += ["--collector", self.collector]
        argv += self.cli_args
        try:
            p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            self._fail("%s: no answer in %g s" % (self.cli, self.timeout_s), warn=False)
            return None
        except (OSError, subprocess.SubprocessError) as e:
            self._fail("%s: %s" % (self.cli, e), warn=True)
            return None
        if p.returncode != 0:
            # "run not found" until the collector has the run's first batch.
            self._fail(p.stderr.decode("utf-8", "replace").strip() or "exit %d" % p.returncode, warn=False)
            return None
        try:
            rep = json.loads(p.stdout)
        except ValueError as e:
            self._fail("report --json: %s" % e, warn=True)
            return None
        self.last_error = None
        return rep if isinstance(rep, dict) else None

    def _fail(self, why: str, warn: bool) -> None:
        self.last_error = why
        if warn and not self.broken:
            self.broken = True
            log.warning("trainmeter: cannot read the run's figures from the collector (%s); "
                        "only the advice is logged", why)
        else:
            log.debug("trainmeter: report failed: %s", why)


class _Sink:
    """What a tracker integration implements. Every method may raise; the
    reporter catches and logs."""

    def start(self, params: Dict[str, str]) -> None:
        raise NotImplementedError

    def log(self, metrics: Dict[str, float], step: Optional[int]) -> None:
        raise NotImplementedError

    def final(self, metrics: Dict[str, float], step: Optional[int], texts: Dict[str, str]) -> None:
        raise NotImplementedError


class FigureReporter:
    """Logs a :class:`trainmeter.Run`'s figures into a tracker every
    ``interval_s`` seconds and once more at :meth:`finish`.

    The metrics are logged at the trainer's latest step (the run's step
    counter), so they line up with the loss. Use through
    ``trainmeter.integrations.mlflow.attach`` or ``...wandb.attach``."""

    def __init__(self, run: Any, sink: _Sink, *, interval_s: float = DEFAULT_INTERVAL_S,
                 console_url: Optional[str] = None, fetcher: Optional[ReportFetcher] = None,
                 finish_timeout_s: float = DEFAULT_FINISH_TIMEOUT_S) -> None:
        self.run = run
        self.sink = sink
        self.interval_s = max(0.05, float(interval_s))
        self.finish_timeout_s = float(finish_timeout_s)
        self.fetcher = fetcher or ReportFetcher()
        self.run_id = str(getattr(run, "run_id", ""))
        self.console_url = console_link(self.run_id, console_url)
        self.last_report: Optional[Dict[str, Any]] = None
        self.logged = 0  # metric dicts logged
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._finished = False
        params = {"trainmeter_run_id": self.run_id}
        if self.console_url:
            params["trainmeter_console_url"] = self.console_url
        self.params = params
        try:
            sink.start(params)
        except Exception:
            log.warning("trainmeter: could not log the run id to the tracker", exc_info=True)
        self._thread = threading.Thread(target=self._loop, name="trainmeter-figures[%s]" % self.run_id,
                                        daemon=True)
        self._thread.start()

    def _step(self) -> Optional[int]:
        n = getattr(self.run, "_step_counter", None)
        return n if isinstance(n, int) and n > 0 else None

    def _figures(self) -> Dict[str, float]:
        rep = self.fetcher.fetch(self.run_id)
        if rep is not None:
            self.last_report = rep
        figs = report_figures(rep)
        try:
            adv = self.run.advice()
        except Exception:
            adv = None
        figs.update(advice_figures(adv))
        return figs

    def poll(self) -> Dict[str, float]:
        """Log the current figures now (what the timer does); returns them."""
        with self._lock:
            if self._finished:
                return {}
            figs = self._figures()
            if figs:
                try:
                    self.sink.log(figs, self._step())
                    self.logged += 1
                except Exception:
                    log.debug("trainmeter: logging figures failed", exc_info=True)
            return figs

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception:  # pragma: no cover - poll catches its own
                log.debug("trainmeter: figures timer", exc_info=True)

    def stop(self) -> None:
        """Stop the timer (no final log); idempotent."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(self.fetcher.timeout_s + 1.0)

    def finish(self, timeout_s: Optional[float] = None) -> Dict[str, float]:
        """Stop the timer and log the final figures: once the run has ended
        (``run.end()`` was called), wait at most ``timeout_s`` (default 15 s)
        for the collector to report it ended, so the figures are the whole
        run's; otherwise, or on timeout, the latest figures. Idempotent;
        returns what was logged."""
        self.stop()
        with self._lock:
            if self._finished:
                return {}
            self._finished = True
        try:
            wait = self.finish_timeout_s if timeout_s is None else float(timeout_s)
            deadline = time.monotonic() + max(0.0, wait)
            ended = bool(getattr(self.run, "ended", False))
            while True:
                figs = self._figures()
                rep = self.last_report
                if (not ended or (rep is not None and rep.get("ended") is True) or self.fetcher.broken
                        or time.monotonic() >= deadline):
                    break
                time.sleep(0.25)
            texts: Dict[str, str] = {}
            try:
                adv = self.run.advice()
            except Exception:
                adv = None
            if adv is not None and getattr(adv, "reason", ""):
                texts["trainmeter.advice"] = str(adv.reason)
            if figs or texts:
                self.sink.final(figs, self._step(), texts)
                self.logged += 1
            return figs
        except Exception:
            log.warning("trainmeter: logging the final figures failed", exc_info=True)
            return {}

    close = finish

    def __enter__(self) -> "FigureReporter":
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.finish()
        return False


def hf_targets(report_to: Any) -> List[str]:
    """The trackers among a ``TrainingArguments.report_to`` ("mlflow",
    "wandb"; "all" means those importable, as for the Trainer)."""
    if report_to is None:
        return []
    names = [report_to] if isinstance(report_to, str) else list(report_to) if isinstance(report_to, (list, tuple)) else []
    names = [str(n).lower() for n in names]
    if "all" in names:
        import importlib.util

        return [n for n in ("mlflow", "wandb") if importlib.util.find_spec(n) is not None]
    return [n for n in ("mlflow", "wandb") if n in names]


def attach_trackers(run: Any, targets: Sequence[Tuple[str, Dict[str, Any]]],
                    options: Optional[Mapping[str, Any]]) -> List[FigureReporter]:
    """One reporter per (tracker, its keywords) target, with the common
    ``options`` (``attach``'s keywords); failures are logged, never raised."""
    out: List[FigureReporter] = []
    for name, kw in targets:
        try:
            if name == "mlflow":
                from . import mlflow as mod
            elif name == "wandb":
                from . import wandb as mod  # type: ignore[no-redef]
            else:
                continue
            rep = mod.attach(run, **dict(options or {}), **kw)
            if rep is not None:
                out.append(rep)
        except Exception:
            log.warning("trainmeter: could not log figures to %s", name, exc_info=True)
    return out


def finish_all(reporters: Sequence[FigureReporter]) -> None:
    for r in reporters:
        try:
            r.finish()
        except Exception:
            log.debug("trainmeter: finishing figures", exc_info=True)

"""trainmeter trainer client (stdlib only).

A training loop reports run metadata, per-step token counts and timings, and
evaluation results to the local trainmeter agent as newline-delimited JSON over
a Unix stream socket (docs/protocol.md in the trainmeter repository).

Guarantees:

* Nothing in the public API blocks on I/O or raises into the training loop;
  ``start()`` raises only for a programming error (an unknown keyword, a bad
  label). ``step()`` / ``eval()`` build a small dict and ``put_nowait`` it on a
  bounded queue; all socket work happens on one daemon thread, which sleeps
  until there is work.
* If the agent is absent, restarting, or not reading, events are dropped and
  counted (``Run.stats()``), never buffered without bound. An agent that cannot
  be reached at the first try, or that answers run_start with an error, gets one
  WARNING on the ``trainmeter`` logger (stderr when logging is not configured).
* On every (re)connect the ``run_start`` event is sent first so the agent can
  (re)join the run.
* ``end()`` flushes with a bounded wait (default 2 s) and then closes.
* Non-finite floats (NaN, +-inf) are never sent; such keys are dropped and counted.
"""

from __future__ import annotations

import atexit
import collections
import errno
import inspect
import json
import logging
import math
import os
import queue
import select
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Deque, Dict, List, Optional, Sequence, Union

from . import dist as _dist
from .metadata import METADATA_KEYS, PROTOCOL_KEYS

__all__ = ["Advice", "AgentError", "Run", "Stats", "start"]

log = logging.getLogger("trainmeter")

DEFAULT_SOCKET = "/run/trainmeter/agent.sock"
ENV_SOCKET = "TRAINMETER_SOCKET"
ENV_RUN_ID = "TRAINMETER_RUN_ID"

_DEFAULT_QUEUE_SIZE = 10_000
_DEFAULT_SEND_TIMEOUT_S = 5.0
_DEFAULT_CONNECT_TIMEOUT_S = 1.0
_DEFAULT_RECONNECT_MIN_S = 1.0
_DEFAULT_RECONNECT_MAX_S = 5.0
_DEFAULT_END_TIMEOUT_S = 2.0
_DEFAULT_MAX_BUFFER_BYTES = 256 * 1024

_MAX_IN_LINE = 1 << 20  # longest line accepted from the agent
_KEEP_ERRORS = 10

_END = object()  # queue marker: run_end was requested (payload in Run._end_event)


def _count(v: Any) -> Optional[int]:
    """A non-negative int from a JSON value; None for anything else."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _share(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class Advice:
    """The agent's latest ``advice`` line for a run (docs/protocol.md): the
    DataLoader settings to apply at the next epoch, and the figures behind
    them. ``prefetch_factor`` 0: nothing advised for it (``num_workers`` 0 is
    a setting: loading in the training process). What the line did not carry
    is None."""

    kind: str
    num_workers: Optional[int]
    prefetch_factor: int
    reason: str = ""
    classification: Optional[str] = None  # "data-bound", "memory-bound"
    data_wait_share: Optional[float] = None
    gpu_utilization: Optional[float] = None
    ram_usage: Optional[float] = None
    expected_gain: Optional[float] = None  # share of step time the change aims to win back
    max_workers: Optional[int] = None  # the CPU bound
    from_num_workers: Optional[int] = None  # the settings the advice was computed from
    from_prefetch_factor: Optional[int] = None

    @classmethod
    def from_line(cls, line: Mapping) -> "Advice":
        """An advice line (a decoded JSON object) as an Advice; keys it does not
        know are ignored, values of the wrong type read as absent."""
        kind = line.get("kind")
        cls_ = line.get("classification")
        return cls(
            kind=kind if isinstance(kind, str) else "dataloader",
            num_workers=_count(line.get("num_workers")),
            prefetch_factor=_count(line.get("prefetch_factor")) or 0,
            reason=str(line.get("reason") or ""),
            classification=cls_ if isinstance(cls_, str) else None,
            data_wait_share=_share(line.get("data_wait_share")),
            gpu_utilization=_share(line.get("gpu_utilization")),
            ram_usage=_share(line.get("ram_usage")),
            expected_gain=_share(line.get("expected_gain")),
            max_workers=_count(line.get("max_workers")),
            from_num_workers=_count(line.get("from_num_workers")),
            from_prefetch_factor=_count(line.get("from_prefetch_factor")),
        )


@dataclass(frozen=True)
class AgentError:
    """An ``error`` line from the agent: what it refused, and on which line of
    the connection (None when it did not say)."""

    error: str
    line: Optional[int] = None


@dataclass(frozen=True)
class Stats:
    """What a run's client has done so far (:meth:`Run.stats`)."""

    sent: int  # lines written to the agent
    dropped: int  # events lost: agent absent or not reading, queue full, end timeout
    dropped_queue_full: int  # of dropped: refused at step()/eval() because the queue was full
    errors_from_agent: int
    reconnects: int
    connects: int
    connected: bool
    nonfinite_dropped: int  # NaN / inf values left out of events
    queued: int


def _env_int(name: str) -> Optional[int]:
    v = os.environ.get(name)
    if v is None or v.strip() == "":
        return None
    try:
        return int(v.strip())
    except ValueError:
        return None


_MAX_END_ERROR_BYTES = 1024  # the agent keeps at most this much of run_end's error


def describe_exception(exc_type: Any, exc: Any = None) -> str:
    """The cause run_end carries for an exception: ``module.Type: message``.

    No module for builtins (``RuntimeError: boom``), no ``: message`` when
    the message is empty. Cut to 1024 bytes of UTF-8 at a character
    boundary, as the agent would.
    """
    name = getattr(exc_type, "__qualname__", None) or getattr(exc_type, "__name__", None) or str(exc_type)
    module = getattr(exc_type, "__module__", None)
    if module and module != "builtins":
        name = module + "." + name
    try:
        msg = str(exc) if exc is not None else ""
    except Exception:
        msg = ""
    text = name + ": " + msg if msg else name
    raw = text.encode("utf-8", "replace")
    if len(raw) <= _MAX_END_ERROR_BYTES:
        return text
    return raw[:_MAX_END_ERROR_BYTES].decode("utf-8", "ignore")


def _check_labels(labels: Optional[Mapping]) -> Dict[str, Any]:
    """The labels to send (None values left out); TypeError / ValueError for
    what cannot be a label: a key run_start reads itself (pass it as its
    keyword), a key that is not a string, a list or object value."""
    out: Dict[str, Any] = {}
    if labels is None:
        return out
    if not isinstance(labels, Mapping):
        raise TypeError("trainmeter: labels must be a mapping of name to value, not %s" % type(labels).__name__)
    for k, v in labels.items():
        if not isinstance(k, str) or not k:
            raise TypeError("trainmeter: label name %r: want a non-empty string" % (k,))
        if k in METADATA_KEYS or k in PROTOCOL_KEYS:
            raise ValueError("trainmeter: label %r is a run_start field, not a label%s"
                             % (k, "; pass %s=... to start()" % k if k in METADATA_KEYS else ""))
        if isinstance(v, (Mapping, list, tuple, set, frozenset)):
            raise TypeError("trainmeter: label %r: want a string, number or bool, not %s" % (k, type(v).__name__))
        if v is not None:
            out[k] = v
    return out


def _generate_run_id() -> str:
    host = socket.gethostname().split(".")[0] or "host"
    return "%s-%s-%d-%s" % (
        host,
        time.strftime("%Y%m%dT%H%M%S", time.gmtime()),
        os.getpid(),
        uuid.uuid4().hex[:6],
    )


def _to_jsonable(o: Any) -> Any:
    """json.dumps default=: numpy scalars, 0-d tensors, sets, anything else as str."""
    item = getattr(o, "item", None)
    if callable(item):
        try:
            v = item()
            if isinstance(v, (int, float, str, bool)) or v is None:
                return v
        except Exception:
            pass
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    for conv in (int, float):
        try:
            if conv is int and hasattr(o, "__index__"):
                return o.__index__()
            if conv is float and hasattr(o, "__float__"):
                return float(o)
        except Exception:
            pass
    return str(o)


class _Sanitizer:
    """Recursively removes non-finite floats; counts what it removed."""

    def __init__(self) -> None:
        self.removed = 0

    def _keep(self, x: Any) -> "tuple[bool, Any]":
        if not isinstance(x, (type(None), bool, int, float, str, dict, list, tuple, set, frozenset)):
            x = _to_jsonable(x)
        if isinstance(x, float) and not math.isfinite(x):
            self.removed += 1
            return False, None
        return True, self.clean(x)

    def clean(self, v: Any) -> Any:
        if isinstance(v, dict):
            out = {}
            for k, x in v.items():
                ok, x = self._keep(x)
                if ok:
                    out[str(k)] = x
            return out
        if isinstance(v, (list, tuple, set, frozenset)):
            out_l = []
            for x in v:
                ok, x = self._keep(x)
                if ok:
                    out_l.append(x)
            return out_l
        return v


def encode_event(ev: Dict[str, Any]) -> "tuple[bytes, int]":
    """Serialise one event as a compact JSON line; returns (line, non-finite keys removed)."""
    try:
        s = json.dumps(ev, allow_nan=False, separators=(",", ":"), default=_to_jsonable)
        return (s + "\n").encode("utf-8"), 0
    except ValueError:
        pass
    san = _Sanitizer()
    cleaned = san.clean(ev)
    s = json.dumps(cleaned, allow_nan=False, separators=(",", ":"), default=str)
    return (s + "\n").encode("utf-8"), san.removed


class _Conn:
    """One connection to the agent, owned by the sender thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.out = bytearray()
        self.pending: Deque[int] = collections.deque()  # byte length of each queued line
        self.head_sent = 0  # bytes of pending[0] already written
        self.inbuf = bytearray()
        self.last_progress = time.monotonic()


class Run:
    """A training run reporting to the local trainmeter agent.

    Create with :func:`trainmeter.start`, which takes the metadata as typed
    keywords. The constructor raises only on a programming error (a metadata
    key that does not exist, a label that is not one); after it, all methods
    are thread-safe, never raise, and never block on I/O (except :meth:`end`,
    which waits at most its timeout for the queue to flush).
    """

    def __init__(
        self,
        run_id: Optional[str] = None,
        socket_path: Optional[str] = None,
        *,
        metadata: Optional[Mapping] = None,
        labels: Optional[Mapping] = None,
        queue_size: int = _DEFAULT_QUEUE_SIZE,
        send_timeout: float = _DEFAULT_SEND_TIMEOUT_S,
        connect_timeout: float = _DEFAULT_CONNECT_TIMEOUT_S,
        reconnect_min_s: float = _DEFAULT_RECONNECT_MIN_S,
        reconnect_max_s: float = _DEFAULT_RECONNECT_MAX_S,
        end_timeout: float = _DEFAULT_END_TIMEOUT_S,
        max_buffer_bytes: int = _DEFAULT_MAX_BUFFER_BYTES,
        gpu_uuids: bool = True,
        client_id: Optional[str] = None,
    ) -> None:
        metadata = dict(metadata or {})
        unknown = sorted(set(metadata) - set(METADATA_KEYS))
        if unknown:
            raise TypeError("trainmeter: unknown run metadata %s (known: %s; other keys go in labels={...})"
                            % (", ".join(map(repr, unknown)), ", ".join(METADATA_KEYS)))
        labels = _check_labels(labels)
        explicit_id = run_id or os.environ.get(ENV_RUN_ID)
        # Inside a Slurm job, a run that names no id of its own is the job's
        # run, which the agent bills the job's GPU processes to
        # (docs/attribution.md): its tokens meet the job's energy.
        derived_id = None if explicit_id else _dist.slurm_job_run_id()
        if not explicit_id and not derived_id:
            ws = metadata.get("world_size")
            if ws is None:
                ws = _env_int("WORLD_SIZE")
            try:
                derived_id = _dist.derive_run_id(int(ws) if ws is not None else None)
            except Exception:
                derived_id = None
        self.run_id: str = str(explicit_id or derived_id or _generate_run_id())
        self.socket_path: str = socket_path or os.environ.get(ENV_SOCKET) or DEFAULT_SOCKET
        self.stop_reason: Optional[str] = None

        self._send_timeout = max(0.01, float(send_timeout))
        self._connect_timeout = max(0.01, float(connect_timeout))
        self._reconnect_min = max(0.001, float(reconnect_min_s))
        self._reconnect_max = max(self._reconnect_min, float(reconnect_max_s))
        self._end_timeout = float(end_timeout)
        self._max_buffer = max(4096, int(max_buffer_bytes))

        self._gpu_uuids = bool(gpu_uuids)
        self._start_event = self._build_run_start(metadata, labels, client_id)
        self._start_line, removed = encode_event(self._start_event)
        # CUDA_VISIBLE_DEVICES -> GPU UUIDs (sent as "gpus") is resolved on the
        # sender thread (it may run nvidia-smi), before the first connection.
        self._map_gpus = bool(gpu_uuids) and "gpus" not in self._start_event and bool(
            self._start_event.get("cuda_visible_devices")
        )
        self._loader: Any = None
        # The DataLoader settings of the last epoch a TimedLoader /
        # AdaptiveLoader iterated: eval() reports them (what the epoch ran
        # with), so the collector measures each epoch against the real loader.
        self._loader_settings: Optional[Dict[str, int]] = None
        self._end_event: Dict[str, Any] = {"event": "run_end", "run_id": self.run_id}

        self._q: "queue.Queue[Any]" = queue.Queue(maxsize=max(1, int(queue_size)))
        self._lock = threading.Lock()  # guards counters touched by caller threads
        self._step_counter = 0
        # Cumulative tokens of this process's steps, delivered or not: the
        # agent credits any gap, so events lost in an agent restart or while
        # disconnected lose no tokens.
        self._tokens_total = 0
        self._ended = False
        self._abort = threading.Event()  # sender must exit now
        # The sender blocks in select() on the agent's socket and on this
        # pair until there is work; a caller that queues an event while it
        # waits (_waiting) wakes it with a byte. Without a pair (no file
        # descriptors left) it polls.
        self._waiting = False
        self._wakeups = 0  # sender loop passes, for tests: none while idle
        try:
            self._wake_r: Optional[socket.socket]
            self._wake_w: Optional[socket.socket]
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
        except OSError:
            self._wake_r = self._wake_w = None
        self._connected = False

        # Counters. *_caller are written by caller threads (under _lock);
        # the rest only by the sender thread.
        self._dropped_caller = 0
        self._sent = 0
        self._dropped = 0
        self._nonfinite = removed
        self._connects = 0
        self._errors_from_agent = 0
        self._errors: Deque[AgentError] = collections.deque(maxlen=_KEEP_ERRORS)
        # The run_start refusal is kept apart: each later step of the refused
        # run fails too, and those errors must not push out the one that says
        # what to do.
        self._start_error: Optional[AgentError] = None
        self._advice: Optional[Advice] = None
        self._stop = threading.Event()
        self._connect_error: Optional[str] = None
        self._warned_run_start = False

        if derived_id:
            log.info(
                "trainmeter: %s not set; %d ranks share the derived run id %s "
                "(set %s on every rank to choose it; multi-node jobs without "
                "--rdzv-id or SLURM get one id per node)",
                ENV_RUN_ID,
                int(self._start_event.get("world_size") or 0),
                self.run_id,
                ENV_RUN_ID,
            )

        self._thread = threading.Thread(
            target=self._sender_main, name="trainmeter-sender[%s]" % self.run_id, daemon=True
        )
        self._thread.start()
        _live_runs.add(self)

    # ------------------------------------------------------------------ public API

    def step(
        self,
        step: Optional[int] = None,
        tokens: Optional[int] = None,
        samples: Optional[int] = None,
        data_wait_s: Optional[float] = None,
        compute_s: Optional[float] = None,
        loss: Optional[float] = None,
        **extra: Any,
    ) -> None:
        """Report one optimizer step. Keys left as None are not sent.

        If ``step`` is None, an internal counter (1, 2, ...) is used. With a
        loader attached (:meth:`attach_loader`), ``data_wait_s`` / ``compute_s``
        left as None are taken from it (summed over the batches since the last
        step, so gradient accumulation is covered).
        """
        try:
            loader = self._loader
            if loader is not None:
                try:
                    w, c = loader.take_timings()
                except Exception:
                    w, c = None, None
                if data_wait_s is None:
                    data_wait_s = w
                if compute_s is None:
                    compute_s = c
            if step is None:
                self._step_counter += 1
                step = self._step_counter
            else:
                try:
                    self._step_counter = int(step)
                except Exception:
                    pass
            ev: Dict[str, Any] = {"event": "step", "run_id": self.run_id, "step": step}
            if tokens is not None:
                ev["tokens"] = tokens
                if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
                    with self._lock:
                        self._tokens_total += tokens
                        ev["tokens_total"] = self._tokens_total
            if samples is not None:
                ev["samples"] = samples
            if data_wait_s is not None:
                ev["data_wait_s"] = data_wait_s
            if compute_s is not None:
                ev["compute_s"] = compute_s
            if loss is not None:
                ev["loss"] = loss
            for k, v in extra.items():
                if v is not None and k not in ("event", "run_id"):
                    ev[k] = v
            self._enqueue(ev)
        except Exception:  # never raise into training
            self._count_caller_drop()

    def eval(self, epoch: Optional[int] = None, **metrics: Any) -> None:
        """Report an evaluation, e.g. ``run.eval(epoch=1, val_loss=1.93, accuracy=0.71)``.

        When a :class:`trainmeter.TimedLoader` or :class:`trainmeter.AdaptiveLoader`
        of this run has iterated an epoch, the eval also carries the
        ``num_workers`` / ``prefetch_factor`` that epoch ran with (unless given
        here), so the collector's per-epoch throughput and the measured gain of
        an applied advice name the loader's real settings."""
        try:
            ev: Dict[str, Any] = {"event": "eval", "run_id": self.run_id}
            if epoch is not None:
                ev["epoch"] = epoch
            settings = self._loader_settings
            if settings is not None and "num_workers" not in metrics:
                ev.update(settings)
            for k, v in metrics.items():
                if v is not None and k not in ("event", "run_id"):
                    ev[k] = v
            self._enqueue(ev)
        except Exception:
            self._count_caller_drop()

    def end(self, timeout: Optional[float] = None, **extra: Any) -> None:
        """Send run_end, flush for at most ``timeout`` seconds (default 2 s), close.

        Idempotent. Events still unsent after the timeout are dropped and counted.
        """
        try:
            with self._lock:
                if self._ended:
                    return
                self._ended = True
            for k, v in extra.items():
                if v is not None and k not in ("event", "run_id"):
                    self._end_event[k] = v
            wait = self._end_timeout if timeout is None else float(timeout)
            deadline = time.monotonic() + max(0.0, wait)
            # The end marker must get in even if the queue is full.
            while True:
                try:
                    self._q.put_nowait(_END)
                    break
                except queue.Full:
                    if time.monotonic() >= deadline:
                        self._stop_sender()
                        break
                    time.sleep(0.005)
            self._wake()
            self._thread.join(max(0.0, deadline - time.monotonic()))
            if self._thread.is_alive():
                self._stop_sender()
                self._thread.join(0.2)
            if not self._thread.is_alive():
                self._drain_drop()  # e.g. the marker put after the sender exited
        except Exception:
            self._stop_sender()
        finally:
            _live_runs.discard(self)

    close = end

    def attach_loader(self, loader: Any) -> Any:
        """Let :meth:`step` fill in ``data_wait_s`` / ``compute_s`` from a
        :class:`trainmeter.TimedLoader` (anything with ``take_timings()``).
        ``attach_loader(None)`` detaches. Returns ``loader``."""
        self._loader = loader
        return loader

    def note_loader(self, loader: Any) -> None:
        """Record the settings of the DataLoader an epoch is starting with (the
        loader wrappers call it at each ``iter()``); the next :meth:`eval`
        reports them. Never raises."""
        try:
            nw = getattr(loader, "num_workers", None)
            if isinstance(nw, bool) or not isinstance(nw, int) or nw < 0:
                return
            settings = {"num_workers": nw}
            pf = getattr(loader, "prefetch_factor", None)
            if nw > 0 and isinstance(pf, int) and not isinstance(pf, bool) and pf > 0:
                settings["prefetch_factor"] = pf
            self._loader_settings = settings
        except Exception:
            pass

    def should_stop(self) -> bool:
        """True once the agent has sent a ``stop`` event for this run (e.g. budget exceeded)."""
        return self._stop.is_set()

    def advice(self) -> Optional[Advice]:
        """The agent's latest advice for this run, or None."""
        return self._advice

    def errors(self) -> List[AgentError]:
        """The errors the agent sent back, oldest first: its refusal of run_start
        (if any) and the last few others."""
        head = [self._start_error] if self._start_error is not None else []
        return head + list(self._errors)

    def stats(self) -> Stats:
        """What this run's client has sent, dropped and heard so far."""
        with self._lock:
            dropped_caller = self._dropped_caller
        return Stats(
            sent=self._sent,
            dropped=self._dropped + dropped_caller,
            dropped_queue_full=dropped_caller,
            errors_from_agent=self._errors_from_agent,
            reconnects=max(0, self._connects - 1),
            connects=self._connects,
            connected=self._connected,
            nonfinite_dropped=self._nonfinite,
            queued=self._q.qsize(),
        )

    @property
    def ended(self) -> bool:
        return self._ended

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None and not issubclass(exc_type, (GeneratorExit,)):
            self.end(status="error", error=describe_exception(exc_type, exc))
        else:
            self.end()
        return False

    def __repr__(self) -> str:
        return "<trainmeter.Run %s socket=%s>" % (self.run_id, self.socket_path)

    # ------------------------------------------------------------------ internals

    def _build_run_start(self, metadata: Dict[str, Any], labels: Dict[str, Any],
                         client_id: Optional[str]) -> Dict[str, Any]:
        ev: Dict[str, Any] = {"event": "run_start", "run_id": self.run_id}
        for k in METADATA_KEYS:
            if metadata.get(k) is not None:
                ev[k] = metadata[k]
        ev.update(labels)  # the wire carries labels as keys of their own
        # Identifies this process to the agent across reconnects and agent
        # restarts, so tokens_total can be matched to what it already counted.
        ev["client_id"] = client_id or uuid.uuid4().hex
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        if cvd is not None and "cuda_visible_devices" not in ev:
            ev["cuda_visible_devices"] = cvd
        for env, key in (("RANK", "rank"), ("WORLD_SIZE", "world_size"), ("LOCAL_RANK", "local_rank")):
            if key not in ev:
                v = _env_int(env)
                if v is not None:
                    ev[key] = v
        self._rank_gpu: Optional[int] = None
        if "gpus" not in ev and "cuda_visible_devices" not in ev:
            # torchrun leaves CUDA_VISIBLE_DEVICES unset: without a GPU named
            # here the agent gives every rank every GPU of the node.
            choice = _dist.rank_gpu(ev.get("local_rank"))
            if choice is not None:
                self._rank_gpu, why = choice
                ev["gpus"] = [self._rank_gpu]
                log.info(
                    "trainmeter: run %s, local rank %s: reporting GPU %d (%s; no gpus= and no "
                    "CUDA_VISIBLE_DEVICES); pass gpus=[...] to name others",
                    self.run_id,
                    ev.get("local_rank"),
                    self._rank_gpu,
                    why,
                )
        return ev

    def _count_caller_drop(self) -> None:
        try:
            with self._lock:
                self._dropped_caller += 1
        except Exception:
            pass

    def _enqueue(self, ev: Dict[str, Any]) -> None:
        if self._ended:
            return
        try:
            self._q.put_nowait(ev)
        except queue.Full:
            self._count_caller_drop()
            return
        self._wake()

    def _wake(self, force: bool = False) -> None:
        """Wake the sender if it is blocked. It sets _waiting before it looks
        at the queue a last time, and a caller looks at _waiting after its
        put: one of the two always sees the other."""
        if (self._waiting or force) and self._wake_w is not None:
            self._waiting = False
            try:
                self._wake_w.send(b"\0")
            except OSError:  # full: a wake is pending anyway
                pass

    def _stop_sender(self) -> None:
        self._abort.set()
        self._wake(force=True)

    # ---- sender thread

    def _resolve_gpus(self) -> None:
        if self._rank_gpu is not None and self._gpu_uuids:
            # The rank's CUDA index as a UUID where CUDA and NVML order
            # provably agree; else the index stays (NVML order assumed).
            try:
                uuids = _dist.cuda_visible_gpu_uuids(str(self._rank_gpu), env={
                    k: v for k, v in os.environ.items() if k == "CUDA_DEVICE_ORDER"})
                if uuids:
                    ev = dict(self._start_event)
                    ev["gpus"] = uuids
                    self._start_event, self._start_line = ev, encode_event(ev)[0]
            except Exception:
                log.debug("trainmeter: GPU UUID mapping failed", exc_info=True)
        if not self._map_gpus:
            return
        try:
            uuids = _dist.cuda_visible_gpu_uuids(self._start_event.get("cuda_visible_devices"))
            if uuids:
                ev = dict(self._start_event)
                ev["gpus"] = uuids
                line, _ = encode_event(ev)
                self._start_event, self._start_line = ev, line
        except Exception:
            log.debug("trainmeter: GPU UUID mapping failed", exc_info=True)

    def _sender_main(self) -> None:
        try:
            self._resolve_gpus()
            self._sender_loop()
        except Exception:  # pragma: no cover - defensive
            log.debug("trainmeter: sender thread crashed", exc_info=True)
        finally:
            self._connected = False
            # Anything left in the queue is lost.
            self._drain_drop()
            # The sender exits only after end(): no caller wakes it any more
            # (and a closed socket has fd -1, so a late _wake() fails cleanly).
            for s in (self._wake_r, self._wake_w):
                if s is not None:
                    s.close()

    def _drain_drop(self) -> bool:
        """Drop everything queued; return True if the end marker was seen."""
        saw_end = False
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                return saw_end
            if item is _END:
                saw_end = True
            self._dropped += 1  # run_end counts as a dropped event too

    def _wait_dropping(self, seconds: float) -> bool:
        """Sleep up to `seconds` while disconnected, dropping (and counting) what
        training enqueues meanwhile. Returns True if the end marker arrived."""
        deadline = time.monotonic() + seconds
        while not self._abort.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._wakeups += 1
            try:
                item = self._q.get(timeout=left)
            except queue.Empty:
                continue
            self._dropped += 1  # an undeliverable run_end counts as dropped too
            if item is _END:
                return True
        return True

    def _sender_loop(self) -> None:
        backoff = self._reconnect_min
        logged_absent = False
        while not self._abort.is_set():
            conn = self._connect()
            if conn is None:
                if not logged_absent:
                    if self._connects == 0:
                        # Otherwise the script exits 0 with no run recorded and
                        # nothing said (a wrong socket path, no agent).
                        _warn_once(
                            ("unreachable", self.socket_path),
                            "trainmeter: agent not reachable at %s (%s): run %s is not being measured; "
                            "training goes on, steps are dropped until the agent answers "
                            "(socket: start(socket_path=...) or $%s)",
                            self.socket_path,
                            self._connect_error or "no answer",
                            self.run_id,
                            ENV_SOCKET,
                        )
                    log.debug("trainmeter: agent not reachable at %s; dropping events until it is", self.socket_path)
                    logged_absent = True
                if self._wait_dropping(backoff):
                    return  # ending while disconnected: nothing more to do
                backoff = min(self._reconnect_max, backoff * 2)
                continue

            logged_absent = False
            self._connects += 1
            self._connected = True
            if self._connects > 1:
                log.debug("trainmeter: reconnected to agent at %s", self.socket_path)
            began = time.monotonic()
            finished = self._serve(conn)
            self._connected = False
            self._close_conn(conn)
            if finished:
                return
            # The connection broke. Back off before reconnecting; keep growing the
            # backoff if connections keep breaking quickly (agent crash-looping).
            if time.monotonic() - began > 2 * self._reconnect_max:
                backoff = self._reconnect_min
            if self._wait_dropping(backoff):
                return
            backoff = min(self._reconnect_max, backoff * 2)

    def _connect(self) -> Optional[_Conn]:
        s = None
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(self._connect_timeout)
            s.connect(self.socket_path)
            s.setblocking(False)
        except (OSError, ValueError) as e:
            self._connect_error = getattr(e, "strerror", None) or str(e)
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
            return None
        conn = _Conn(s)
        # run_start always goes first on a new connection so the agent can (re)join.
        conn.out += self._start_line
        conn.pending.append(len(self._start_line))
        return conn

    def _close_conn(self, conn: _Conn) -> None:
        # Whole lines not yet written are lost; count them (a partially written
        # head line is lost too).
        self._dropped += len(conn.pending)
        conn.pending.clear()
        conn.out.clear()
        try:
            conn.sock.close()
        except OSError:
            pass

    def _append(self, conn: _Conn, ev: Dict[str, Any], force: bool = False) -> bool:
        try:
            line, removed = encode_event(ev)
        except Exception:
            log.debug("trainmeter: cannot encode event %r", ev.get("event"), exc_info=True)
            self._dropped += 1
            return False
        self._nonfinite += removed
        if not force and len(conn.out) + len(line) > self._max_buffer:
            self._dropped += 1
            return False
        conn.out += line
        conn.pending.append(len(line))
        return True

    def _serve(self, conn: _Conn) -> bool:
        """Run one connection. Returns True when the run is finished (end flushed
        or abort), False when the connection broke and we should reconnect."""
        ending = False
        sock = conn.sock
        while True:
            if self._abort.is_set():
                return True
            # 1. Move queued events into the connection's bounded output buffer.
            if not ending:
                n = 0
                while n < 1000:
                    try:
                        item = self._q.get_nowait()
                    except queue.Empty:
                        break
                    n += 1
                    if item is _END:
                        ending = True
                        self._append(conn, self._end_event, force=True)
                        break
                    self._append(conn, item)
            if ending and not conn.out:
                return True
            # 2. Wait for work: a line from the agent, room for what is
            # buffered, a queued event (a byte on the wake pair), or the send
            # deadline of what is buffered.
            self._waiting = True
            if (not ending and not self._q.empty()) or self._abort.is_set():
                timeout: Optional[float] = 0.0
            elif conn.out:
                timeout = max(0.0, conn.last_progress + self._send_timeout - time.monotonic())
            else:
                timeout = None
            if self._wake_r is None:
                timeout = min(timeout, 0.02) if timeout is not None else 0.02
            waits = [sock] if self._wake_r is None else [sock, self._wake_r]
            self._wakeups += 1
            try:
                r, w, _ = select.select(waits, [sock] if conn.out else [], [], timeout)
            except (OSError, ValueError):
                return self._broken(conn, "select failed", ending)
            finally:
                self._waiting = False
            if self._wake_r is not None and self._wake_r in r:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except OSError:  # drained
                    pass
            # 3. Read what the agent wrote back.
            if sock in r:
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    data = None
                except OSError as e:
                    return self._broken(conn, "recv: %s" % e, ending)
                if data == b"":
                    return self._broken(conn, "agent closed the connection", ending)
                if data:
                    self._handle_incoming(conn, data)
            # 4. Write.
            if w and conn.out:
                try:
                    n = sock.send(conn.out)
                except (BlockingIOError, InterruptedError):
                    n = 0
                except OSError as e:
                    if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                        n = 0
                    else:
                        return self._broken(conn, "send: %s" % e, ending)
                if n > 0:
                    del conn.out[:n]
                    conn.last_progress = time.monotonic()
                    self._account_written(conn, n)
            if conn.out and time.monotonic() - conn.last_progress > self._send_timeout:
                return self._broken(conn, "agent not reading for %.1fs" % self._send_timeout, ending)
            if not conn.out:
                conn.last_progress = time.monotonic()

    def _account_written(self, conn: _Conn, n: int) -> None:
        conn.head_sent += n
        while conn.pending and conn.head_sent >= conn.pending[0]:
            conn.head_sent -= conn.pending.popleft()
            self._sent += 1

    def _broken(self, conn: _Conn, why: str, ending: bool) -> bool:
        log.debug("trainmeter: connection to agent lost (%s)", why)
        conn.head_sent = 0
        # When ending, don't reconnect just to send run_end of a dead connection:
        # the agent sees the disconnect; whatever is left is dropped and counted.
        return ending

    def _handle_incoming(self, conn: _Conn, data: bytes) -> None:
        conn.inbuf += data
        while True:
            i = conn.inbuf.find(b"\n")
            if i < 0:
                if len(conn.inbuf) > _MAX_IN_LINE:
                    conn.inbuf.clear()
                return
            raw = bytes(conn.inbuf[:i])
            del conn.inbuf[: i + 1]
            if raw.strip():
                self._handle_line(raw)

    def _handle_line(self, raw: bytes) -> None:
        try:
            msg = json.loads(raw.decode("utf-8", "replace"))
        except ValueError:
            log.debug("trainmeter: unparseable line from agent: %r", raw[:200])
            return
        if not isinstance(msg, dict):
            return
        kind = msg.get("event")
        rid = msg.get("run_id")
        if rid is not None and rid != self.run_id:
            return
        if kind == "error":
            self._errors_from_agent += 1
            text = str(msg.get("error", ""))
            line = msg.get("line")
            line = line if isinstance(line, int) and not isinstance(line, bool) else None
            err = AgentError(error=text, line=line)
            log.debug("trainmeter: agent error: %s (line %s)", text, line)
            # run_start is line 1 of every connection.
            if (line == 1 or text.startswith("run_start")) and not self._warned_run_start:
                self._warned_run_start = True
                self._start_error = err
                if text.startswith("run_start: joined run"):
                    log.warning("trainmeter: agent: %s", text)
                else:
                    log.warning(
                        "trainmeter: the agent refused run %s: %s; this process's steps are not measured "
                        "(training goes on)",
                        self.run_id,
                        text,
                    )
            else:
                self._errors.append(err)
        elif kind == "advice":
            self._advice = Advice.from_line(msg)
            log.debug("trainmeter: advice from agent: %s", msg)
        elif kind == "stop":
            reason = msg.get("reason")
            self.stop_reason = str(reason) if reason is not None else "stop requested by agent"
            self._stop.set()
            log.info("trainmeter: agent asked run %s to stop: %s", self.run_id, self.stop_reason)
        else:
            log.debug("trainmeter: ignoring agent event %r", kind)


_live_runs: "weakref.WeakSet[Run]" = weakref.WeakSet()

_warned: set = set()
_warned_lock = threading.Lock()


def _warn_once(key: Any, fmt: str, *args: Any) -> None:
    """A WARNING on the ``trainmeter`` logger, once per process for ``key``.

    With no logging configured, Python prints warnings to stderr, so a bare
    script shows it; a sweep of many runs against a missing agent says it once."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning(fmt, *args)


@atexit.register
def _end_live_runs() -> None:  # pragma: no cover - exercised at interpreter exit
    for r in list(_live_runs):
        try:
            r.end(timeout=1.0)
        except Exception:
            pass


def start(
    run_id: Optional[str] = None,
    socket_path: Optional[str] = None,
    *,
    model: Optional[str] = None,
    dataset: Optional[str] = None,
    backend: Optional[str] = None,
    optimizer: Optional[str] = None,
    batch_size: Optional[int] = None,
    grad_accum: Optional[int] = None,
    seq_len: Optional[int] = None,
    precision: Optional[str] = None,
    seed: Optional[int] = None,
    notes: Optional[str] = None,
    warmup_s: Optional[float] = None,
    warmup_steps: Optional[int] = None,
    gpus: Optional[Sequence[Union[int, str]]] = None,
    cuda_visible_devices: Optional[str] = None,
    num_workers: Optional[int] = None,
    prefetch_factor: Optional[int] = None,
    planned_steps: Optional[int] = None,
    planned_tokens: Optional[int] = None,
    planned_epochs: Optional[int] = None,
    params: Optional[int] = None,
    dataset_size: Optional[int] = None,
    target_gpu_utilization: Optional[float] = None,
    max_ram_usage: Optional[float] = None,
    adjustment_interval: Optional[int] = None,
    gpu_price_per_hour: Optional[float] = None,
    budget_scope: Optional[str] = None,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    local_rank: Optional[int] = None,
    resume: Optional[bool] = None,
    attribute_pid: Optional[int] = None,
    plan_key: Optional[str] = None,
    labels: Optional[Mapping] = None,
    queue_size: int = _DEFAULT_QUEUE_SIZE,
    send_timeout: float = _DEFAULT_SEND_TIMEOUT_S,
    connect_timeout: float = _DEFAULT_CONNECT_TIMEOUT_S,
    reconnect_min_s: float = _DEFAULT_RECONNECT_MIN_S,
    reconnect_max_s: float = _DEFAULT_RECONNECT_MAX_S,
    end_timeout: float = _DEFAULT_END_TIMEOUT_S,
    max_buffer_bytes: int = _DEFAULT_MAX_BUFFER_BYTES,
    gpu_uuids: bool = True,
    client_id: Optional[str] = None,
) -> Run:
    """Start reporting a run and return its :class:`Run`.

    ``run_id``: argument, else env ``TRAINMETER_RUN_ID``, else generated.
    ``socket_path``: argument, else env ``TRAINMETER_SOCKET``, else
    ``/run/trainmeter/agent.sock``. Inside a Slurm job with no run id given,
    the run is the job's (``slurm-<cluster>-<job>``, the run the agent bills
    the job's GPU processes to; docs/attribution.md). Otherwise, with several
    ranks (``WORLD_SIZE`` > 1) and no run id given, every rank derives the
    same id (see :func:`trainmeter.dist.derive_run_id`).

    Run metadata (``model`` … ``plan_key``: the keys of ``run_start``,
    docs/protocol.md) is sent as given; keywords left as None are not sent.
    ``rank`` / ``world_size`` / ``local_rank`` and ``cuda_visible_devices``
    default to ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` and
    ``CUDA_VISIBLE_DEVICES``. ``resume=True`` continues a run that has ended;
    without it the agent refuses an ended run id (see ``errors()``), so a
    script run twice with a fixed ``run_id`` never reopens the first run by
    accident. ``labels``: free labels of the run (``{"team": "nlp"}``; string,
    number or bool values).

    A keyword that is not one of these raises ``TypeError`` here (a typo such
    as ``batch_sise=8`` must not become a label); so does a label named like
    a metadata keyword (``ValueError``). Nothing else ever raises: an agent
    that is absent or refuses the run costs a WARNING, not the training.

    Client options (not sent): ``queue_size`` (10000), ``send_timeout`` (5 s
    without write progress before the connection is dropped), ``connect_timeout``
    (1 s), ``reconnect_min_s`` / ``reconnect_max_s`` (1 s / 5 s backoff),
    ``end_timeout`` (2 s), ``max_buffer_bytes`` (256 KiB per connection),
    ``gpu_uuids`` (True: when ``gpus`` is not given, send ``CUDA_VISIBLE_DEVICES``
    mapped to GPU UUIDs as ``gpus`` if that mapping is unambiguous),
    ``client_id`` (this process's id to the agent; a fresh random one by default).
    """
    given = locals()
    return Run(
        run_id=run_id,
        socket_path=socket_path,
        metadata={k: given[k] for k in METADATA_KEYS},
        labels=labels,
        queue_size=queue_size,
        send_timeout=send_timeout,
        connect_timeout=connect_timeout,
        reconnect_min_s=reconnect_min_s,
        reconnect_max_s=reconnect_max_s,
        end_timeout=end_timeout,
        max_buffer_bytes=max_buffer_bytes,
        gpu_uuids=gpu_uuids,
        client_id=client_id,
    )


def check_start_kwargs(kwargs: Mapping) -> None:
    """Raise ``TypeError`` for a keyword :func:`start` does not take (the
    framework callbacks check theirs when created, not when training starts)."""
    inspect.signature(start).bind(**kwargs)

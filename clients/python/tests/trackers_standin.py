"""Stand-ins for the ``mlflow`` and ``wandb`` modules (neither can be installed
here), inserted into ``sys.modules`` by the tests. Each follows the library's
documented API and the behaviour the integration depends on:

* mlflow (fluent API): ``start_run``/``end_run``/``active_run``, the active run
  kept per thread (as MLflow does), ``log_metrics(metrics, step=None,
  synchronous=None, run_id=None, timestamp=None)``, ``log_params``,
  ``set_tags``; a fluent call with no active run starts a new run (as MLflow
  does), so logging from the wrong thread shows up as a second run; a param
  logged again with another value raises (params are immutable);
  ``MlflowClient().set_tag(run_id, k, v)`` / ``log_param(run_id, k, v)``.
* wandb: ``init()`` sets ``wandb.run``; a run has ``log(data, step=None,
  commit=None)``, ``summary`` (a mapping), ``config.update(d,
  allow_val_change=False)`` (changing a value without allow_val_change
  raises), ``define_metric(name, step_metric=None)``.

``dump()`` gives what each recorded, as JSON-able dicts (the e2e test reads it).
"""

import math
import threading
import types
import uuid


def _check_metric(k, v):
    if not isinstance(k, str) or not k:
        raise ValueError("metric key %r" % (k,))
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError("metric %s: %r is not a finite number" % (k, v))


class _MlflowRun:
    def __init__(self, run_id):
        self.run_id = run_id
        self.metrics = []  # [key, value, step, thread name]
        self.params = {}
        self.tags = {}
        self.status = "RUNNING"

    def dump(self):
        return {"run_id": self.run_id, "metrics": self.metrics, "params": self.params, "tags": self.tags,
                "status": self.status}


class StandinMlflow(types.ModuleType):
    def __init__(self):
        super().__init__("mlflow")
        self.runs = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        standin = self

        class MlflowClient:
            def set_tag(self, run_id, key, value):
                standin.runs[run_id].tags[key] = str(value)

            def log_param(self, run_id, key, value):
                standin._param(standin.runs[run_id], key, value)

        self.MlflowClient = MlflowClient

    def _stack(self):
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def start_run(self):
        r = _MlflowRun(uuid.uuid4().hex)
        with self._lock:
            self.runs[r.run_id] = r
        self._stack().append(r.run_id)
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id=r.run_id))

    def end_run(self):
        st = self._stack()
        if st:
            self.runs[st.pop()].status = "FINISHED"

    def active_run(self):
        st = self._stack()
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id=st[-1])) if st else None

    def _run(self, run_id=None):
        if run_id is not None:
            return self.runs[run_id]
        if not self._stack():
            self.start_run()
        return self.runs[self._stack()[-1]]

    def _param(self, run, key, value):
        value = str(value)
        if key in run.params and run.params[key] != value:
            raise ValueError("param %s already logged as %r" % (key, run.params[key]))
        run.params[key] = value

    def log_metrics(self, metrics, step=None, synchronous=None, run_id=None, timestamp=None):
        run = self._run(run_id)
        for k, v in metrics.items():
            _check_metric(k, v)
        if step is not None and not isinstance(step, int):
            raise TypeError("step must be an int")
        with self._lock:
            for k, v in metrics.items():
                run.metrics.append([k, float(v), 0 if step is None else step, threading.current_thread().name])

    def log_params(self, params, synchronous=None, run_id=None):
        run = self._run(run_id)
        for k, v in params.items():
            self._param(run, k, v)

    def set_tags(self, tags, synchronous=None):
        run = self._run()
        for k, v in tags.items():
            run.tags[k] = str(v)

    def dump(self):
        return {"runs": [r.dump() for r in self.runs.values()]}


class _WandbConfig(dict):
    def update(self, d, allow_val_change=False):  # type: ignore[override]
        for k, v in dict(d).items():
            if k in self and self[k] != v and not allow_val_change:
                raise ValueError("config %s changed without allow_val_change" % k)
            self[k] = v


class StandinWandbRun:
    def __init__(self):
        self.history = []  # rows as logged
        self.summary = {}
        self.config = _WandbConfig()
        self.defined = {}
        self._lock = threading.Lock()

    def log(self, data, step=None, commit=None):
        for k, v in data.items():
            _check_metric(k, v)
        with self._lock:
            self.history.append(dict(data))
            self.summary.update(data)  # W&B's default summary is the last value

    def define_metric(self, name, step_metric=None, **kw):
        self.defined[name] = step_metric

    def dump(self):
        return {"history": self.history, "summary": self.summary, "config": dict(self.config),
                "defined": self.defined}


class StandinWandb(types.ModuleType):
    def __init__(self):
        super().__init__("wandb")
        self.run = None

    def init(self, **kw):
        self.run = StandinWandbRun()
        return self.run

    def log(self, data, step=None, commit=None):
        self.run.log(data, step=step, commit=commit)

    def finish(self):
        self.run = None

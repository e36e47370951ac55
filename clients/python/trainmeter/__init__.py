"""trainmeter: report a training run's tokens and timings to the local trainmeter agent.

    import trainmeter
    run = trainmeter.start(run_id="r1", model="llama-3-8b", batch_size=8, seq_len=2048,
                           labels={"team": "nlp"})
    run.step(step=i, tokens=65536, samples=32, data_wait_s=0.012, compute_s=0.41, loss=2.31)
    run.eval(epoch=1, val_loss=1.93)
    run.end()

Stdlib only. Never blocks or raises into the training loop (``start()``
raises ``TypeError`` for a keyword it does not know: a programming error);
see ``trainmeter.client``. DataLoader timing: :class:`TimedLoader`,
:func:`rebuild_dataloader`, and :class:`AdaptiveLoader` (applies the agent's
advice at epoch boundaries). Framework callbacks:
``trainmeter.integrations.hf`` and ``trainmeter.integrations.lightning``;
figures into MLflow / W&B: ``trainmeter.integrations.mlflow`` and
``trainmeter.integrations.wandb`` (all imported only when you import them).
"""

from .client import Advice, AgentError, Run, Stats, start
from .loader import AdaptiveLoader, TimedLoader, count_tokens, rebuild_dataloader

__version__ = "0.1.0"

__all__ = [
    "AdaptiveLoader",
    "Advice",
    "AgentError",
    "Run",
    "Stats",
    "TimedLoader",
    "count_tokens",
    "rebuild_dataloader",
    "start",
]

"""trainmeter: report a training run's tokens and timings to the local trainmeter agent.

    import trainmeter
    run = trainmeter.start(run_id="r1", model="llama-3-8b", batch_size=8, seq_len=2048)
    run.step(step=i, tokens=65536, samples=32, data_wait_s=0.012, compute_s=0.41, loss=2.31)
    run.end()

Stdlib only. Never blocks or raises into the training loop; see ``trainmeter.client``.
DataLoader timing: :class:`TimedLoader`, :func:`rebuild_dataloader`, and
:class:`AdaptiveLoader` (applies the agent's advice at epoch boundaries). Framework
callbacks: ``trainmeter.integrations.hf`` and ``trainmeter.integrations.lightning``
(imported only when you import them).
"""

from .client import DEFAULT_SOCKET, ENV_RUN_ID, ENV_SOCKET, Run, encode_event, start
from .dist import cuda_visible_gpu_uuids, derive_run_id, rank_info
from .loader import AdaptiveLoader, TimedLoader, advised_settings, count_tokens, rebuild_dataloader

__version__ = "0.1.0"

__all__ = [
    "AdaptiveLoader",
    "DEFAULT_SOCKET",
    "ENV_RUN_ID",
    "ENV_SOCKET",
    "Run",
    "TimedLoader",
    "advised_settings",
    "count_tokens",
    "cuda_visible_gpu_uuids",
    "derive_run_id",
    "encode_event",
    "rank_info",
    "rebuild_dataloader",
    "start",
    "__version__",
]

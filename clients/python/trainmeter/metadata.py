"""The run metadata :func:`trainmeter.start` sends in ``run_start``.

``METADATA_KEYS`` names the keys the agent's ``run_start`` reads itself
(docs/protocol.md), less those the client fills on its own
(``PROTOCOL_KEYS``). ``start()`` takes exactly these as typed keywords, in
this order (a test checks its signature against this tuple); every other
key goes in ``labels={...}``.
"""

METADATA_KEYS = (
    "model",
    "dataset",
    "backend",
    "optimizer",
    "batch_size",
    "grad_accum",
    "seq_len",
    "precision",
    "seed",
    "notes",
    "warmup_s",
    "warmup_steps",
    "gpus",
    "cuda_visible_devices",
    "num_workers",
    "prefetch_factor",
    "planned_steps",
    "planned_tokens",
    "planned_epochs",
    "params",
    "dataset_size",
    "target_gpu_utilization",
    "max_ram_usage",
    "adjustment_interval",
    "gpu_price_per_hour",
    "budget_scope",
    "rank",
    "world_size",
    "local_rank",
    "resume",
    "attribute_pid",
    "plan_key",
)

# Keys of run_start the client fills itself: never metadata, never a label.
PROTOCOL_KEYS = ("event", "run_id", "client_id")

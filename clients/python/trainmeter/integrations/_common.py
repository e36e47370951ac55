"""Helpers shared by the integrations (stdlib only)."""

from __future__ import annotations

import math
from typing import Any, Optional


def scalar(x: Any) -> Optional[float]:
    """A finite float from a number, numpy scalar or 0-d tensor; else None."""
    if x is None or isinstance(x, bool):
        return None
    try:
        if hasattr(x, "item") and callable(x.item):
            x = x.item()
        v = float(x)
    except Exception:
        return None
    return v if math.isfinite(v) else None


def integer(x: Any) -> Optional[int]:
    """An int from an int-like value (incl. 0-d tensors); None for bools/None/garbage."""
    if x is None or isinstance(x, bool):
        return None
    try:
        if hasattr(x, "item") and callable(x.item):
            x = x.item()
        if isinstance(x, float):
            if not math.isfinite(x) or x != int(x):
                return None
        return int(x)
    except Exception:
        return None


def share(total: int, world_size: Optional[int], rank: Optional[int]) -> int:
    """This rank's share of a count that covers all ranks: an even split, with
    the remainder on rank 0, so the shares of all ranks add up to ``total``."""
    ws = world_size if world_size and world_size > 1 else 1
    if ws == 1:
        return total
    base, rem = divmod(total, ws)
    return base + (rem if (rank or 0) == 0 else 0)


def param_count(model: Any) -> Optional[int]:
    """Parameters of a torch-like module (``parameters()`` yielding tensors),
    each shared tensor once: the ``params`` of FLOPs = 6 × params × tokens.

    DeepSpeed ZeRO-3 leaves each rank an empty partition: its ``ds_numel`` is
    the full size. Other sharding (FSDP with flat parameters) shows a rank only
    its shard; pass ``params=`` there. None when nothing can be counted."""
    if model is None:
        return None
    try:
        params = getattr(model, "parameters", None)
        if not callable(params):
            return None
        seen = set()
        n = 0
        for p in params():
            if id(p) in seen:
                continue
            seen.add(id(p))
            k = getattr(p, "ds_numel", None)
            if k is None:
                k = p.numel()
            n += int(k)
        return n if n > 0 else None
    except Exception:
        return None

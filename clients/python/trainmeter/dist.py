"""torchrun / DDP awareness (stdlib only).

* :func:`rank_info` reads ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``.
* :func:`derive_run_id` gives every rank of a multi-process job the same run id
  when ``TRAINMETER_RUN_ID`` is not set (see the order of sources there).
* :func:`cuda_visible_gpu_uuids` maps ``CUDA_VISIBLE_DEVICES`` to GPU UUIDs with
  ``nvidia-smi -L`` (or pynvml), so the agent attributes the right GPUs even
  when indices would be ambiguous (containers, CUDA vs NVML ordering).

Nothing here raises or blocks for long: ``nvidia-smi`` runs at most once per
process, with a 2 s timeout, and every failure just means "no answer".
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple

log = logging.getLogger("trainmeter")

__all__ = ["rank_info", "rank_gpu", "derive_run_id", "slurm_job_run_id", "cuda_visible_gpu_uuids", "gpu_table"]

_NVIDIA_SMI_TIMEOUT_S = 2.0


def _int(env: Mapping[str, str], name: str) -> Optional[int]:
    v = env.get(name)
    if v is None or v.strip() == "":
        return None
    try:
        return int(v.strip())
    except ValueError:
        return None


def rank_info(env: Optional[Mapping[str, str]] = None) -> Dict[str, int]:
    """``{"rank": …, "world_size": …, "local_rank": …}`` from the environment
    (torchrun, accelerate, deepspeed and Lightning set these); absent keys are left out."""
    env = os.environ if env is None else env
    out: Dict[str, int] = {}
    for name, key in (("RANK", "rank"), ("WORLD_SIZE", "world_size"), ("LOCAL_RANK", "local_rank")):
        v = _int(env, name)
        if v is not None:
            out[key] = v
    return out


def rank_gpu(local_rank: Any = None, env: Optional[Mapping[str, str]] = None) -> Optional[Tuple[int, str]]:
    """The CUDA device index of this rank and where it came from, for a
    distributed process that names no GPU; None for a single process.

    Only a process with a local rank (``local_rank`` or ``LOCAL_RANK``, set by
    torchrun, accelerate, deepspeed, Lightning) gets one: a single process may
    use every GPU (``DataParallel``). The local rank is the device, as torchrun
    expects, unless torch is already imported with CUDA initialised and its
    current device was moved elsewhere (``torch.cuda.set_device``): then that
    device. CUDA is never initialised here."""
    env = os.environ if env is None else env
    lr: Optional[int]
    try:
        lr = int(local_rank) if local_rank is not None and not isinstance(local_rank, bool) else _int(env, "LOCAL_RANK")
    except (TypeError, ValueError):
        lr = _int(env, "LOCAL_RANK")
    if lr is None or lr < 0:
        return None
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            cuda = torch.cuda
            if cuda.is_available() and cuda.is_initialized():
                cur = int(cuda.current_device())
                # 0 is also what a rank that never called set_device sees.
                if cur != lr and cur != 0:
                    return cur, "torch.cuda.current_device()"
                if cur == lr:
                    return cur, "LOCAL_RANK=%d = torch.cuda.current_device()" % lr
        except Exception:
            log.debug("trainmeter: cannot read torch's current CUDA device", exc_info=True)
    return lr, "LOCAL_RANK=%d" % lr


# ---------------------------------------------------------------- shared run id

_SAFE = re.compile(r"[^A-Za-z0-9._:@+-]+")


def _clean(s: str, n: int = 120) -> str:
    return _SAFE.sub("_", s.strip())[:n]


def _proc_start_ticks(pid: int) -> Optional[str]:
    """Start time of a process (clock ticks since boot, Linux), or None."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read().decode("ascii", "replace")
        # comm may contain spaces/parentheses: split after the last ')'.
        fields = data[data.rindex(")") + 2 :].split()
        return fields[19]  # field 22 overall: starttime
    except Exception:
        return None


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except Exception:
        return ""


def slurm_job_run_id(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The run id the agent gives the Slurm job this process runs in,
    ``slurm-<cluster>-<job>`` (``slurm-<job>`` when the cluster has no name),
    or None outside a job. Every rank on every node of the job gets it."""
    env = os.environ if env is None else env
    job = (env.get("SLURM_JOB_ID") or "").strip()
    if not job.isdigit():
        return None
    cluster = re.sub(r"[^A-Za-z0-9._-]+", "_", (env.get("SLURM_CLUSTER_NAME") or "").strip())
    return "slurm-%s-%s" % (cluster, job) if cluster else "slurm-" + job


def derive_run_id(world_size: Optional[int] = None, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """A run id every rank of one multi-process job computes identically, or
    None for a single process (``world_size`` ≤ 1, from the argument or
    ``WORLD_SIZE``).

    Sources, first match wins (``TRAINMETER_RUN_ID`` is checked by the caller
    before this):

    1. ``TORCHELASTIC_RUN_ID`` (torchrun's ``--rdzv-id``; a fresh UUID with
       ``--standalone``), unless it is torchrun's placeholder ``none``:
       ``te-<id>``. Shared by every rank on every node; the same id after an
       elastic restart, so the run continues.
    2. ``SLURM_JOB_ID`` (+ ``SLURM_STEP_ID``): ``slurm-<job>[.<step>]``. Shared
       across nodes.
    3. Otherwise a hash of ``MASTER_ADDR:MASTER_PORT``, the boot id, and the
       launcher process — under torchrun (``TORCHELASTIC_*`` set) the parent
       process, i.e. the elastic agent; otherwise (``mp.spawn``, Lightning,
       deepspeed) the process group — with that process's start time as the
       start-time hint: ``ddp-<host>-<hash>``. All local ranks of one launch
       agree, and a re-launch on the same port gets a new id. Ranks on other
       nodes get a different id (one run per node): for multi-node jobs set
       ``TRAINMETER_RUN_ID`` or ``--rdzv-id``.
    """
    env = os.environ if env is None else env
    ws = world_size if world_size is not None else _int(env, "WORLD_SIZE")
    if ws is None or ws <= 1:
        return None
    te = (env.get("TORCHELASTIC_RUN_ID") or "").strip()
    if te and te.lower() != "none":
        return "te-" + _clean(te)
    job = (env.get("SLURM_JOB_ID") or "").strip()
    if job:
        step = (env.get("SLURM_STEP_ID") or "").strip()
        return "slurm-" + _clean(job) + ("." + _clean(step) if step else "")
    if "TORCHELASTIC_RUN_ID" in env or "TORCHELASTIC_RESTART_COUNT" in env:
        kind, launcher = "ppid", os.getppid()
    else:
        try:
            kind, launcher = "pgid", os.getpgid(0)
        except Exception:
            kind, launcher = "ppid", os.getppid()
    parts = [
        env.get("MASTER_ADDR", ""),
        env.get("MASTER_PORT", ""),
        _boot_id(),
        kind,
        str(launcher),
        _proc_start_ticks(launcher) or "",
    ]
    digest = hashlib.sha1("\x00".join(parts).encode("utf-8", "replace")).hexdigest()[:12]
    host = _clean(socket.gethostname().split(".")[0] or "host", 40)
    return "ddp-%s-%s" % (host, digest)


# ---------------------------------------------------------------- GPU UUIDs

# (index, name, uuid) in NVML order (= PCI bus order), or None if unknown.
_table_lock = threading.Lock()
_table_cache: Optional[Tuple[bool, Optional[List[Tuple[int, str, str]]]]] = None

_SMI_LINE = re.compile(r"^GPU\s+(\d+):\s*(.*?)\s*\(UUID:\s*(GPU-[0-9A-Za-z-]+)\)\s*$")


def _from_nvidia_smi() -> Optional[List[Tuple[int, str, str]]]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        p = subprocess.run(
            [exe, "-L"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            timeout=_NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except Exception:
        return None
    if p.returncode != 0:
        return None
    return parse_nvidia_smi_l(p.stdout.decode("utf-8", "replace"))


def parse_nvidia_smi_l(text: str) -> Optional[List[Tuple[int, str, str]]]:
    """Parse ``nvidia-smi -L`` output into [(index, name, uuid)]; MIG lines are skipped."""
    rows = []
    for line in text.splitlines():
        m = _SMI_LINE.match(line.strip())
        if m:
            rows.append((int(m.group(1)), m.group(2), m.group(3)))
    return rows or None


def _from_pynvml() -> Optional[List[Tuple[int, str, str]]]:
    try:
        import pynvml  # type: ignore
    except Exception:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        rows = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            u = pynvml.nvmlDeviceGetUUID(h)
            n = pynvml.nvmlDeviceGetName(h)
            u = u.decode() if isinstance(u, bytes) else str(u)
            n = n.decode() if isinstance(n, bytes) else str(n)
            rows.append((i, n, u))
        return rows or None
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def gpu_table(refresh: bool = False) -> Optional[List[Tuple[int, str, str]]]:
    """This machine's GPUs as [(nvml_index, name, uuid)], from ``nvidia-smi -L``
    or else pynvml; None when neither works. Cached for the process."""
    global _table_cache
    with _table_lock:
        if _table_cache is not None and not refresh:
            return _table_cache[1]
        rows = None
        try:
            rows = _from_nvidia_smi() or _from_pynvml()
        except Exception:
            rows = None
        _table_cache = (True, rows)
        return rows


def cuda_visible_gpu_uuids(
    cvd: Optional[str] = None,
    table: Optional[List[Tuple[int, str, str]]] = None,
    env: Optional[Mapping[str, str]] = None,
) -> Optional[List[str]]:
    """Map ``CUDA_VISIBLE_DEVICES`` to full GPU UUIDs, or None when that cannot
    be done unambiguously. Never raises.

    * unset, empty or ``-1`` (no GPUs), MIG entries: None;
    * ``GPU-…`` entries (CUDA accepts unique prefixes) are completed from the table;
    * indices are looked up in the table (NVML order). CUDA numbers devices
      fastest-first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; the two orders agree
      when all GPUs are the same model, so indices are mapped only when
      ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or every GPU has the same name.
    """
    try:
        env = os.environ if env is None else env
        if cvd is None:
            cvd = env.get("CUDA_VISIBLE_DEVICES")
        if cvd is None:
            return None
        entries = [e.strip() for e in cvd.split(",")]
        if not entries or any(e == "" for e in entries):
            return None
        if any(e.upper().startswith("MIG-") for e in entries):
            return None
        if table is None:
            table = gpu_table()
        if not table:
            return None
        out: List[str] = []
        by_index = {i: u for i, _, u in table}
        for e in entries:
            if e.upper().startswith("GPU-"):
                matches = [u for _, _, u in table if u.lower().startswith(e.lower())]
                if len(matches) != 1:
                    return None
                out.append(matches[0])
                continue
            try:
                idx = int(e)
            except ValueError:
                return None
            if idx < 0:
                return None
            if idx not in by_index:
                return None
            order = (env.get("CUDA_DEVICE_ORDER") or "").strip().upper()
            if order != "PCI_BUS_ID" and len({n for _, n, _ in table}) > 1:
                return None
            out.append(by_index[idx])
        if len(set(out)) != len(out):
            return None
        return out
    except Exception:
        log.debug("trainmeter: cannot map CUDA_VISIBLE_DEVICES to GPU UUIDs", exc_info=True)
        return None

"""What the report core learns from the process it runs in: rank, world size, host, script name.

Frameworks are consulted only when the training script has already imported them (looked up in
``sys.modules``): the report core never imports torch or JAX itself.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .protocol import Identity, sanitize_name

__all__ = ["default_job_name", "detect_identity"]


def _int_env(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            return int(raw)
        except ValueError:
            continue
    return None


def _torch_distributed() -> tuple[int, int] | None:
    dist: Any = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # a half-initialised process group must not stop a run from starting
        return None
    return None


def _jax_process() -> tuple[int, int] | None:
    jax: Any = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        count = int(jax.process_count())
        return int(jax.process_index()), count
    except Exception:
        return None


def detect_identity(environ: Mapping[str, str] | None = None) -> Identity:
    """Global rank, world size and local rank, in the order of the most reliable source.

    torch.distributed when initialised; else ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (torchrun,
    Accelerate, DeepSpeed); else ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``; else Open MPI's
    variables; else ``PET_NODE_RANK``/``PET_NNODES`` (a Kubeflow TrainJob's pod that runs one process
    per node, without torchrun); else the JAX process index when JAX is loaded; else a single process.
    """
    env = os.environ if environ is None else environ
    local_rank = _int_env(env, "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK") or 0
    found = _torch_distributed()
    if found is None:
        for rank_var, size_var in (
            ("RANK", "WORLD_SIZE"),
            ("SLURM_PROCID", "SLURM_NTASKS"),
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
            ("PET_NODE_RANK", "PET_NNODES"),
        ):
            rank, size = _int_env(env, rank_var), _int_env(env, size_var)
            if rank is not None and size is not None:
                found = (rank, size)
                break
    if found is None:
        found = _jax_process()
    rank, size = found if found is not None else (0, 1)
    if size < 1 or not 0 <= rank < size:
        rank, size = 0, 1
    return Identity(
        rank=rank,
        world_size=size,
        local_rank=max(local_rank, 0),
        host=socket.gethostname()[:253],
        pid=os.getpid(),
    )


def default_job_name() -> str:
    """A job name from the script being run (``train.py`` becomes ``train``)."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    stem = Path(argv0).stem if argv0 not in ("", "-c", "-m") else ""
    if stem in ("__main__", "ipykernel_launcher", ""):
        stem = "job"
    return sanitize_name(stem)

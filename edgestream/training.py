"""What both training recipes (speculative streams, speech) share: process groups and atomic
checkpoints. Neither engine imports the other, so this lives beside them."""

from __future__ import annotations

import atexit
import contextlib
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def distributed_context() -> tuple[int, int]:
    """(rank, world size); joins the gloo process group when launched by torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
        # Left to interpreter teardown, gloo's threads are destroyed while still joinable and
        # the process aborts ("terminate called without an active exception", seen in CI
        # after a finished run): leave the group explicitly instead.
        atexit.register(_leave_process_group)
    return (dist.get_rank(), world) if world > 1 else (0, 1)


def _leave_process_group() -> None:
    if dist.is_initialized():
        # Leave together: a rank that tears gloo down while its peer still talks to it can
        # abort the same way. A peer that already died must not hold this one up for long.
        with contextlib.suppress(RuntimeError):
            dist.monitored_barrier(timeout=timedelta(seconds=30))
        dist.destroy_process_group()


def save_atomic(obj: object, path: Path) -> None:
    """torch.save to a temporary name, then rename: a crash never leaves half a checkpoint."""
    temporary = path.with_name(f".{path.name}.tmp")
    torch.save(obj, temporary)
    os.replace(temporary, path)

"""The launch's process group: created once by ``wrap()``, destroyed by ``finish()`` or at exit.

Left to the interpreter's teardown, gloo's background threads can outlive the process group and abort
the process (SIGABRT, "terminate called without an active exception") after training has finished:
seen on 3 of 10 two-rank FSDP2 runs on CPU. So a group ``wrap()`` creates is destroyed by an ``atexit``
hook (no barrier there: a rank may be exiting on an error), and ``finish()``, the documented last call of
a script, waits for every rank first, as torchtitan's trainer does in ``close()``.
"""

from __future__ import annotations

import atexit

import torch
import torch.distributed as dist

from wrappers.launch_env import LaunchEnv


def init_launch_group(env: LaunchEnv) -> None:
    """The default process group for this launch (NCCL with GPUs, else gloo), unless one exists; the
    one created here is destroyed at exit."""
    if dist.is_initialized():
        return
    if env.num_gpus:
        torch.cuda.set_device(env.local_rank)
    dist.init_process_group("nccl" if env.num_gpus else "gloo")
    atexit.register(destroy_process_group)


def destroy_process_group() -> None:
    """Destroy the default process group if one is left; no barrier."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def finish() -> None:
    """End a training script that ``wrap()`` distributed: every rank waits for the others (so none tears
    down a connection another still uses), then the process group is destroyed. Safe to call twice, or
    without a process group."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    destroy_process_group()

"""The launch's process group: created once by ``wrap()``, destroyed by ``finish()`` or at exit.

Left to the interpreter's teardown, gloo's background threads can outlive the process group and abort
the process (SIGABRT, "terminate called without an active exception") after training has finished:
seen on 3 of 10 two-rank FSDP2 runs on CPU. So a group ``wrap()`` creates is destroyed by an ``atexit``
hook, and ``finish()``, the documented last call of a script, waits for every rank first, as torchtitan's
trainer does in ``close()``. The hook waits too, on gloo, but at most ``AT_EXIT_WAIT_S`` (a rank may be exiting
on an error while the others train): a rank that destroyed its group while the other's threads still read the
connection aborted that other rank under a loaded two-worker test run (the exit-status test, twice in a day).
"""

from __future__ import annotations

import atexit
from datetime import timedelta

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
    atexit.register(destroy_at_exit)


AT_EXIT_WAIT_S = 30  # how long a rank waits at exit for the others before destroying its group anyway


def destroy_at_exit() -> None:
    """The ``atexit`` hook: on gloo, wait up to ``AT_EXIT_WAIT_S`` for every rank (``monitored_barrier``, which
    gives up with an error when a rank does not arrive), then destroy the group."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() == "gloo":
        try:
            dist.monitored_barrier(timeout=timedelta(seconds=AT_EXIT_WAIT_S))
        except RuntimeError:  # a rank gone or not arriving (exiting on an error): destroy anyway
            pass
    destroy_process_group()


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

"""The launch's process group: created once by ``wrap()``, destroyed by ``finish()`` or at exit.

Left to the interpreter's teardown, gloo's background threads can outlive the process group and abort
the process (SIGABRT, "terminate called without an active exception") after training has finished:
seen on 3 of 10 two-rank FSDP2 runs on CPU. So a group ``wrap()`` creates is destroyed by an ``atexit``
hook, and ``finish()``, the documented last call of a script, waits for every rank first, as torchtitan's
trainer does in ``close()``. On gloo the hook waits too when the script ends normally (``destroy_at_exit``): a
rank that destroyed its group while the other's threads still read the connection aborted that other rank under
a loaded two-worker test run (the exit-status test, twice in a day). A rank ending on an uncaught exception does
not wait, so that a crash is not turned into a hang.
"""

from __future__ import annotations

import atexit
import sys
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
    sys.excepthook = _note_failure(sys.excepthook)
    atexit.register(destroy_at_exit)


AT_EXIT_WAIT_S = 30  # how long a rank exiting normally waits at exit for the others


_failed: list[bool] = []  # set by the excepthook wrapper: this process is exiting on an uncaught exception


def _note_failure(previous):
    def hook(*args):
        _failed.append(True)
        return previous(*args)
    return hook


def destroy_at_exit() -> None:
    """The ``atexit`` hook: on gloo, a rank exiting normally first waits for the others (``monitored_barrier``, at
    most ``AT_EXIT_WAIT_S`` for a rank that does not arrive), then destroys the group. A rank exiting on an uncaught
    exception does not wait: another rank may be inside a collective it will never join, and gloo's barrier send
    is bounded only by the group's own timeout (a crash would become a hang), so it destroys the group at once and
    the others' collectives fail."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() == "gloo" and not _failed:
        try:
            dist.monitored_barrier(timeout=timedelta(seconds=AT_EXIT_WAIT_S))
        except BaseException:  # a rank gone or not arriving, or an interrupt: destroy anyway
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

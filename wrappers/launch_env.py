"""The one place ``wrap()`` reads the outside world: the launcher's environment variables and the
GPUs this process sees. Everything downstream receives a ``LaunchEnv`` and reads nothing else.

Variables: ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` (torchrun and
``accelerate launch`` both set them); ``ACCELERATE_USE_FSDP`` / ``ACCELERATE_USE_DEEPSPEED`` (set by
``accelerate launch`` from an FSDP or DeepSpeed config).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LaunchEnv:
    world_size: int
    rank: int
    local_rank: int
    local_world_size: int
    num_gpus: int  # CUDA devices visible to this process
    gpu_name: str | None  # torch.cuda.get_device_name(), e.g. "NVIDIA H100 80GB HBM3"
    accelerate_plugin: str | None  # "fsdp" or "deepspeed" when accelerate launched us with one

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if self.num_gpus else torch.device("cpu")


def _flag(environ: dict, name: str) -> bool:
    return environ.get(name, "").strip().lower() in ("1", "true", "yes")


def read_launch_env(environ: dict | None = None) -> LaunchEnv:
    """The launcher's view of this process (``environ`` defaults to ``os.environ``)."""
    environ = dict(os.environ if environ is None else environ)
    world = int(environ.get("WORLD_SIZE", "1"))
    num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    plugin = "fsdp" if _flag(environ, "ACCELERATE_USE_FSDP") else "deepspeed" if _flag(environ, "ACCELERATE_USE_DEEPSPEED") else None
    return LaunchEnv(
        world_size=world,
        rank=int(environ.get("RANK", "0")),
        local_rank=int(environ.get("LOCAL_RANK", "0")),
        local_world_size=int(environ.get("LOCAL_WORLD_SIZE", str(world))),
        num_gpus=num_gpus,
        gpu_name=torch.cuda.get_device_name(0) if num_gpus else None,
        accelerate_plugin=plugin,
    )

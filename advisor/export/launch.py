"""``advisor launch``: run a training script under ``accelerate launch`` with an exported config.

Builds the exact command (a list of strings), checks the config can be launched as written (no
unfilled ``<...>`` placeholders from a multi-node export), and runs it, returning its exit code.
The only edge that touches the process environment is ``launch_env``: a CPU test config
(``use_cpu: true``) needs ``ACCELERATE_USE_CPU=true`` in the workers, because accelerate's
``torch.distributed.run`` path does not set it (``utils/launch.py: prepare_multi_gpu_env``).

A GPU config (``use_cpu: false``) is refused on a machine with no NVIDIA GPU (``nvidia-smi``, no
torch import): accelerate 1.15 does not fail there, it starts every rank on the CPU without a
process group, so each rank trains on the whole dataset with no gradient sync and the job exits 0.
FSDP and DeepSpeed need an accelerator (accelerate enables them only on one), and NCCL needs CUDA.
The ``--cpu`` test config (DDP on gloo, fp32) is what runs on such a machine.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

_PLACEHOLDER = re.compile(r"<[A-Z][A-Z0-9_]*>")


def build_launch_command(
    config_path: str | os.PathLike[str], script: str, script_args: Sequence[str] = ()
) -> list[str]:
    """``accelerate launch --config_file PATH SCRIPT ARGS...``."""
    return ["accelerate", "launch", "--config_file", str(config_path), script, *script_args]


def format_command(command: Sequence[str]) -> str:
    """The command as one shell-quoted line (what ``--dry-run`` prints)."""
    return shlex.join(command)


def find_placeholders(config: Mapping[str, Any]) -> list[str]:
    """Unfilled ``<NAME>`` placeholders anywhere in a loaded config, in order, once each."""
    found: list[str] = []

    def visit(value: Any) -> None:
        if isinstance(value, Mapping):
            for item in value.values():
                visit(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)
        elif isinstance(value, str):
            found.extend(p for p in _PLACEHOLDER.findall(value) if p not in found)

    visit(config)
    return found


def load_config(config_path: str | os.PathLike[str]) -> dict[str, Any]:
    with open(config_path, encoding="utf-8") as handle:
        return parse_config(handle.read(), where=config_path)


def parse_config(text: str, *, where: str | os.PathLike[str]) -> dict[str, Any]:
    """An accelerate config's YAML text as a mapping (before it is written, or as read back)."""
    loaded = yaml.safe_load(text)
    if not isinstance(loaded, dict):
        raise ValueError(f"{where} is not an accelerate config (expected a YAML mapping)")
    return loaded


def check_launchable(config_path: str | os.PathLike[str]) -> dict[str, Any]:
    """The loaded config; a one-line ValueError when placeholders are still unfilled."""
    config = load_config(config_path)
    missing = find_placeholders(config)
    if missing:
        command = format_command(["accelerate", "launch", "--config_file", str(config_path), "..."])
        raise ValueError(f"{config_path} still has placeholders {', '.join(missing)}: fill them in on each node, "
                         f"then run: {command}")
    return config


def cuda_refusal(config: Mapping[str, Any], local_gpus: str | None) -> str | None:
    """Why ``config`` cannot run as planned on a machine whose GPUs are ``local_gpus`` (None: none), or None."""
    if config.get("use_cpu") or local_gpus is not None:
        return None
    kind = {"FSDP": "FSDP", "DEEPSPEED": "DeepSpeed"}.get(str(config.get("distributed_type")), "DDP on NCCL")
    processes = config.get("num_processes")
    return (f"this config runs {kind} on {processes} CUDA GPUs, and this machine has no NVIDIA GPU (nvidia-smi found "
            "none): accelerate would start every rank on the CPU unsynchronised (no gradient sync, each rank on the "
            "whole dataset). To test the script here, add --cpu: DDP on gloo, fp32, --processes N (default 2)"
            f"{'' if kind.startswith('DDP') else ' (DDP only: drop any --strategy or --engine deepspeed you gave)'}")


def local_gpus() -> str | None:
    """This machine's GPUs as ``COUNTxNAME``, or None (``nvidia-smi``; no torch import)."""
    from advisor.hardware.local_gpus import detect_local_gpus

    return detect_local_gpus()


def launch_env(config: Mapping[str, Any], base: Mapping[str, str]) -> dict[str, str]:
    """The workers' environment: ``base`` plus what the config needs that accelerate does not set."""
    env = dict(base)
    if config.get("use_cpu"):
        env["ACCELERATE_USE_CPU"] = "true"
    return env


def _executable(command: list[str]) -> list[str]:
    """Run ``accelerate`` from this interpreter's environment when it is not on PATH."""
    if command[:2] == ["accelerate", "launch"] and shutil.which("accelerate") is None:
        return [sys.executable, "-m", "accelerate.commands.launch", *command[2:]]
    return command


def run_launch(command: Sequence[str], *, config_path: str | os.PathLike[str], timeout_s: float | None = None) -> int:
    """Check the config, run the command, return its exit code."""
    if not Path(config_path).is_file():
        raise ValueError(f"config file {config_path} does not exist")
    config = check_launchable(config_path)
    completed = subprocess.run(_executable(list(command)), env=launch_env(config, os.environ),
                               timeout=timeout_s, check=False)
    return completed.returncode

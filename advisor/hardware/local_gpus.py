"""Detect this machine's NVIDIA GPUs for a default ``--gpus``, without importing torch.

``nvidia-smi --query-gpu=name --format=csv,noheader`` prints one line per GPU (e.g. ``NVIDIA H100
80GB HBM3``); the count and the first name become ``COUNTxNAME``, which the ``--gpus`` grammar
already reads. This is the CLI's edge: the library never calls it.
"""

from __future__ import annotations

import shutil
import subprocess


def detect_local_gpus(*, timeout_s: float = 10.0) -> str | None:
    """``"8xNVIDIA H100 80GB HBM3"`` for this machine, or None when no NVIDIA GPU is visible."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not names:
        return None
    if len(set(names)) > 1:
        raise ValueError(f"this machine mixes GPU models ({', '.join(sorted(set(names)))}); pass --gpus")
    return f"{len(names)}x{names[0]}"

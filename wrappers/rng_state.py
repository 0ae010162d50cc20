"""This process's random number generators, captured and restored, for checkpoints that resume exactly.

A resumed run draws the same dropout masks, shuffles and augmentations only if every generator it
uses is where it was at the save: torch's CPU generator, every CUDA device's, Python's ``random``
and NumPy's global one (when NumPy is installed). Each rank has its own states (seeded apart, or
advanced differently by different data), so they are saved per rank.

The state is made of tensors, ints, strings and tuples only, so ``torch.load(weights_only=True)``
reads it (NumPy's key array travels as a tensor).
"""

from __future__ import annotations

import random
from typing import Any

import torch

try:  # NumPy is optional: restore its generator only where it exists
    import numpy as np
except ImportError:  # pragma: no cover
    np = None


def capture_rng_state() -> dict[str, Any]:
    """Every generator's state in this process."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached))
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put every generator back where ``capture_rng_state`` found it (those present in ``state``)."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state and np is not None:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))

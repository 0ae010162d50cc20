"""dp-advisor: choose a data-parallel strategy that fits, estimate per-GPU memory, apply it.

Public API (imported lazily so that ``import advisor`` stays cheap and torch-free)::

    advisor.plan("Qwen/Qwen2.5-7B", gpus="2xA100")  -> Plan
    advisor.resolve_model("Qwen/Qwen2.5-7B")        -> ModelSpec
    advisor.parse_gpus("2xA100")                    -> Hardware
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "plan": "advisor.planning.api",
    "Plan": "advisor.planning.api",
    "TrainingConfig": "advisor.training",
    "ModelSpec": "advisor.model.spec",
    "resolve_model": "advisor.model.sources",
    "Hardware": "advisor.hardware.cluster",
    "parse_gpus": "advisor.hardware.cluster",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'advisor' has no attribute {name!r}")

"""Which operator raised the allocator's peak: a dispatch-mode log of one training step on a CUDA GPU.

The allocator's history (``peak_snapshot.py``) names a block's Python frame, which backward's allocations do
not have (the autograd engine runs them from C++), and C++ stacks crash a checkpointed block's recompute on
torch 2.11. This log sits at the dispatcher instead: after every operator, forward, recompute and backward
alike, it records the operator, its outputs' dtypes and shapes, ``memory_allocated()`` and
``max_memory_allocated()``. The operator during which the running maximum rose to the step's peak is the one
that set it (its own temporaries included); the lines before it say what was live.

Used by ``gpu_truth.measure(..., op_trace=PATH)``; ``python benchmarks/op_trace.py LOG.json`` prints the
operators around the peak.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

from torch.utils._python_dispatch import TorchDispatchMode


def _describe(value) -> list[str]:
    import torch

    values = value if isinstance(value, (tuple, list)) else (value,)
    return [f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}" for v in values if isinstance(v, torch.Tensor)]


class OpTrace(TorchDispatchMode):
    """Appends (operator, outputs, allocated, running max) to ``rows`` after each operator; ``memory`` returns
    the two byte counts (``torch.cuda.memory_allocated`` and ``max_memory_allocated`` on a GPU)."""

    def __init__(self, memory: Callable[[], tuple[int, int]]) -> None:
        super().__init__()
        self.memory = memory
        self.rows: list[tuple[str, list[str], int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        allocated, peak = self.memory()
        self.rows.append((str(func.overloadpacket.__name__), _describe(out), allocated, peak))
        return out


def around_peak(rows: list, before: int = 25, after: int = 5) -> list[str]:
    """The lines of the operators before and after the one during which the running maximum reached its top."""
    top = max(row[3] for row in rows)
    index = next(i for i, row in enumerate(rows) if row[3] == top)
    lines = [f"peak {top / 2**30:.3f} GiB, reached during operator {index} of {len(rows)}"]
    for i in range(max(0, index - before), min(len(rows), index + after + 1)):
        op, outs, allocated, peak = rows[i]
        mark = " <== peak" if i == index else ""
        lines.append(f"{i:6} {op:32} {' '.join(outs)[:70]:70} alloc {allocated / 2**30:7.3f} max {peak / 2**30:7.3f}{mark}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--before", type=int, default=25)
    parser.add_argument("--after", type=int, default=5)
    args = parser.parse_args()
    print("\n".join(around_peak(json.loads(args.log.read_text()), args.before, args.after)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

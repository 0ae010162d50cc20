"""What was live at the peak of one recorded training step on a real GPU, grouped by where it was
allocated: reads an allocator history written by ``gpu_truth.py --snapshot DIR``.

Run: python benchmarks/peak_snapshot.py DIR/case0.pickle [--top 15]
The history starts at the second step; blocks allocated before it (parameters, optimizer state,
gradients kept across steps) are the ``baseline`` line. Each traced allocation is attributed to the
innermost frame outside torch's own modules (the model's code, our wrappers) plus the innermost torch
frame, so the lines read as "which call of which layer allocated this".
"""

from __future__ import annotations

import argparse
import pickle
from collections import defaultdict

_SKIP = ("/torch/nn/modules/module.py", "/contextlib.py", "/functools.py", "/torch/_compile.py",
         "/torch/_dynamo/", "/torch/utils/_contextlib.py")
_CPP_OPS = ("c10d::", "at::native::", "at::_ops::", "torch::autograd::", "at::cuda::")


def _where(frames: list[dict]) -> str:
    """The innermost model/wrapper Python frame, the innermost torch Python frame and the innermost
    named C++ operation (a history with C++ stacks lists C++ frames first)."""
    python = [f for f in frames if f["filename"].endswith(".py") and not any(s in f["filename"] for s in _SKIP)]
    outside = next((f for f in python if "/torch/" not in f["filename"]), None)
    in_torch = next((f for f in python if "/torch/" in f["filename"]), None)
    cpp = next((f for f in frames if f["name"].startswith(_CPP_OPS)), None)
    parts = [f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}" for f in (outside, in_torch) if f]
    if cpp:
        parts.append(cpp["name"].split("(")[0])
    return " | ".join(parts) or "?"


def live_at_peak(snapshot: dict) -> tuple[int, int, dict[str, list[int]]]:
    """(baseline bytes, peak bytes, {where: [sizes live at the peak]}) from device 0's trace."""
    trace = snapshot["device_traces"][0]
    baseline = snapshot.get("baseline_allocated", 0)
    live: dict[int, dict] = {}
    current = peak = baseline
    peak_live: dict[int, dict] = {}
    for event in trace:
        if event["action"] == "alloc":
            live[event["addr"]] = event
            current += event["size"]
            if current > peak:
                peak, peak_live = current, dict(live)
        elif event["action"] == "free_completed" and event["addr"] in live:
            current -= live.pop(event["addr"])["size"]
    groups: dict[str, list[int]] = defaultdict(list)
    for event in peak_live.values():
        groups[_where(event.get("frames", []))].append(event["size"])
    return baseline, peak, groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    with open(args.snapshot, "rb") as fh:
        snapshot = pickle.load(fh)
    baseline, peak, groups = live_at_peak(snapshot)
    gib = 2**30
    print(f"peak {peak / gib:.3f} GiB = baseline {baseline / gib:.3f} GiB + traced {(peak - baseline) / gib:.3f} GiB")
    ranked = sorted(groups.items(), key=lambda item: -sum(item[1]))
    for where, sizes in ranked[: args.top]:
        print(f"{sum(sizes) / gib:8.3f} GiB {len(sizes):5d} blocks  {where}")


if __name__ == "__main__":
    main()

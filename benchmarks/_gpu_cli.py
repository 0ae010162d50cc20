"""The command line the one-GPU measurement scripts share (gpu_cast_bandwidth, gpu_loss_time, gpu_scale):
``--out DIR`` measures on a CUDA device and stores the run there, ``--report`` rewrites the report from the stored
run(s) on any machine. Imports torch only to measure."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

RESULTS = Path(__file__).resolve().parent / "results"


def cuda_seconds(run: Callable[[], None], *, warmup: int, repeats: int) -> float:
    """Seconds one call of ``run`` takes on the current CUDA device: ``warmup`` calls, then the mean of ``repeats``
    timed between two CUDA events (imports torch: call it only when measuring)."""
    import torch

    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats / 1000


def write_report(name: str, lines: list[str]) -> int:
    """benchmarks/results/NAME.md from ``lines``, printed too."""
    text = "\n".join(lines)
    (RESULTS / f"{name}.md").write_text(text)
    print(text)
    return 0


def gpu_main(doc: str, stored: str, *, measure: Callable[[], dict], report: Callable[[], int], append: bool = False,
             hint: str = "") -> int:
    """Parse ``--out`` / ``--report`` and run one or the other: the measurement goes to DIR/``stored`` (a JSON
    document, or one JSON line appended when ``append``)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help=f"{'append one run to' if append else 'write'} DIR/{stored} (measures; needs CUDA)")
    parser.add_argument("--report", action="store_true", help="rewrite the report in benchmarks/results from the stored runs")
    args = parser.parse_args()
    if args.report:
        return report()
    import torch

    if not torch.cuda.is_available() or args.out is None:
        print(f"{Path(stored).stem}: needs a CUDA device and --out DIR (or --report){hint}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    result = measure()
    if append:
        with open(args.out / stored, "a") as fh:
            fh.write(json.dumps(result) + "\n")
    else:
        (args.out / stored).write_text(json.dumps(result, indent=1) + "\n")
    return 0

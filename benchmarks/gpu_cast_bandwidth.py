"""What autocast's weight casts reach on a real GPU: the HBM share ``profiles/efficiency.json`` ``autocast_casts``
assumes (0.9, a streaming copy's).

    python benchmarks/gpu_cast_bandwidth.py --out DIR     # on a machine with one CUDA GPU: DIR/gpu_cast_bandwidth.json
    python benchmarks/gpu_cast_bandwidth.py --report      # benchmarks/results/gpu_cast_bandwidth.md

Casts every weight of Llama-3.2-3B's shapes (its bundled config: 28 blocks of q, k, v, o, gate, up, down, and the
tied 128,256 x 3,072 embedding) one tensor at a time, as autocast does (one ``_to_copy`` kernel a weight): fp32 to
bf16 (forward: 6 bytes a weight) and bf16 to fp32 (a gradient's cast back in backward: 6 bytes). The mean of 5
passes after 2, CUDA events; bytes read and written over the time, against the datasheet bandwidth
(profiles/gpus.json).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from _gpu_cli import cuda_seconds, gpu_main, write_report  # noqa: E402  (benchmarks/ is the script's folder)

RESULTS = Path(__file__).resolve().parent / "results"
HIDDEN, KV, FFN, LAYERS, VOCAB = 3072, 1024, 8192, 28, 128256  # meta-llama/Llama-3.2-3B config.json


def shapes() -> list[tuple[int, int]]:
    block = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN), (FFN, HIDDEN), (FFN, HIDDEN), (HIDDEN, FFN)]
    return block * LAYERS + [(VOCAB, HIDDEN)]


def measure() -> dict:
    import torch

    rows = {}
    for name, source, target in (("fp32 -> bf16", torch.float32, torch.bfloat16),
                                 ("bf16 -> fp32", torch.bfloat16, torch.float32)):
        weights = [torch.randn(s, device="cuda", dtype=source) for s in shapes()]
        elements = sum(w.numel() for w in weights)

        def cast_all() -> None:
            for w in weights:
                w.to(target)

        seconds = cuda_seconds(cast_all, warmup=2, repeats=5)
        moved = elements * (source.itemsize + target.itemsize)
        rows[name] = dict(weights=elements, tensors=len(weights), seconds=round(seconds, 6), gbps=round(moved / seconds / 1e9, 1))
        print(name, rows[name], flush=True)
        del weights
    return dict(device=torch.cuda.get_device_name(), torch=torch.__version__, casts=rows)


def report() -> int:
    from advisor.hardware.catalog import load_catalog

    run = json.loads((RESULTS / "gpu_cast_bandwidth.json").read_text())
    gpu = next(g for g in load_catalog().gpus if g.name == "H100-80GB-SXM")
    lines = ["# Autocast's weight casts on a real GPU", "",
             f"Measured with `python benchmarks/gpu_cast_bandwidth.py` on {run['device']}, torch {run['torch']}, "
             "2026-11-27: every weight of Llama-3.2-3B's shapes cast one tensor at a time, as autocast does. The plan "
             f"assumes {0.9:.0%} of the datasheet bandwidth ({gpu.hbm_bandwidth_gbps:,.0f} GB/s).", "",
             "| cast | weights | tensors | ms | GB/s (read + written) | share of datasheet |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, row in run["casts"].items():
        lines.append(f"| {name} | {row['weights']:,} | {row['tensors']} | {1000 * row['seconds']:.2f} | "
                     f"{row['gbps']:,.0f} | {row['gbps'] / gpu.hbm_bandwidth_gbps:.2f} |")
    return write_report("gpu_cast_bandwidth", [*lines, ""])


def main() -> int:
    return gpu_main(__doc__, "gpu_cast_bandwidth.json", measure=measure, report=report)

if __name__ == "__main__":
    sys.exit(main())

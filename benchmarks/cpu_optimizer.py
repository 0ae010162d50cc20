"""torch's AdamW step on the CPU, per thread: the rate the offload strategies' CPU step is planned with.

    PYTHONPATH=$PWD python benchmarks/cpu_optimizer.py            # measures; writes results/cpu_optimizer.json and .md
    PYTHONPATH=$PWD python benchmarks/cpu_optimizer.py --no-write

What a CPU-offload step runs (FSDP2 ``CPUOffloadPolicy``, or ZeRO-Offload under the torch engine) is
``torch.optim.AdamW`` over each process's shard in CPU memory, after backward and before the next forward, so
nothing hides it. The launchers run that step on one thread per process: ``torchrun`` sets
``OMP_NUM_THREADS=1`` when it starts more than one process on a node (torch/distributed/run.py), and
``accelerate launch`` passes ``OMP_NUM_THREADS`` = ``--num_cpu_threads_per_process``, 1 unless set, to GPU
runs (accelerate/commands/launch.py, utils/launch.py). So the rate that matters is one thread's, times the
processes on the node, as long as the node's memory bandwidth carries them (the planner caps it:
``profiles/efficiency.json`` ``offload``).

Measured here, one thread (``torch.set_num_threads(1)``): one parameter of 50M elements with its gradient, the
step timed after a first (state-creating) step, the median of ``--repeats``; fp32 parameters and state (bf16-mixed
training keeps fp32 shards on the CPU) and bf16 (pure bf16 training), each implementation:
``fused=True`` (torch >= 2.4 has a CPU kernel), ``foreach=True``, ``foreach=False`` (the for-loop). Bytes a
parameter the step reads and writes: fp32 4 x 4 read (parameter, gradient, two moments) + 3 x 4 written = 28;
bf16 14. This machine's CPU is printed with the result; a server core may differ (an assumption the plan states).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
IMPLEMENTATIONS = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}
BYTES_PER_PARAM = {"fp32": 28, "bf16": 14}


def cpu_name() -> str:
    """The CPU as /proc/cpuinfo names it, with its family and model numbers (a VM may hide the model name) and
    whether it has AVX-512."""
    try:
        fields: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
        flags = fields.get("flags", "").split()
        return (f"{fields.get('model name', 'unknown')} (cpu family {fields.get('cpu family', '?')}, model "
                f"{fields.get('model', '?')}{', AVX-512' if 'avx512f' in flags else ''})")
    except OSError:
        return platform.processor() or "unknown"


def measure(elements: int, repeats: int) -> dict[str, dict[str, float]]:
    """Parameters a second stepped by one thread: {state dtype: {implementation: rate}}."""
    import torch

    torch.set_num_threads(1)
    rates: dict[str, dict[str, float]] = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        rates[name] = {}
        for impl, kwargs in IMPLEMENTATIONS.items():
            param = torch.nn.Parameter(torch.randn(elements, dtype=dtype))
            param.grad = torch.randn(elements, dtype=dtype)
            opt = torch.optim.AdamW([param], lr=1e-4, **kwargs)
            opt.step()  # creates the state
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                opt.step()
                times.append(time.perf_counter() - start)
            rates[name][impl] = elements / statistics.median(times)
    return rates


def markdown(result: dict) -> str:
    lines = ["# torch AdamW on the CPU, one thread", "",
             f"Measured with `python benchmarks/cpu_optimizer.py` on {result['cpu']}; torch {result['torch']}, "
             f"{result['date']}: {result['elements']:,} elements, median of {result['repeats']} steps. "
             "Parameters stepped a second by one thread (the launchers' OMP_NUM_THREADS=1), and the memory "
             "traffic that implies.", "",
             "| state | implementation | parameters/s | GB/s |", "| --- | --- | ---: | ---: |"]
    for state, row in result["per_thread"].items():
        for impl, rate in row.items():
            lines.append(f"| {state} | {impl} | {rate / 1e9:.3f} G | {rate * BYTES_PER_PARAM[state] / 1e9:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--elements", type=int, default=50_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    import torch

    rates = measure(args.elements, args.repeats)
    result = {"cpu": cpu_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "elements": args.elements, "repeats": args.repeats, "bytes_per_param": BYTES_PER_PARAM,
              "per_thread": {s: {i: round(r, -6) for i, r in row.items()} for s, row in rates.items()}}
    text = markdown(result)
    print(text)
    if not args.no_write:
        (RESULTS / "cpu_optimizer.json").write_text(json.dumps(result, indent=1) + "\n")
        (RESULTS / "cpu_optimizer.md").write_text(text)


if __name__ == "__main__":
    main()

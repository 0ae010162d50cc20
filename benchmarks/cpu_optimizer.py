"""torch's AdamW step on the CPU, per thread: the rate the offload strategies' CPU step is planned with.

    PYTHONPATH=$PWD python benchmarks/cpu_optimizer.py            # measures; writes results/cpu_optimizer.json and .md
    PYTHONPATH=$PWD python benchmarks/cpu_optimizer.py --no-write
    PYTHONPATH=$PWD python benchmarks/cpu_optimizer.py --procs 1,4,8,16 --json OUT.json   # another host

``--procs``: N processes of one thread each step their own fp32 AdamW together (started at one barrier), as the
N ranks of a node do after backward; their summed rate against N x one thread's shows where the node's memory
bandwidth caps it. The node's copy bandwidth (``Tensor.copy_`` of 1 GiB on every core, read + written) is
printed beside it, the figure the planner's cap (``host_memory_gbps`` x ``host_memory_efficiency``) stands for.
``--json PATH`` writes that host's reading to PATH (and its table beside it, .md) instead of results/ (this CI
machine's reading is the one the planner's rates cite). results/cpu_optimizer_h100_host.json is one such
reading: the lent H100 machine's host (16 vCPUs of an Intel Xeon, cpu family 6 model 207, under KVM), torch
2.11, ``--elements 20000000 --repeats 2 --procs 16,8``, 2026-11-27.

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


def _node_worker(impl: str, elements: int, repeats: int, barrier, out) -> None:
    import torch

    torch.set_num_threads(1)
    param = torch.nn.Parameter(torch.randn(elements))
    param.grad = torch.randn(elements)
    opt = torch.optim.AdamW([param], lr=1e-4, **IMPLEMENTATIONS[impl])
    opt.step()
    barrier.wait()
    start = time.perf_counter()
    for _ in range(repeats):
        opt.step()
    out.put(time.perf_counter() - start)


def measure_node(procs: int, impl: str, elements: int, repeats: int) -> float:
    """fp32 parameters a second stepped by ``procs`` one-thread processes together: their parameters over the
    slowest one's time."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_node_worker, args=(impl, elements, repeats, barrier, out)) for _ in range(procs)]
    for worker in workers:
        worker.start()
    seconds = max(out.get(timeout=600) for _ in workers)
    for worker in workers:
        worker.join()
    return procs * elements * repeats / seconds


def copy_bandwidth(threads: int) -> float:
    """Bytes a second ``Tensor.copy_`` moves (read + written) over 1 GiB on ``threads`` threads: the best of 5."""
    import torch

    torch.set_num_threads(threads)
    src, dst = torch.ones(2**28), torch.empty(2**28)
    dst.copy_(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(5))
    return 2 * src.numel() * 4 / best


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


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
    if result.get("node"):
        lines += ["", f"Copy bandwidth, read + written: {result['copy_gbps_1_thread']:.1f} GB/s on one thread, "
                  f"{result['copy_gbps_all_threads']:.1f} GB/s on {result['cores']} threads.", "",
                  "| processes | implementation | parameters/s together | x one thread | GB/s |",
                  "| ---: | --- | ---: | ---: | ---: |"]
        for row in result["node"]:
            single = result["per_thread"]["fp32"][row["implementation"]]
            lines.append(f"| {row['processes']} | {row['implementation']} | {row['rate'] / 1e9:.2f} G | "
                         f"{row['rate'] / single:.1f} | {row['rate'] * BYTES_PER_PARAM['fp32'] / 1e9:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--elements", type=int, default=50_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--procs", default="", help="comma-separated process counts for the node measurement")
    parser.add_argument("--json", type=Path, default=None, help="write this host's reading here, not to results/")
    args = parser.parse_args()
    import os

    import torch

    rates = measure(args.elements, args.repeats)
    result = {"cpu": cpu_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "elements": args.elements, "repeats": args.repeats, "bytes_per_param": BYTES_PER_PARAM,
              "per_thread": {s: {i: round(r, -6) for i, r in row.items()} for s, row in rates.items()}}
    if args.procs:
        cores = len(os.sched_getaffinity(0))
        result.update(cores=cores, copy_gbps_1_thread=round(copy_bandwidth(1) / 1e9, 1),
                      copy_gbps_all_threads=round(copy_bandwidth(cores) / 1e9, 1), node=[])
        for procs in (int(n) for n in args.procs.split(",")):
            for impl in ("fused", "foreach"):
                rate = measure_node(procs, impl, min(args.elements, 20_000_000), args.repeats)
                result["node"].append({"processes": procs, "implementation": impl, "rate": round(rate, -6)})
                print(f"{procs} processes {impl}: {rate / 1e9:.2f} G parameters/s", flush=True)
    text = markdown(result)
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        args.json.with_suffix(".md").write_text(text)
    elif not args.no_write:
        (RESULTS / "cpu_optimizer.json").write_text(json.dumps(result, indent=1) + "\n")
        (RESULTS / "cpu_optimizer.md").write_text(text)


if __name__ == "__main__":
    main()

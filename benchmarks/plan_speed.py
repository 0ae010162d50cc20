"""Planning speed: cold `advisor plan` wall time, and the in-process search for a 405B model on
1024 GPUs (every strategy x micro-batch x checkpointing).

Run: python benchmarks/plan_speed.py [--repeat 5]
Goals (issue 3): `advisor plan` on a bundled model under 0.5 s cold, with no torch import;
the 405B / 1024-GPU search under 50 ms in-process. Issue 11: the same 0.5 s with LoRA (and a loss
kernel), QLoRA (--quantize nf4), and `--seq-len max` (a binary search per strategy). Issue 12: the mesh search (tp x cp x HSDP)
for 405B on 1024 GPUs under 100 ms in-process (``--policy fastest`` at sequence 8192, where every
mesh is evaluated), and the long-context 8B plan that only a mesh fits under 0.5 s cold.

Each cold figure is the median wall time and the median CPU time (user + sys) of fresh processes, as an
installed copy runs: bytecode compiled once (pip compiles on install; here a temporary PYTHONPYCACHEPREFIX
warmed by one run). The first line is also given with no bytecode at all (PYTHONDONTWRITEBYTECODE=1, as
this sandbox sets it): every module of the package is then compiled on every run.
``--baseline DIR`` runs every cold command also with PYTHONPATH=DIR (another checkout, e.g. main),
interleaved run by run, and prints the ratios (this tree / baseline): on a shared machine only figures
taken at the same moment compare.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _timing import bytecode_env, cold_time, load_average, no_bytecode_env, paired_times

ROOT = Path(__file__).resolve().parents[1]
QWEN = ["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "2xA100"]
COLD = {  # label -> advisor arguments, each timed cold
    "advisor plan Qwen/Qwen2.5-7B 2xA100": QWEN,
    "... --json": [*QWEN, "--json"],
    "... --lora 16 --loss fused 8xH100": ["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "8xH100", "--lora", "16",
                                          "--loss", "fused"],
    "Llama-2-70B --lora 64 --quantize nf4 2xRTX4090": ["plan", "--model", "meta-llama/Llama-2-70b-hf", "--gpus",
                                                       "2xRTX4090", "--lora", "64", "--quantize", "nf4"],
    "... --seq-len max 8xH100": ["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "8xH100", "--seq-len", "max"],
    "8B seq 131072 8xH100, mesh": ["plan", "--model", "meta-llama/Llama-3.1-8B", "--gpus", "8xH100", "--seq-len",
                                   "131072"],
}
GOAL_S = 0.5


def in_process(repeat: int) -> float:
    from advisor.planning.api import plan

    plan("meta-llama/Llama-3.1-405B", "128x8xH100")  # warm caches (profiles, imports)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        plan("meta-llama/Llama-3.1-405B", "128x8xH100")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def mesh_search(repeat: int) -> float:
    from advisor.planning.api import plan

    kwargs = dict(policy="fastest", seq_len=8192)
    plan("meta-llama/Llama-3.1-405B", "128x8xH100", **kwargs)  # warm caches
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = plan("meta-llama/Llama-3.1-405B", "128x8xH100", **kwargs)
        times.append(time.perf_counter() - start)
    assert sum(c.mesh is not None for c in result.candidates) > 10, "the mesh search did not run"
    return statistics.median(times)


def _trees(baseline: str | None) -> dict[str, dict]:
    """Environment per tree timed: this checkout (PYTHONPATH=its root), and the baseline's when given."""
    trees = {"this": {**os.environ, "PYTHONPATH": str(ROOT)}}
    if baseline:
        trees["baseline"] = {**os.environ, "PYTHONPATH": str(Path(baseline).resolve())}
    return trees


def _line(label: str, times: dict[str, tuple[float, float]], goal: bool) -> str:
    wall, cpu = times["this"]
    text = f"{label:50s} wall {wall:.3f} s  CPU {cpu:.3f} s"
    if goal:
        text += f"   goal < {GOAL_S} s: {'met' if wall < GOAL_S else 'NOT met'}"
    if "baseline" in times:
        base_wall, base_cpu = times["baseline"]
        text += (f"   baseline wall {base_wall:.3f} CPU {base_cpu:.3f}  ratio wall {wall / base_wall:.2f} "
                 f"CPU {cpu / base_cpu:.2f}")
    return text


def cold_figures(repeat: int, baseline: str | None) -> list[str]:
    """Every COLD command, bytecode cached (first warmed), then the first one with no bytecode."""
    cli = [sys.executable, "-m", "advisor.cli.main"]
    trees = _trees(baseline)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        envs = {name: bytecode_env(env, str(Path(tmp) / name)) for name, env in trees.items()}
        for label, argv in COLD.items():
            cmd = [*cli, *argv]
            paired_times({name: cmd for name in envs}, 1, envs=envs, cwd=tmp)  # compile once, as pip does
            times = paired_times({name: cmd for name in envs}, repeat, envs=envs, cwd=tmp)
            lines.append(_line(label + " (cold)", times, goal=True))
        first_label, first = next(iter(COLD.items()))
        envs = {name: no_bytecode_env(env) for name, env in trees.items()}
        times = paired_times({name: [*cli, *first] for name in envs}, repeat, envs=envs, cwd=tmp)
        lines.append(_line(first_label + " (cold, no bytecode)", times, goal=False))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline", help="another checkout's root (PYTHONPATH) to time alongside, e.g. /work/main")
    args = parser.parse_args()
    load_before = load_average()
    for line in cold_figures(args.repeat, args.baseline):
        print(line)
    t_torch = cold_time([sys.executable, "-c", "import torch"], args.repeat)
    t_mesh = mesh_search(args.repeat * 4)
    t_search = in_process(args.repeat * 4)
    print(f"python -c 'import torch' (cold):           {t_torch:.3f} s")
    print(f"plan() 405B on 1024 GPUs (in-process):     {t_search * 1000:.1f} ms goal < 50 ms: "
          f"{'met' if t_search < 0.05 else 'NOT met'}")
    print(f"plan() 405B 1024 GPUs mesh search (fastest, seq 8192): {t_mesh * 1000:.1f} ms goal < 100 ms: "
          f"{'met' if t_mesh < 0.1 else 'NOT met'}")
    print(f"median of {args.repeat}; load average {load_before:.1f} before, {load_average():.1f} after, on "
          f"{os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()

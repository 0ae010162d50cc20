"""Planning speed: cold `advisor plan` wall time, and the in-process search for a 405B model on
1024 GPUs (every strategy x micro-batch x checkpointing).

Run: python benchmarks/plan_speed.py [--repeat 5]
Goals (issue 3): `advisor plan` on a bundled model under 0.5 s cold, with no torch import;
the 405B / 1024-GPU search under 50 ms in-process. Issue 11: the same 0.5 s with LoRA (and a loss
kernel), QLoRA (--quantize nf4), and `--seq-len max` (a binary search per strategy). Issue 12: the mesh search (tp x cp x HSDP)
for 405B on 1024 GPUs under 100 ms in-process (``--policy fastest`` at sequence 8192, where every
mesh is evaluated), and the long-context 8B plan that only a mesh fits under 0.5 s cold.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time

from _timing import cold_time


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    exe = shutil.which("advisor")
    cmd = [exe] if exe else [sys.executable, "-m", "advisor.cli.main"]
    t_plan = cold_time([*cmd, "plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "2xA100"], args.repeat)
    t_lora = cold_time([*cmd, "plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "8xH100", "--lora", "16",
                        "--loss", "fused"], args.repeat)
    t_qlora = cold_time([*cmd, "plan", "--model", "meta-llama/Llama-2-70b-hf", "--gpus", "2xRTX4090", "--lora", "64",
                         "--quantize", "nf4"], args.repeat)
    t_longest = cold_time([*cmd, "plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "8xH100", "--seq-len", "max"],
                          args.repeat)
    t_mesh_cold = cold_time([*cmd, "plan", "--model", "meta-llama/Llama-3.1-8B", "--gpus", "8xH100", "--seq-len",
                             "131072"], args.repeat)
    t_torch = cold_time([sys.executable, "-c", "import torch"], args.repeat)
    t_mesh = mesh_search(args.repeat * 4)
    t_search = in_process(args.repeat * 4)
    print(f"advisor plan Qwen/Qwen2.5-7B 2xA100 (cold): {t_plan:.3f} s   goal < 0.5 s: {'met' if t_plan < 0.5 else 'NOT met'}")
    print(f"... --lora 16 --loss fused 8xH100 (cold):    {t_lora:.3f} s   goal < 0.5 s: {'met' if t_lora < 0.5 else 'NOT met'}")
    print(f"Llama-2-70B --lora 64 --quantize nf4 2xRTX4090 (cold): {t_qlora:.3f} s   goal < 0.5 s: "
          f"{'met' if t_qlora < 0.5 else 'NOT met'}")
    print(f"... --seq-len max 8xH100 (cold):             {t_longest:.3f} s")
    print(f"python -c 'import torch' (cold):           {t_torch:.3f} s   ratio plan/torch: {t_plan / t_torch:.2f}")
    print(f"plan() 405B on 1024 GPUs (in-process):     {t_search * 1000:.1f} ms goal < 50 ms: "
          f"{'met' if t_search < 0.05 else 'NOT met'}")
    print(f"... 8B seq 131072 8xH100, mesh (cold):        {t_mesh_cold:.3f} s   goal < 0.5 s: "
          f"{'met' if t_mesh_cold < 0.5 else 'NOT met'}")
    print(f"plan() 405B 1024 GPUs mesh search (fastest, seq 8192): {t_mesh * 1000:.1f} ms goal < 100 ms: "
          f"{'met' if t_mesh < 0.1 else 'NOT met'}")


if __name__ == "__main__":
    main()

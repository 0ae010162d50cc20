"""The accuracy matrix on a real CUDA GPU: ``torch.cuda.max_memory_allocated()`` of the measured
step against the analytic estimate and the CPU simulation.

Run (on a machine with one CUDA GPU): python benchmarks/gpu_truth.py [--only SUBSTRING]
Each case builds the model from its config on the GPU (random weights), applies the recipe
``wrap()`` applies (``wrappers.recipe.apply_recipe``; DDP under ``torch.autocast("cuda")``), and
runs two steps under a process group of the case's world size: a real one-rank NCCL group for world
size 1, a fake process group above (``torch.testing._internal.distributed.fake_pg``: collectives
return at once, so one GPU plays rank 0 of N; memory is the same, the values are not). The peak
of the second step is recorded. Writes benchmarks/results/gpu_truth.csv; the simulated column
comes from benchmarks/results/accuracy.csv (run benchmarks/accuracy.py first).
Exits with code 2 and a message when no CUDA device is available.
"""

from __future__ import annotations

import argparse
import csv
import gc
import statistics
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import accuracy  # noqa: E402  (the case matrix and the analytic helper)


def _simulated() -> dict[tuple, int]:
    path = accuracy.RESULTS / "accuracy.csv"
    if not path.exists():
        return {}
    with open(path) as fh:
        return {(r["model"], r["strategy"], int(r["world"]), int(r["micro_batch"]), int(r["seq_len"]),
                 r["checkpointing"] == "True"): int(r["simulated_bytes"]) for r in csv.DictReader(fh)}


def _init_group(world: int) -> None:
    import torch.distributed as dist

    if world == 1:
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29571", rank=0, world_size=1)
    else:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


def measure(key: str, strategy: str, world: int, mb: int, seq: int, ckpt: bool) -> tuple[int, int]:
    """Peak allocated and peak reserved bytes of the second training step on the GPU."""
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.futures import Future

    from advisor.model.meta import build_meta_model
    from advisor.simulate.model import materialize, resolve_config
    from wrappers.recipe import Recipe, apply_recipe, autocast_context

    cfg = dict(resolve_config(accuracy.MODELS[key])[1], use_cache=False, attn_implementation="sdpa")
    _init_group(world)
    try:
        net = build_meta_model(cfg)
        materialize(net, device="cuda", real=True)
        net.train()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-5, foreach=True)
        applied = apply_recipe(net, Recipe(strategy=strategy, precision="bf16-mixed", activation_checkpointing=ckpt),
                               device="cuda", optimizer=opt)
        model, opt = applied.model, applied.optimizer
        if strategy == "ddp" and world > 1:
            # The fake group's all-reduce completes with no value; hand DDP its bucket back (in place).
            def done(state, bucket):
                fut = Future()
                fut.set_result(bucket.buffer())
                return fut

            model.register_comm_hook(None, done)
        ids = torch.randint(0, cfg["vocab_size"], (mb, seq), device="cuda")
        cast = autocast_context("bf16-mixed", "cuda") if strategy == "ddp" else contextlib.nullcontext()

        def step() -> None:
            with cast:
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)

        step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    finally:
        dist.destroy_process_group()
        gc.collect()
        torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="Run the cases whose model key contains this.")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_truth: no CUDA device here; run this on a machine with one CUDA GPU "
              "(the GPU column of benchmarks/results is pending until then)", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    simulated = _simulated()
    rows = []
    import transformers

    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; transformers {transformers.__version__}")
    print(f"{'model':9} {'strategy':8} {'N':>3} {'mb':>2} {'seq':>5} {'ck':3} {'gpu GiB':>8} {'analytic':>9} "
          f"{'err%':>7} {'simulated':>9} {'err%':>7} {'reserved':>8}")
    for case in accuracy.CASES:
        if args.only not in case[0]:
            continue
        key, strategy, world, mb, seq, ckpt = case
        try:
            truth, reserved = measure(*case)
        except torch.cuda.OutOfMemoryError:
            print(f"{key:9} {strategy:8} {world:3} {mb:2} {seq:5} out of memory on this GPU")
            continue
        est = accuracy.analytic(accuracy.MODELS[key], strategy, world, mb, seq, ckpt).peak_allocated
        sim = simulated.get(case)
        err = lambda v: None if v is None else round(100 * (v - truth) / truth, 2)  # noqa: E731
        row = dict(model=key, strategy=strategy, world=world, micro_batch=mb, seq_len=seq, checkpointing=ckpt,
                   gpu_max_allocated_bytes=truth, gpu_max_reserved_bytes=reserved, analytic_bytes=est, analytic_err_pct=err(est),
                   simulated_bytes=sim, simulated_err_pct=err(sim))
        rows.append(row)
        print(f"{key:9} {strategy:8} {world:3} {mb:2} {seq:5} {'on' if ckpt else 'off':3} {truth / 2**30:8.2f} "
              f"{est / 2**30:9.2f} {err(est):+7.2f} {'' if sim is None else f'{sim / 2**30:9.2f}'} "
              f"{'' if sim is None else f'{err(sim):+7.2f}'} {reserved / 2**30:8.2f}", flush=True)
    for column in ("analytic_err_pct", "simulated_err_pct"):
        errs = [abs(r[column]) for r in rows if r[column] is not None]
        if errs:
            print(f"{column}: median |err| {statistics.median(errs):.2f}%, max {max(errs):.2f}%")
    if rows:
        accuracy.RESULTS.mkdir(exist_ok=True)
        with open(accuracy.RESULTS / "gpu_truth.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The accuracy matrix on a real CUDA GPU: ``torch.cuda.max_memory_allocated()`` of the measured
step against the analytic estimate and the CPU simulation.

Run (on a machine with one CUDA GPU): python benchmarks/gpu_truth.py [--only SUBSTRING]
Each case builds the model from its config on the GPU (random weights), applies the recipe
``wrap()`` applies (``wrappers.recipe.apply_recipe``; DDP under ``torch.autocast("cuda")``), and
runs three steps under a process group of the case's world size: a real one-rank NCCL group for world
size 1, a fake process group above (``torch.testing._internal.distributed.fake_pg``: collectives
return at once, so one GPU plays rank 0 of N; memory is the same, the values are not). The peak
of the second step is the measured figure (what the simulator and the estimate model); the first
and third steps' peaks and the peak reserved bytes are recorded beside it. Writes benchmarks/results/gpu_truth.csv; the simulated column
comes from benchmarks/results/accuracy.csv (run benchmarks/accuracy.py first).
Exits with code 2 and a message when no CUDA device is available.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import pickle
import statistics
import sys
import warnings
from pathlib import Path
from typing import NamedTuple

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


# torch.optim.AdamW's keywords for each implementation (the torch recipe's default on CUDA is foreach)
IMPL_KWARGS = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}


class Peaks(NamedTuple):
    """The first step also creates Adam's state; DDP rebuilds its gradient buckets in the second
    step's forward (in the order gradients arrived); the third is the steady state. The simulator
    and the estimate model the second."""

    step1: int
    step2: int
    step3: int
    reserved: int
    reserved_steps: tuple[int, ...] = ()  # max_memory_reserved() of each step (the peak is reset before each)


def measure(key: str, strategy: str, world: int, mb: int, seq: int, ckpt: bool,
            snapshot: Path | None = None, *, lora_rank: int | None = None, loss: str = "hf",
            optimizer_impl: str = "foreach", attention: str = "sdpa", compile: bool = False,
            compiled_loss: bool = False, float8: bool = False, float8_all_gather: bool = False,
            op_trace: Path | None = None, outer_units: bool = False,
            activation_offload: bool = False, fresh_cache: bool = False,
            root_reshard_after_forward: bool | None = None) -> "Peaks":
    """Peak allocated bytes of each of three training steps on the GPU and the peak reserved bytes;
    with ``snapshot``, the allocator's history of the second step is dumped there
    (``benchmarks/peak_snapshot.py`` reads it). ``compile``: each block ``torch.compile``d as wrap() does
    (``Recipe.compile``); ``compiled_loss``: the model returns its logits and a compiled cross-entropy takes
    them, as torchtitan's ``build_cross_entropy_loss`` under ``--compile`` does. ``float8``: torchao float8 on
    the blocks' linears (``Recipe.float8``, as wrap() applies the plan's ``--float8``). ``op_trace``: the second
    step runs under ``op_trace.OpTrace`` and its log (each operator with the allocated bytes after it) is written
    there as JSON (``python benchmarks/op_trace.py PATH`` prints the operators around the peak). ``outer_units``:
    torchtitan's FSDP2 units (the embedding, the final norm + head; ``Recipe.outer_units``). ``activation_offload``:
    the body's saved tensors held in pinned CPU memory (``wrappers.activation_offload``, as wrap() applies the
    plan's ``--activation-offload``). ``fresh_cache``: the allocator's cache emptied once the model is wrapped, so
    the reserved peaks are the training's, not what building the whole model on the GPU left cached.
    ``root_reshard_after_forward``: ``Recipe``'s (False: torchtitan's norm + head unit kept to its backward)."""
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.futures import Future

    from advisor.model.meta import build_meta_model
    from advisor.simulate.model import materialize, resolve_config
    from advisor.model.lora import LoraConfig, default_targets
    from advisor.model.sources import spec_from_config
    from wrappers.losses import use_loss_kernel
    from wrappers.recipe import Recipe, apply_recipe, autocast_context

    cfg = dict(resolve_config(accuracy.MODELS[key])[1], use_cache=False, attn_implementation=attention)
    # The previous case's model and optimizer die when its measure() returns, some of them in reference
    # cycles: collect them and hand their cached blocks back, so neither counts in this case's peaks.
    gc.collect()
    torch.cuda.empty_cache()
    # What stays is the library workspaces the first step created (cuBLAS / cuBLASLt, per stream; 65 MiB
    # on an H100 with torch 2.11): every case counts them, the first one inside its own step.
    leftover = torch.cuda.memory_allocated()
    if leftover > 256 * 2**20:
        raise RuntimeError(f"{leftover} bytes still allocated from an earlier case")
    _init_group(world)
    try:
        net = build_meta_model(cfg)
        use_loss_kernel(net, loss)
        if lora_rank is not None:
            import peft

            lora = LoraConfig(rank=lora_rank)
            targets = default_targets(spec_from_config(cfg, name=key, source="local"))
            net = peft.get_peft_model(net, peft.LoraConfig(**lora.peft_kwargs(targets))).base_model.model
        materialize(net, device="cuda", real=True)
        if lora_rank is not None:  # the frozen base in bf16, the adapters in fp32: how PEFT users load it, and
            # what the torch recipe plans (profiles/recipes.json frozen_base: compute)
            for param in net.parameters():
                if not param.requires_grad:
                    param.data = param.data.to(torch.bfloat16)
        net.train()
        opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-5,
                                **IMPL_KWARGS[optimizer_impl])
        recipe = Recipe(strategy=strategy, precision="bf16-mixed", compile=compile, float8=float8,
                        float8_all_gather=float8_all_gather, outer_units=outer_units,
                        root_reshard_after_forward=root_reshard_after_forward,
                        checkpointing="selective" if ckpt == "selective" else "on" if ckpt else "off")
        applied = apply_recipe(net, recipe, device="cuda", optimizer=opt)
        model, opt = applied.model, applied.optimizer
        if activation_offload:
            from wrappers.activation_offload import apply_activation_offload

            apply_activation_offload(model, host=True)
        if fresh_cache:
            gc.collect()
            torch.cuda.empty_cache()
        if strategy == "ddp" and world > 1:
            # The fake group's all-reduce completes with no value; hand DDP its bucket back (in place).
            def done(state, bucket):
                fut = Future()
                fut.set_result(bucket.buffer())
                return fut

            model.register_comm_hook(None, done)
        ids = torch.randint(0, cfg["vocab_size"], (mb, seq), device="cuda")
        cast = autocast_context("bf16-mixed", "cuda") if strategy == "ddp" else contextlib.nullcontext()

        if compiled_loss:  # torchtitan's loss: its loader shifts the labels, the logits are taken whole
            labels = ids.flatten()

            @torch.compile
            def cross_entropy(logits):
                return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels)

        def step() -> None:
            with cast:
                if compiled_loss:
                    loss = cross_entropy(model(input_ids=ids).logits)
                else:
                    loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)

        peaks, reserved_steps = [], []
        for index in range(3):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            recording = snapshot is not None and index == 1
            if recording:
                # C++ stacks crash dropout's recompute under checkpointing (torch 2.11: SystemError).
                torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python" if ckpt else "all")
                baseline = torch.cuda.memory_allocated()
            if op_trace is not None and index == 1:
                from op_trace import OpTrace

                with OpTrace(lambda: (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated())) as trace:
                    step()
                op_trace.write_text(json.dumps(trace.rows))
            else:
                step()
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated())
            reserved_steps.append(torch.cuda.max_memory_reserved())
            if recording:
                data = torch.cuda.memory._snapshot()
                data["baseline_allocated"] = baseline
                torch.cuda.memory._record_memory_history(enabled=None)
                with open(snapshot, "wb") as fh:
                    pickle.dump(data, fh)
        # Reserved only grows while the cache holds what it reserved: the last step's figure is the run's.
        return Peaks(step1=peaks[0], step2=peaks[1], step3=peaks[2], reserved=torch.cuda.max_memory_reserved(),
                     reserved_steps=tuple(reserved_steps))
    finally:
        dist.destroy_process_group()


# LoRA and loss-kernel cases (issue 11): (model, strategy, world, micro-batch, seq, checkpointing, LoRA rank, loss)
VARIANTS = [
    ("qwen0.5b", "ddp", 2, 2, 1024, False, 16, "hf"), ("qwen0.5b", "zero3", 8, 4, 2048, False, 16, "hf"),
    ("llama1b", "ddp", 2, 2, 2048, True, 16, "hf"), ("llama1b", "zero3", 8, 2, 2048, False, 64, "hf"),
    ("qwen0.5b", "ddp", 2, 2, 2048, False, None, "chunked"), ("qwen0.5b", "zero3", 8, 2, 4096, False, None, "fused"),
    ("llama1b", "zero3", 8, 4, 2048, False, None, "chunked"), ("llama1b", "ddp", 2, 2, 2048, False, None, "fused"),
    ("qwen0.5b", "zero3", 8, 4, 2048, True, 16, "fused"),
    ("llama1b", "zero3", 8, 2, 4096, "selective", None, "hf"), ("mha350m", "ddp", 2, 4, 2048, "selective", None, "hf"),
    ("qwen0.5b", "zero3", 8, 4, 2048, "selective", 16, "fused"),
]


def variant_estimate(key: str, strategy: str, world: int, mb: int, seq: int, ckpt: bool, rank: int | None,
                     loss: str) -> int:
    """The analytic peak for a VARIANTS case (PEFT's default targets, no dropout)."""
    import accuracy_variants

    return accuracy_variants.estimate(key, strategy, world, mb, seq, ckpt, None if rank is None else (rank, None, 0.0),
                                      loss)


def run_variants(only: list[int]) -> int:
    """Measure VARIANTS (``only``: those indices, their rows replaced in the existing CSV, the others kept)."""
    path = accuracy.RESULTS / "gpu_truth_variants.csv"
    kept = {}
    if only and path.exists():
        with open(path) as fh:
            kept = dict(enumerate(csv.DictReader(fh)))
    rows = []
    for index, case in enumerate(VARIANTS):
        if only and index not in only:
            rows.append(kept[index])
            continue
        key, strategy, world, mb, seq, ckpt, rank, loss = case
        peaks = measure(key, strategy, world, mb, seq, ckpt, lora_rank=rank, loss=loss)
        est = variant_estimate(*case)
        err = round(100 * (est - peaks.step2) / peaks.step2, 2)
        rows.append(dict(model=key, strategy=strategy, world=world, micro_batch=mb, seq_len=seq, checkpointing=ckpt,
                         lora_rank=rank, loss=loss, gpu_max_allocated_bytes=peaks.step2,
                         gpu_step3_allocated_bytes=peaks.step3, gpu_max_reserved_bytes=peaks.reserved,
                         analytic_bytes=est, analytic_err_pct=err))
        mode = ("sel" if ckpt == "selective" else "on") if ckpt else "off"
        print(f"{key:9} {strategy:6} {world:3} {mb:2} {seq:5} {mode:3} lora={rank} loss={loss:8} "
              f"gpu {peaks.step2 / 2**30:7.2f} step3 {peaks.step3 / 2**30:7.2f} est {est / 2**30:7.2f} {err:+6.2f}% "
              f"reserved {peaks.reserved / 2**30:7.2f}", flush=True)
    accuracy.RESULTS.mkdir(exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="Run the cases whose model key contains this.")
    parser.add_argument("--case", type=int, action="append", default=[],
                        help="Run only this case (its index in accuracy.CASES, or in VARIANTS with --variants); "
                             "repeatable.")
    parser.add_argument("--snapshot", type=Path, default=None,
                        help="Folder for one allocator history per case (second step), for peak_snapshot.py.")
    parser.add_argument("--no-write", action="store_true", help="Do not write benchmarks/results/gpu_truth.csv.")
    parser.add_argument("--variants", action="store_true",
                        help="Run the LoRA and loss-kernel cases (VARIANTS) into gpu_truth_variants.csv instead.")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_truth: no CUDA device here; run this on a machine with one CUDA GPU "
              "(the GPU column of benchmarks/results is pending until then)", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    if args.variants:
        return run_variants(args.case)
    simulated = _simulated()
    rows = []
    import transformers

    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; transformers {transformers.__version__}")
    print(f"{'model':9} {'strategy':8} {'N':>3} {'mb':>2} {'seq':>5} {'ck':3} {'gpu GiB':>8} {'analytic':>9} "
          f"{'err%':>7} {'simulated':>9} {'err%':>7} {'step1':>6} {'step3':>6} {'reserved':>8}")
    for index, case in enumerate(accuracy.CASES):
        if args.only not in case[0] or (args.case and index not in args.case):
            continue
        key, strategy, world, mb, seq, ckpt = case
        path = None
        if args.snapshot is not None:
            args.snapshot.mkdir(parents=True, exist_ok=True)
            path = args.snapshot / f"case{index}.pickle"
        try:
            peaks = measure(*case, snapshot=path)
            truth = peaks.step2
        except torch.cuda.OutOfMemoryError:
            print(f"{key:9} {strategy:8} {world:3} {mb:2} {seq:5} out of memory on this GPU")
            continue
        est = accuracy.analytic(accuracy.MODELS[key], strategy, world, mb, seq, ckpt).peak_allocated
        sim = simulated.get(case)
        err = lambda v: None if v is None else round(100 * (v - truth) / truth, 2)  # noqa: E731
        row = dict(model=key, strategy=strategy, world=world, micro_batch=mb, seq_len=seq, checkpointing=ckpt,
                   gpu_max_allocated_bytes=truth, gpu_step1_allocated_bytes=peaks.step1,
                   gpu_step3_allocated_bytes=peaks.step3, gpu_max_reserved_bytes=peaks.reserved,
                   analytic_bytes=est, analytic_err_pct=err(est),
                   simulated_bytes=sim, simulated_err_pct=err(sim))
        rows.append(row)
        print(f"{key:9} {strategy:8} {world:3} {mb:2} {seq:5} {'on' if ckpt else 'off':3} {truth / 2**30:8.2f} "
              f"{est / 2**30:9.2f} {err(est):+7.2f} {'' if sim is None else f'{sim / 2**30:9.2f}'} "
              f"{'' if sim is None else f'{err(sim):+7.2f}'} {peaks.step1 / 2**30:6.2f} "
              f"{peaks.step3 / 2**30:6.2f} {peaks.reserved / 2**30:8.2f}", flush=True)
    for column in ("analytic_err_pct", "simulated_err_pct"):
        errs = [abs(r[column]) for r in rows if r[column] is not None]
        if errs:
            print(f"{column}: median |err| {statistics.median(errs):.2f}%, max {max(errs):.2f}%")
    if rows and not args.no_write:
        accuracy.RESULTS.mkdir(exist_ok=True)
        with open(accuracy.RESULTS / "gpu_truth.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

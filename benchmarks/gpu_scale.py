"""The estimate at a published job's scale on a real GPU: Llama-3.1-8B at 8,192 tokens, as torchtitan's 128-GPU run.

    python benchmarks/gpu_scale.py --out DIR     # on a machine with one CUDA GPU (80 GB): DIR/gpu_scale.jsonl
    python benchmarks/gpu_scale.py --report      # benchmarks/results/gpu_scale.md from the stored runs

``gpu_truth.measure`` with Llama-3.1-8B's bundled config: FSDP2 (zero3) as rank 0 of a fake process group of 128
(what one GPU of torchtitan's ``torchtitan-8b-fsdp128`` run holds, less NCCL's own buffers), micro-batch 2 x 8,192
tokens, torchtitan's selective op checkpointing, fused AdamW, bf16-mixed, HF's loss; once with the caching
allocator's defaults and once with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (each in its own process,
the setting is read at CUDA's start). The other GPU memory checks go up to Gemma 2 2B; this one is where
torchtitan's published reserved figures are; the estimate's reserved was 3-9% below them until FSDP's gradient
shards cached for the reduce-scatter stream were counted (now -1% to -4%, benchmarks/results/published_memory.md).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

from _gpu_cli import gpu_main, write_report  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B"
# (strategy, world, micro-batch, seq, checkpointing): torchtitan-8b-fsdp128 in profiles/published_memory.json
CASE = ("zero3", 128, 2, 8192, "selective")
PUBLISHED = 67.0  # torchtitan-8b-fsdp128's published reserved GiB (profiles/published_memory.json)


def measure_one() -> dict:
    import accuracy
    from gpu_truth import measure

    accuracy.MODELS["llama8b"] = MODEL
    peaks = measure("llama8b", *CASE, optimizer_impl="fused")
    return dict(conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), step1=peaks.step1, step2=peaks.step2,
                step3=peaks.step3, reserved=peaks.reserved, reserved_steps=list(peaks.reserved_steps))


def estimate():
    """The plan's memory for the case: the torch recipe with fused AdamW (the run's), every other setting as run."""
    import accuracy_variants

    from advisor.estimate.memory import estimate_memory
    from advisor.hardware.cluster import parse_gpus
    from advisor.model.sources import resolve_model
    from advisor.strategies import get_strategy

    strategy, world, mb, seq, ckpt = CASE
    config = accuracy_variants.training(seq, None, "hf", ckpt).model_copy(update={"optimizer_implementation": "fused"})
    return estimate_memory(resolve_model(MODEL), parse_gpus(f"{world}xH100"), config, get_strategy(strategy).on("torch"),
                           micro_batch_size=mb, checkpointing=True)


def report() -> int:
    runs = [json.loads(line) for line in open(RESULTS / "gpu_scale.jsonl")]
    memory = estimate()
    gib = 2**30
    lines = ["# The estimate at a published job's scale on a real GPU", "",
             "Measured with `python benchmarks/gpu_scale.py` on an NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, "
             "transformers 5.17.0), 2026-11-27: Llama-3.1-8B as rank 0 of a fake FSDP2 group of 128, micro-batch 2 x "
             "8,192, torchtitan's selective op checkpointing, fused AdamW, bf16-mixed, HF's loss (torchtitan-8b-fsdp128's "
             "settings, planned with the torch recipe). GiB; errors relative to the GPU.", "",
             "| allocator | GPU allocated (step 2) | estimate | err | GPU reserved | estimate | err |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for run in runs:
        alloc, reserved = run["step2"], run["reserved"]
        lines.append(f"| {run['conf'] or 'defaults'} | {alloc / gib:.2f} | {memory.peak_allocated / gib:.2f} | "
                     f"{100 * (memory.peak_allocated - alloc) / alloc:+.2f}% | {reserved / gib:.2f} | "
                     f"{memory.reserved / gib:.2f} | {100 * (memory.reserved - reserved) / reserved:+.1f}% |")
    by_conf = {run["conf"]: run for run in runs}
    default, expandable = by_conf[""], by_conf["expandable_segments:True"]
    lines += ["",
              f"- Allocated: the estimate is within {max(abs(memory.peak_allocated - r['step2']) / r['step2'] for r in runs):.2%} "
              "of the GPU at 8B and 16,384 tokens a micro-batch (the other GPU memory checks go up to Gemma 2 2B).",
              f"- Reserved is {default['reserved'] / default['step2']:.2f} x allocated with the allocator's defaults and "
              f"{expandable['reserved'] / expandable['step2']:.2f} x with expandable segments; the plan's calibrated gap "
              f"(1.104 x + 0.256 GiB, fitted on models of 0.1-1B under the defaults, and under checkpointing "
              f"{memory.recompute_cache / gib:.2f} GiB of the allocator's cache around recomputation, "
              f"profiles/allocator_overhead.json checkpointing_fragmentation, fit on H100 runs this one is not among) "
              f"gives {memory.reserved / gib:.2f} GiB: "
              f"{100 * (memory.reserved - expandable['reserved']) / expandable['reserved']:+.1f}% "
              f"against expandable segments' and {100 * (memory.reserved - default['reserved']) / default['reserved']:+.1f}% "
              "against the defaults' (-1.1% and -8.5% before the checkpointing term).",
              f"- torchtitan published {PUBLISHED:.1f} GiB reserved for this job on 128 GPUs: "
              f"{100 * (PUBLISHED * gib - expandable['reserved']) / expandable['reserved']:+.1f}% from this GPU's "
              f"expandable-segments run and {100 * (PUBLISHED * gib - default['reserved']) / default['reserved']:+.1f}% "
              "from its defaults run. Its own layout (embeddings and norm + head as units of their own), its loss "
              "outside the model, real NCCL communicators and the nightly torch of December 2024 differ from this "
              "replica; which allocator setting it ran with is not stated in the table.", ""]
    return write_report("gpu_scale", lines)


def main() -> int:
    import warnings

    warnings.filterwarnings("ignore")
    return gpu_main(__doc__, "gpu_scale.jsonl", measure=measure_one, report=report, append=True,
                    hint="; run it twice, the second time with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")

if __name__ == "__main__":
    sys.exit(main())

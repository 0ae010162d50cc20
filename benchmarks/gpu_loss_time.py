"""What Hugging Face's causal-LM loss costs on a real GPU, a logit at a time: the step time the plan leaves inside
its fitted utilisation.

    python benchmarks/gpu_loss_time.py --out DIR      # on a machine with one CUDA GPU: DIR/gpu_loss_time.json
    python benchmarks/gpu_loss_time.py --report       # benchmarks/results/gpu_loss_time.md from the stored run

HF's ``ForCausalLMLoss`` upcasts the logits to fp32 and runs ``cross_entropy`` over them; its backward writes the
fp32 gradient and casts it back. Timed here on a bf16 logits tensor of tokens x vocabulary (a leaf, so the head's
matmul is not in it): forward and backward together, the mean of 10 after 3, CUDA events. The report sets the
per-logit cost beside the runs of ``benchmarks/gpu_speed.py`` (same GPU), whose plan folds the loss into a
utilisation fitted on multi-GPU runs (benchmarks/results/gpu_speed.md): how much of each measured step the loss is.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from _gpu_cli import cuda_seconds, gpu_main, write_report  # noqa: E402  (benchmarks/ is the script's folder)

RESULTS = Path(__file__).resolve().parent / "results"
VOCABULARIES = (32000, 128256, 151936, 256000)  # Llama 2, Llama 3, Qwen2.5, Gemma 2
TOKENS = (4096, 16384)
# The vocabulary of each model gpu_speed.py runs (their bundled configs)
SPEED_VOCAB = {"meta-llama/Llama-3.2-1B": 128256, "meta-llama/Llama-3.2-3B": 128256, "meta-llama/Llama-3.1-8B": 128256,
               "Qwen/Qwen2.5-0.5B": 151936}


def measure() -> dict:
    import torch
    import torch.nn.functional as F

    rows = []
    for vocab in VOCABULARIES:
        for tokens in TOKENS:
            logits = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            labels = torch.randint(0, vocab, (tokens,), device="cuda")

            def step() -> None:
                F.cross_entropy(logits.float(), labels, reduction="sum").backward()
                logits.grad = None

            ms = cuda_seconds(step, warmup=3, repeats=10) * 1000
            rows.append(dict(vocab=vocab, tokens=tokens, ms=round(ms, 3), ns_per_logit=round(ms * 1e6 / (tokens * vocab), 4)))
            print(rows[-1], flush=True)
    return dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows)


def report() -> int:
    run = json.loads((RESULTS / "gpu_loss_time.json").read_text())
    per_logit = [row["ns_per_logit"] for row in run["rows"]]
    ps = 1000 * statistics.median(per_logit)
    lines = ["# HF's causal-LM loss on a real GPU", "",
             f"Measured with `python benchmarks/gpu_loss_time.py` on {run['device']}, torch {run['torch']}, 2026-11-27: "
             "bf16 logits (tokens x vocabulary) upcast to fp32, `cross_entropy`, backward; the mean of 10 after 3.", "",
             f"- {ps:.1f} ps a logit (median; {1000 * min(per_logit):.1f} to {1000 * max(per_logit):.1f} over "
             f"{len(per_logit)} shapes): linear in tokens x vocabulary, memory-bound.", "",
             "| vocabulary | tokens | ms | ps a logit |", "| ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['vocab']:,} | {r['tokens']:,} | {r['ms']:.3f} | {1000 * r['ns_per_logit']:.1f} |" for r in run["rows"]]
    lines += ["", "## The loss's share of the gpu_speed.py runs (same GPU, HF's loss inside the model)", "",
              "| run | GPU ms/step | loss ms (tokens x vocabulary x the median) | share |", "| --- | ---: | ---: | ---: |"]
    for line in open(RESULTS / "gpu_speed.jsonl"):
        speed = json.loads(line)
        model, mb, seq, ckpt, lora, compiled = speed["case"]
        loss_ms = mb * seq * SPEED_VOCAB[model] * ps / 1e9
        label = f"{model.split('/')[1]} mb{mb} s{seq}" + (" ckpt" if ckpt == "on" else "") + (f" LoRA r{lora}" if lora else "") \
            + (" compiled" if compiled else "")
        lines.append(f"| {label} | {1000 * speed['seconds']:.0f} | {loss_ms:.1f} | {100 * loss_ms / (1000 * speed['seconds']):.0f}% |")
    lines += ["", "The plan has no loss term: its utilisation (fitted on multi-GPU runs of 4k-80k tokens a micro-batch) "
              "carries each calibration run's own loss. Adding this cost on top, unrefitted, would count the loss twice "
              "where those runs already paid it; a refit with each calibration run's loss kernel separated is not done.", ""]
    return write_report("gpu_loss_time", lines)


def main() -> int:
    return gpu_main(__doc__, "gpu_loss_time.json", measure=measure, report=report)

if __name__ == "__main__":
    sys.exit(main())

"""fp32 steps: the utilisation of an fp32 step (``profiles/efficiency.json`` compute ``fp32_max_utilisation``, one figure
for every GPU) fit on our H200 runs and checked on Hugging Face's V100 runs of 2022.

Run: ``python benchmarks/fp32_speed.py`` (no GPU: it reads ``benchmarks/results/gpu_stacks.jsonl``) and writes
``benchmarks/results/fp32_speed.md``. The fit: the utilisation at which the median of estimated / measured seconds a step
is 1 over the H200's fp32 runs whose micro-batch holds at least 4,096 tokens (below that, launching kernels decides:
those rows are reported, not fit), found by bisection with the step-time model as it is. Held out: the seconds of the
fp32 runs transformers' single-GPU docs published for bert-large-uncased sequence classification on one V100 16 GB in
January 2022 (samples/s of ``trainer.train()``'s output, the measured output blocks the zh translation of
perf_train_gpu_one keeps at transformers c0c397c2, the page the published set's ``hfdocs-`` rows cite), planned as
those rows are (Trainer of 2022: for-loop AdamW, eager attention).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import gpu_stacks_report  # noqa: E402

MIN_TOKENS = 4096
# (run, published samples/s, plan options): the V100's fp32 runs of the docs page (batch 4 x 512 tokens unless said)
V100_FP32 = [
    ("batch 4", 8.86, dict(micro_batch_size=4)),
    ("batch 1, 4 micro-batches a step", 7.75, dict(micro_batch_size=1, global_batch_size=4)),
    ("batch 1, 4 micro-batches, checkpointing", 5.99, dict(micro_batch_size=1, global_batch_size=4,
                                                          activation_checkpointing="on")),
    ("batch 4, Adafactor", 7.96, dict(micro_batch_size=4, optimizer="adafactor")),
]


def h200_rows() -> list[dict]:
    """The stored fp32 runs with seconds a step: BERT-large and the decoders of ``--only speed``."""
    return [r for r in gpu_stacks_report.load() if r["kind"] in ("bert", "speed") and r["precision"] == "fp32"]


@contextlib.contextmanager
def _with_factor(factor: float | None):
    """The step-time model's efficiency profile with ``factor`` as the fp32 utilisation (None: each GPU's own
    max_utilisation, as before it was measured), patched where step_time reads it and put back after."""
    import advisor.estimate.step_time as step_time
    from advisor.hardware.efficiency import load_efficiency

    profile = load_efficiency()
    compute = profile.compute.model_copy(update={"fp32_max_utilisation": factor})
    patched = profile.model_copy(update={"compute": compute})
    step_time.load_efficiency = lambda: patched
    try:
        yield
    finally:
        step_time.load_efficiency = load_efficiency


def ratios(rows: list[dict], factor: float | None) -> list[float]:
    with _with_factor(factor):
        return [gpu_stacks_report.planned(r).step_time_s / r["step_seconds"] for r in rows]


def fit(rows: list[dict]) -> float:
    low, high = 0.2, 1.0
    for _ in range(30):
        mid = (low + high) / 2
        (low, high) = (mid, high) if statistics.median(ratios(rows, mid)) > 1 else (low, mid)
    return round((low + high) / 2, 3)


def v100_ratios(factor: float | None) -> list[tuple[str, float]]:
    """(run, estimated / published samples/s) of the V100 runs at ``factor``."""
    from advisor.planning.api import plan

    out = []
    with _with_factor(factor):
        for name, published, options in V100_FP32:
            options = {"optimizer_impl": "for-loop", **options} if options.get("optimizer") is None else options
            cand = plan("google-bert/bert-large-uncased", "1xV100", task="sequence-classification", strategy="ddp",
                        seq_len=512, attention="eager", recipe="trainer", precision="fp32", **options).candidate("ddp")
            out.append((name, cand.step_time.tokens_per_s / 512 / published))
    return out


def main() -> int:
    warnings.filterwarnings("ignore")
    rows = h200_rows()
    fitted = [r for r in rows if r["micro_batch"] * r["seq_len"] >= MIN_TOKENS]
    factor = fit(fitted)
    lines = ["# fp32 steps: the utilisation factor", "", __doc__.split("\n\n")[1].replace("\n", " "), "",
             f"- fitted: fp32_max_utilisation {factor} over {len(fitted)} runs (profiles/efficiency.json holds the value "
             "tests/test_step_time.py checks against this fit)", "",
             "| run | tokens a micro-batch | measured s | estimated s (the GPU's bf16 fit) | ratio | estimated s (fitted) "
             "| ratio |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    before, after = ratios(rows, None), ratios(rows, factor)
    for r, b, a in zip(rows, before, after):
        lines.append(f"| {gpu_stacks_report.label(r)} {r['model']} mb{r['micro_batch']} | {r['micro_batch'] * r['seq_len']:,} | "
                     f"{r['step_seconds']:.3f} | {b * r['step_seconds']:.3f} | {b:.2f} | {a * r['step_seconds']:.3f} | "
                     f"{a:.2f} |")
    lines += ["", "Held out, Hugging Face's V100 runs of 2022 (estimated / published samples/s; above 1: the plan faster):",
              ""]
    for (name, b), (_, a) in zip(v100_ratios(None), v100_ratios(factor)):
        lines.append(f"- {name}: {b:.2f} with the V100's bf16 fit, {a:.2f} with the fitted fp32 utilisation")
    text = "\n".join(lines) + "\n"
    (HERE / "results" / "fp32_speed.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

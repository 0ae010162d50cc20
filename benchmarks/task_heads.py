"""Per-GPU peak memory of task heads (sequence and token classification, question answering) in place
of the causal-LM head: the analytic estimate (``advisor.model.heads``, ``activations_loss.head_loss_bytes``)
against one training step PyTorch really executes on the head class transformers builds
(``advisor.simulate.step`` with ``advisor.simulate.heads``: Qwen2ForSequenceClassification and the like,
fake tensors on the CPU), and the causal LM's estimate at the same settings beside it.

Run: python benchmarks/task_heads.py [--no-write] [--quick]
Writes benchmarks/results/task_heads.csv and .md. Goal: within 3% on every row, as the LoRA and loss rows.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import accuracy  # noqa: E402  (the models)

SEQ, MB, WORLD = 1024, 2, 2
# (model, task, num_labels, strategy, checkpointing, LoRA rank or None[, (GPUs, micro-batch, seq)])
CASES = [(model, task, 2, strategy, ckpt, None) for model in ("qwen0.5b", "llama1b")
         for task in ("sequence-classification", "token-classification") for strategy in ("ddp", "zero3")
         for ckpt in (False, True)]
CASES += [("qwen0.5b", "question-answering", 2, "ddp", False, None),
          ("qwen0.5b", "sequence-classification", 2, "ddp", False, 16),
          ("llama1b", "token-classification", 5, "zero3", True, 16),
          # Where activations, not the optimizer step, make the peak (FSDP2 over 8 ranks, longer sequences).
          ("llama1b", "token-classification", 2, "zero3", False, None, (8, 2, 4096)),
          ("qwen0.5b", "sequence-classification", 2, "zero3", False, None, (8, 4, 2048)),
          ("llama1b", "sequence-classification", 2, "zero3", False, 16, (8, 4, 2048))]


def shape_of(case: tuple) -> tuple[int, int, int]:
    """(GPUs, micro-batch, seq) of a case."""
    return case[6] if len(case) > 6 else (WORLD, MB, SEQ)


def head_spec(key: str, task: str, num_labels: int):
    from advisor.model.heads import resolve_head, with_head

    spec = accuracy.spec_for(accuracy.MODELS[key])
    head = resolve_head(task, num_labels if task != "question-answering" else None,
                        architecture=spec.architecture, config=None)
    return spec, with_head(spec, head), head


def training(lora: int | None, head_module: str | None, ckpt: bool, seq: int = SEQ):
    from advisor.model.lora import LoraConfig
    from advisor.training import TrainingConfig

    adapters = None if lora is None else LoraConfig(rank=lora, modules_to_save=(head_module,) if head_module else None)
    return TrainingConfig(seq_len=seq, lora=adapters, activation_checkpointing="on" if ckpt else "off")


def estimate(spec, train, strategy: str, ckpt: bool, world: int = WORLD, mb: int = MB) -> int:
    from advisor.estimate.memory import estimate_memory
    from advisor.hardware.cluster import parse_gpus
    from advisor.model.lora import with_lora
    from advisor.strategies import get_strategy

    if train.lora is not None:
        spec = with_lora(spec, train.lora)
    return estimate_memory(spec, parse_gpus(f"{world}xH100"), train, get_strategy(strategy).on("torch"),
                           micro_batch_size=mb, checkpointing=ckpt).peak_allocated


def run_case(case: tuple) -> dict:
    from advisor.model.lora import with_lora
    from advisor.simulate.heads import head_config
    from advisor.simulate.model import resolve_config
    from advisor.simulate.step import simulate

    key, task, labels, strategy, ckpt, lora = case[:6]
    world, mb, seq = shape_of(case)
    causal, spec, head = head_spec(key, task, labels)
    cfg = head_config(resolve_config(accuracy.MODELS[key])[1], head)
    train = training(lora, head.module, ckpt, seq)
    sim = simulate(cfg, world_size=world, strategy=strategy, training=train,
                   micro_batch_size=mb, checkpointing=ckpt)
    est = estimate(spec, train, strategy, ckpt, world, mb)
    lm = estimate(causal, training(lora, None, ckpt, seq), strategy, ckpt, world, mb)
    err = round(100 * (est - sim.peak_allocated) / sim.peak_allocated, 2)
    return dict(model=key, task=task, labels=head.num_labels, strategy=strategy, gpus=world, micro_batch=mb,
                seq_len=seq, ckpt="on" if ckpt else "off", lora=f"r{lora}" if lora else "-", sim_params=sim.total_params,
                est_params=(spec if lora is None else with_lora(spec, train.lora)).total_params, simulated=sim.peak_allocated, analytic=est, err_pct=err, causal_lm=lm,
                sim_trainable=sim.trainable_params, wall_s=sim.wall_s)


def _key(row: dict) -> tuple:
    shape = {"gpus": WORLD, "micro_batch": MB, "seq_len": SEQ}  # rows written before these columns
    return tuple(str(row.get(k, shape.get(k))) for k in ("model", "task", "labels", "strategy", "gpus", "micro_batch",
                                                          "seq_len", "ckpt", "lora"))


def _merged(rows: list[dict]) -> list[dict]:
    """The rows run now over those of the committed CSV (a partial rerun keeps the others), in CASES order."""
    path = HERE / "results" / "task_heads.csv"
    kept = {}
    if path.exists():
        with open(path) as fh:
            for row in csv.DictReader(fh):
                read = {k: (float(v) if k in ("err_pct", "wall_s") else int(v) if v.isdigit() else v)
                        for k, v in row.items()}
                kept[_key(read)] = {**read, "gpus": read.get("gpus", WORLD), "micro_batch": read.get("micro_batch", MB),
                                    "seq_len": read.get("seq_len", SEQ)}
    kept.update({_key(row): row for row in rows})
    order = {_key(dict(model=c[0], task=c[1], labels=c[2], strategy=c[3], gpus=shape_of(c)[0],
                       micro_batch=shape_of(c)[1], seq_len=shape_of(c)[2], ckpt="on" if c[4] else "off",
                       lora=f"r{c[5]}" if c[5] else "-")): i for i, c in enumerate(CASES)}
    columns = list(next(iter(rows)).keys()) if rows else None
    ordered = sorted(kept.values(), key=lambda row: order.get(_key(row), len(order)))
    return [{k: row.get(k) for k in columns} for row in ordered] if columns else ordered


def reestimate() -> list[dict]:
    """The committed rows with the estimate recomputed (an estimator change; the simulated step is unchanged)."""
    rows = _merged([])
    for row in rows:
        case = (row["model"], row["task"], row["labels"], row["strategy"], row["ckpt"] == "on",
                int(row["lora"][1:]) if row["lora"] != "-" else None)
        causal, spec, head = head_spec(*case[:3])
        train = training(case[5], head.module, case[4], row["seq_len"])
        row["analytic"] = estimate(spec, train, case[3], case[4], row["gpus"], row["micro_batch"])  # LoRA added there
        row["causal_lm"] = estimate(causal, training(case[5], None, case[4], row["seq_len"]), case[3], case[4],
                                    row["gpus"], row["micro_batch"])
        row["err_pct"] = round(100 * (row["analytic"] - row["simulated"]) / row["simulated"], 2)
    return rows


def write(rows: list[dict]) -> None:
    rows = _merged(rows)
    out = HERE / "results"
    with open(out / "task_heads.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    errs = [abs(r["err_pct"]) for r in rows]
    gib = lambda n: f"{n / 2**30:.2f}"  # noqa: E731
    lines = ["# Task heads: the estimate against PyTorch's execution", "",
             "Simulated: one measured step of the head class transformers builds (bf16-mixed, AdamW, SDPA; fake "
             "tensors under a fake process group; LoRA rows: PEFT's adapters on q_proj and v_proj with the head in "
             "modules_to_save, over a bf16 base). GiB. 'causal LM' is the estimate of the same job with the "
             f"vocabulary head. Analytic vs simulated: median |err| {statistics.median(errs):.2f}%, max "
             f"{max(errs):.2f}% over {len(rows)} cases.", "",
             "| model | task | labels | strategy | GPUs | mb | seq | ckpt | LoRA | params (sim) | simulated | analytic "
             "| err | causal LM |",
             "| --- | --- | ---: | --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['task']} | {r['labels']} | {r['strategy']} | {r['gpus']} | "
                     f"{r['micro_batch']} | {r['seq_len']} | {r['ckpt']} | {r['lora']} | "
                     f"{r['sim_params']:,} | {gib(r['simulated'])} | {gib(r['analytic'])} | {r['err_pct']:+.2f}% | "
                     f"{gib(r['causal_lm'])} |")
    (out / "task_heads.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--quick", action="store_true", help="the first two cases only")
    parser.add_argument("--only", type=int, nargs="*", help="case indices")
    parser.add_argument("--reestimate", action="store_true", help="recompute the estimates of the committed rows")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.reestimate:
        write(reestimate())
        return
    cases = CASES[:2] if args.quick else [CASES[i] for i in args.only] if args.only else CASES
    rows = []
    for case in cases:
        start = time.perf_counter()
        row = run_case(case)
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), f"({time.perf_counter() - start:.0f} s)", flush=True)
        if not args.no_write:  # after every case: a long run keeps what it measured
            write(rows)


if __name__ == "__main__":
    main()

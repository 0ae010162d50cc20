"""The host floor of a step: operators a training step launches from Python, counted on the CPU, and the seconds an
operator costs, fitted on our timed GPU runs (``profiles/host_overhead.json``, read by ``advisor.estimate.host_time``).

    PYTHONPATH=$PWD python benchmarks/host_ops.py --count   # recount the operators (torch, transformers, peft)
    PYTHONPATH=$PWD python benchmarks/host_ops.py           # fit seconds_per_op, write benchmarks/results/host_ops.md

Counting: each family's model is built from a bundled config at 2 and 4 layers (width 64: an operator count does
not depend on the width), in fp32, and one forward with HF's loss and one backward run under a TorchDispatchMode
that counts every ATen operator dispatched (views included: each costs the host a dispatch; not ``.item()`` of a
CPU scalar or the profiler's markers, ``NOT_LAUNCHED``). The difference of
the two depths over 2 is a block's count; what the 2-layer model runs beyond two blocks is the embedding, final
norm, head and loss ("outside"). Each family is counted as it is (no autocast: fp32 or pure low precision
weights), under CPU autocast to bfloat16 (the casts autocast adds over fp32 weights), with HF's gradient
checkpointing (``gradient_checkpointing_enable()``: reentrant, the recompute counted in backward), and with PEFT
LoRA on every linear of the blocks (the operators an adapted linear adds, the frozen base's weight gradients
gone).

Fitting: the seconds an operator costs, from our Trainer runs on one H200 whose step the GPU work cannot explain
(``benchmarks/results/gpu_stacks.jsonl``: the BERT rows, ``kind`` bert); the timed causal-LM rows (``kind`` speed,
Qwen2.5-0.5B and Llama-3.2-1B) are held out. A row is host-bound where its measured step is more than twice the
plan's GPU time (the plan without the floor); the fit is the median of measured seconds / the step's operators
over those rows. Every timed row is then reported with the plan's step before and after the floor.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "host_overhead.json"
STACKS = ROOT / "benchmarks" / "results" / "gpu_stacks.jsonl"
RESULT = ROOT / "benchmarks" / "results" / "host_ops.md"
MODELS = ROOT / "profiles" / "models"
# family -> (bundled config it is counted on, the head: causal LM or sequence classification, attention)
COUNTED = {
    "decoder": ("meta-llama/Llama-3.2-1B", "lm", "sdpa"),
    "bert": ("google-bert/bert-large-uncased", "cls", "sdpa"),
    "gpt2": ("openai-community/gpt2", "lm", "sdpa"),
}
HOST_BOUND = 2.0
# Dispatched but launching nothing on the GPU: .item() of the optimizers' CPU step counters (a host read), the
# profiler's record_function markers
NOT_LAUNCHED = ("aten._local_scalar_dense", "profiler.")  # a row is host-bound where it ran this many times the plan's GPU time


def _config(name: str):
    from transformers import AutoConfig

    raw = {k: v for k, v in json.loads((MODELS / f"{name}.json").read_text()).items() if not k.startswith("_")}
    cfg = AutoConfig.for_model(raw.pop("model_type"), **raw)
    for key, value in (("hidden_size", 64), ("intermediate_size", 128), ("num_attention_heads", 4), ("head_dim", 16),
                       ("n_embd", 64), ("n_head", 4), ("n_inner", 128)):
        if hasattr(cfg, key):
            setattr(cfg, key, value)
    if getattr(cfg, "num_key_value_heads", None):
        cfg.num_key_value_heads = 2
    return cfg


def _counter():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += not str(func).startswith(NOT_LAUNCHED)
            return func(*args, **(kwargs or {}))

    return Counter()


def _model(name: str, head: str, attention: str, *, layers: int, lora: str | list[str] | None = None,
           checkpointing: bool = False):
    """A ``layers``-deep fp32 copy of ``name`` in training mode (PEFT LoRA on ``lora``'s targets)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    cfg = _config(name)
    for key in ("num_hidden_layers", "n_layer"):
        if hasattr(cfg, key):
            setattr(cfg, key, layers)
    torch.manual_seed(0)
    cls = AutoModelForSequenceClassification if head == "cls" else AutoModelForCausalLM
    model = cls.from_config(cfg, attn_implementation=attention, dtype=torch.float32)
    if lora:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=lora,
                                                            task_type="SEQ_CLS" if head == "cls" else "CAUSAL_LM"))
    if checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    return model


def _step(model, head: str, *, autocast: bool = False) -> tuple[int, int]:
    """(forward, backward) operators of one micro-batch of ``model``."""
    import torch

    ids = torch.randint(0, 100, (2, 16))
    labels = torch.randint(0, 2, (2,)) if head == "cls" else ids
    region = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with _counter() as forward, region:
        loss = model(input_ids=ids, labels=labels).loss
    with _counter() as backward:
        loss.backward()
    return forward.ops, backward.ops


def _count(name: str, head: str, attention: str, *, layers: int, autocast: bool, checkpointing: bool,
           lora: str | list[str] | None) -> tuple[int, int]:
    """(forward, backward) ATen operators of one micro-batch of a ``layers``-deep copy of ``name``."""
    return _step(_model(name, head, attention, layers=layers, lora=lora, checkpointing=checkpointing), head,
                 autocast=autocast)


def _per_block(name: str, head: str, attention: str, **variant) -> dict:
    shallow = _count(name, head, attention, layers=2, **variant)
    deep = _count(name, head, attention, layers=4, **variant)
    block = [(d - s) // 2 for s, d in zip(shallow, deep)]
    return {"block": block, "outside": [max(s - 2 * b, 0) for s, b in zip(shallow, block)]}


# family -> one linear of each block (PEFT suffix), to split LoRA's operators into the frozen block's and an adapter's
ONE_TARGET = {"decoder": ["q_proj"], "bert": ["query"], "gpt2": ["c_attn"]}
def _block_linears(name: str, head: str, attention: str) -> int:
    """Linear layers (``nn.Linear``, transformers' ``Conv1D``) in one block, PEFT's all-linear inside the blocks."""
    import re

    names = [n for n, m in _model(name, head, attention, layers=2).named_modules()
             if type(m).__name__ in ("Linear", "Conv1D")]
    return sum(1 for n in names if re.search(r"\.0\.", n))


def count() -> dict:
    """The profile's counted section (``families``), counted now."""
    import torch
    import transformers

    families = {}
    for family, (name, head, attention) in COUNTED.items():
        row: dict = {"counted_on": name}
        for label, autocast in (("plain", False), ("autocast", True)):
            eager = _per_block(name, head, attention, autocast=autocast, checkpointing=False, lora=None)
            ckpt = _per_block(name, head, attention, autocast=autocast, checkpointing=True, lora=None)
            row[label] = {"block": eager["block"], "outside": eager["outside"], "block_checkpointed": ckpt["block"],
                          "outside_checkpointed": ckpt["outside"]}
        every = _per_block(name, head, attention, autocast=False, checkpointing=False, lora="all-linear")
        one = _per_block(name, head, attention, autocast=False, checkpointing=False, lora=ONE_TARGET[family])
        linears = _block_linears(name, head, attention)
        adapter = [(e - o) / (linears - 1) for e, o in zip(every["block"], one["block"])]
        row["lora"] = {"block_frozen": [round(o - a) for o, a in zip(one["block"], adapter)],
                       "per_adapter": [round(a, 1) for a in adapter], "outside": one["outside"]}
        print(family, row, flush=True)
        families[family] = row
    return {"families": families, "counted_with": f"torch {torch.__version__}, transformers {transformers.__version__}"}


def _timed_rows() -> list[dict]:
    return [row for row in map(json.loads, STACKS.read_text().splitlines())
            if row.get("kind") in ("bert", "speed") and row.get("step_seconds")]


def _plans(row: dict) -> tuple[float, float, int]:
    """(the plan's step without the floor, with it, the operators of the step's micro-batches)."""
    import advisor
    import gpu_stacks_report
    from advisor.estimate import host_time
    from advisor.strategies import get_strategy

    kwargs = gpu_stacks_report.job(row)
    model = BERT if row["kind"] == "bert" else MODEL_OF[row["model"]]
    floored = advisor.plan(model, **kwargs)
    with host_time.floor_disabled():
        gpu = advisor.plan(model, **kwargs)
    cand = floored.chosen
    impl = get_strategy(cand.strategy).on(cand.engine)
    ops = host_time.host_ops(floored.model, floored.training, impl, checkpointing=cand.checkpointing != "off")
    return gpu.chosen.step_time_s, cand.step_time_s, ops * cand.gradient_accumulation_steps


BERT = "google-bert/bert-large-uncased"
MODEL_OF = {"qwen0.5b": "Qwen/Qwen2.5-0.5B", "llama1b": "meta-llama/Llama-3.2-1B"}


def fit() -> tuple[str, float]:
    rows = [(row, *_plans(row)) for row in _timed_rows()]
    bound = [row["step_seconds"] / ops for row, gpu, _, ops in rows
             if row["kind"] == "bert" and row["step_seconds"] > HOST_BOUND * gpu and ops]
    per_op = statistics.median(bound)
    lines = ["# The host floor: operators a step launches, against timed GPU runs", "",
             "Written by `python benchmarks/host_ops.py` (the method: its docstring). Operators counted on the CPU "
             "(`profiles/host_overhead.json`); seconds a step measured by `benchmarks/gpu_stacks.py` under the "
             "Trainer on one H200 (`benchmarks/results/gpu_stacks.jsonl`).", "",
             f"- fit on {len(bound)} host-bound BERT rows (measured step over {HOST_BOUND:g}x the plan's GPU time): "
             f"{per_op * 1e6:.1f} us an operator (median; spread {min(bound) * 1e6:.1f}-{max(bound) * 1e6:.1f})", ""]
    errors: dict[str, list[float]] = {"before": [], "after": [], "held_before": [], "held_after": []}
    lines += ["| run | model | mb | accumulation | ckpt | precision | LoRA | operators a step | measured s | plan before | "
              "err | plan after | err |", "| --- | --- | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | "
              "---: | ---: |"]
    for row, gpu, floored, ops in rows:
        before, after = gpu / row["step_seconds"] - 1, floored / row["step_seconds"] - 1
        held = "" if row["kind"] == "bert" else "held_"
        errors[held + "before"].append(before)
        errors[held + "after"].append(after)
        lines.append(f"| {row.get('name', row['model'])} | {row['model']} | {row['micro_batch']} | "
                     f"{row.get('accumulation', 1)} | {'on' if row.get('checkpointing') else 'off'} | {row['precision']} "
                     f"| {row.get('lora_rank') or '-'} | {ops:,} | {row['step_seconds']:.3f} | {gpu:.3f} | "
                     f"{before:+.0%} | {floored:.3f} | {after:+.0%} |")

    def summary(errs: list[float]) -> str:
        return (f"median |error| {statistics.median(abs(e) for e in errs):.0%}, signed {min(errs):+.0%} to "
                f"{max(errs):+.0%} over {len(errs)}")

    lines[5:5] = [f"- BERT rows (the fit's source): before the floor {summary(errors['before'])}; with it "
                  f"{summary(errors['after'])}",
                  f"- held out, the causal-LM rows: before {summary(errors['held_before'])}; with it "
                  f"{summary(errors['held_after'])}"]
    return "\n".join(lines) + "\n", per_op


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", action="store_true", help="recount the operators into the profile")
    args = parser.parse_args()
    profile = json.loads(PROFILE.read_text())
    if args.count:
        profile.update(count())
        PROFILE.write_text(json.dumps(profile, indent=2) + "\n")
        return
    report, per_op = fit()
    RESULT.write_text(report)
    print(report)
    print(f"profile seconds_per_op {profile['seconds_per_op']}; fitted now {per_op:.3g}")


if __name__ == "__main__":
    main()

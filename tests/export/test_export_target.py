"""What each format can express is read from the strategy table (issue 10, one source for each fact).

The expected pairs are worked by hand from what the launchers offer: accelerate, the Trainer and
Lightning have no single-process DataParallel and no ZeroRedundancyOptimizer option, but run DDP,
FSDP2 and every DeepSpeed stage; a DeepSpeed JSON is DeepSpeed only; torchrun starts any script.
"""

from __future__ import annotations

import pytest

from advisor.export.target import expresses, why_not_expressed
from advisor.strategies import STRATEGIES

LAUNCHER_PAIRS = {
    ("ddp", "torch"), ("zero2", "torch"), ("zero3", "torch"), ("zero2_offload", "torch"), ("zero3_offload", "torch"),
    ("ddp", "deepspeed"), ("zero1", "deepspeed"), ("zero2", "deepspeed"), ("zero3", "deepspeed"),
    ("zero2_offload", "deepspeed"), ("zero3_offload", "deepspeed"),
}
DEEPSPEED_PAIRS = {p for p in LAUNCHER_PAIRS if p[1] == "deepspeed"}
ALL_AVAILABLE = LAUNCHER_PAIRS | {("dp", "torch"), ("zero1", "torch")}


@pytest.mark.parametrize("fmt,expected", [
    ("accelerate", LAUNCHER_PAIRS), ("trainer-args", LAUNCHER_PAIRS), ("lightning", LAUNCHER_PAIRS),
    ("deepspeed-json", DEEPSPEED_PAIRS), ("torchrun", ALL_AVAILABLE),
])
def test_expressible_pairs(fmt, expected):
    pairs = {(s, e) for s in STRATEGIES for e in ("torch", "deepspeed") if expresses(fmt, s, e)}
    assert pairs == expected


def test_why_not_names_what_runs_and_the_exact_alternative():
    assert why_not_expressed("dp", "torch", "accelerate") == (
        "dp (torch.nn.DataParallel, one process) has no accelerate config: launchers start one process per GPU; "
        "DDP keeps no more per GPU than DataParallel and is faster")
    assert why_not_expressed("zero1", "torch", "lightning") == (
        "zero1 on the torch engine (DDP + ZeroRedundancyOptimizer) has no lightning config: it has no "
        "ZeroRedundancyOptimizer option; for ZeRO-1 exactly, re-run with --engine deepspeed (DeepSpeed ZeRO stage 1)")
    assert why_not_expressed("zero2", "torch", "deepspeed-json") == "deepspeed-json runs only DeepSpeed; the plan used engine torch"


# --- precision spellings come from advisor.precision's table ------------------------------------

def test_no_export_module_spells_a_precision():
    """Every framework spelling (accelerate, Lightning, DeepSpeed, Trainer) is read from PRECISIONS."""
    import re
    from pathlib import Path

    import advisor.export

    # Lightning strings, precision names, and a dict keyed by precision name (the old _PRECISION).
    spellings = re.compile(r"""["'](bf16-mixed|16-mixed|32-true|bf16-true|fp16-mixed)["']|\{\s*["']fp32["']\s*:""")
    found = [f"{path.name}: {line.strip()}" for path in Path(advisor.export.__file__).parent.glob("*.py")
             for line in path.read_text().splitlines() if spellings.search(line)]
    assert found == []


@pytest.mark.parametrize("precision,trainer,deepspeed,lightning", [
    # Hand-written from each framework's documentation (see advisor/precision.py's docstring).
    ("fp32", (False, False), (False, False), "32-true"),
    ("bf16-mixed", (True, False), (True, False), "bf16-mixed"),
    ("fp16-mixed", (False, True), (False, True), "16-mixed"),
    ("bf16", (True, False), (True, False), "bf16-true"),
])
def test_precision_spellings_in_each_format(precision, trainer, deepspeed, lightning):
    from export_plans import make_plan

    from advisor.export.deepspeed import build_deepspeed
    from advisor.export.lightning import build_lightning
    from advisor.export.trainer import build_trainer_args

    plan = make_plan("Qwen/Qwen2.5-0.5B", precision=precision, strategy="ddp")
    args = build_trainer_args(plan)
    assert (args["bf16"], args["fp16"]) == trainer
    ds = build_deepspeed(make_plan("Qwen/Qwen2.5-0.5B", precision=precision, strategy="ddp", engine="deepspeed"))
    assert (ds["bf16"]["enabled"], ds["fp16"]["enabled"]) == deepspeed
    assert f'precision="{lightning}",' in build_lightning(plan)


def test_loss_and_lora_reach_the_exports():
    """--loss fused becomes the Trainer's use_liger_kernel (TrainingArguments accepts it); every format
    says how the script supplies the loss kernel and the LoRA adapters, which no config key carries."""
    import advisor
    from advisor.export.target import resolve_target
    from advisor.export.trainer import build_trainer_args
    from advisor.model.lora import LoraConfig
    from transformers import TrainingArguments

    plan = advisor.plan("Qwen/Qwen2.5-7B", "8xH100", loss="fused", lora=LoraConfig(rank=16, dropout=0.05))
    args = build_trainer_args(plan)
    assert args["use_liger_kernel"] is True
    assert TrainingArguments(output_dir="out", use_cpu=True, **{k: v for k, v in args.items()
                                                                 if k not in ("fsdp", "fsdp_config", "deepspeed")})
    notes = resolve_target(plan, "accelerate").notes
    assert any('use_loss_kernel(model, "fused")' in note for note in notes)
    # target_modules=None: PEFT picks its default for the model type, as the plan counted.
    assert any("LoraConfig(r=16, target_modules=None, lora_dropout=0.05))" in note for note in notes)


def _checkpointing_notes(plan_, fmt: str) -> list[str]:
    from advisor.export import export_text

    return [note for note in export_text(plan_, fmt)[1].notes if "checkpoint" in note.lower()]


def test_a_file_that_cannot_checkpoint_says_once_how_the_script_does():
    """A review: the DeepSpeed JSON of a plan that fits only with checkpointing (Qwen2.5-7B on 4 x A100 40GB, zero3)
    said nothing of it, and a DDP accelerate file of a selective plan said both 'call gradient_checkpointing_enable()'
    and 'the file checkpoints each block in full ... turn that off', though a MULTI_GPU config checkpoints nothing.
    A file without the key gets one instruction, the plan's mode; one that turns full checkpointing on, none (or, for a
    selective plan, the turn-that-off note)."""
    from advisor.planning.api import plan

    full = plan("Qwen/Qwen2.5-7B", "4xA100-40GB-SXM", recipe="deepspeed")
    assert full.recommendation.checkpointing == "on"
    (note,) = _checkpointing_notes(full, "deepspeed-json")
    assert "model.gradient_checkpointing_enable()" in note and "activation_checkpointing=True" in note
    assert _checkpointing_notes(full, "torchrun") == [note]
    selective = plan("meta-llama/Llama-3.1-8B", "1xRTX4090", lora=16, quantize="nf4", recipe="trainer")
    assert (selective.recommendation.strategy, selective.recommendation.checkpointing) == ("ddp", "selective")
    for fmt in ("accelerate", "torchrun"):
        (note,) = _checkpointing_notes(selective, fmt)
        assert 'apply_requested_checkpointing(model, "selective")' in note, fmt
        assert "in full" not in note and "gradient_checkpointing_enable" not in note, fmt
    (note,) = _checkpointing_notes(selective, "trainer-args")  # its file turns full checkpointing on
    assert "checkpoints each block in full" in note
    fsdp = plan("Qwen/Qwen2.5-7B", "2xA100", recipe="trainer", strategy="zero3", activation_checkpointing="on")
    assert _checkpointing_notes(fsdp, "accelerate") == []  # fsdp_activation_checkpointing carries it

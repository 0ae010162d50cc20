"""``--trl-release``: TRL's SFTTrainer prepared a k-bit LoRA model with PEFT's prepare_model_for_kbit_training until
0.26.0 (the unquantised base upcast to fp32, fp32 adapters); since huggingface/trl#4577 (v0.26.0) it keeps the base in
the bf16 it was loaded in and casts every trainable parameter to bf16 (profiles/library_releases.json
trl_sft_keeps_kbit_base_in_bf16). Checked by hand: bf16 adapters hold half the fp32 bytes in weights, gradients and
AdamW state; the residual stream is the one of a base that was never upcast (the recipe row without kbit_upcast)."""

from __future__ import annotations

import json

from advisor.frozen import validated_copy
from advisor.model.lora import LoraConfig
from advisor.planning.api import plan
from advisor.recipes import get_recipe
from tests.cli._main import run_main

LORA = LoraConfig(rank=16, targets="all-linear")
JOB = dict(lora=LORA, quantize="nf4", seq_len=4096, strategy="ddp", micro_batch_size=2, activation_checkpointing="on")


def _ddp(**options):
    return plan("meta-llama/Llama-3.1-8B", "1xRTX4090", **{**JOB, **options}).candidate("ddp").memory_bytes


def test_since_0_26_the_adapters_train_in_bf16_over_a_bf16_base():
    old, new = _ddp(recipe="trainer"), _ddp(recipe="trainer", trl_release="0.26.0")
    assert 2 * new.states_grads == old.states_grads and 2 * new.states_optimizer == old.states_optimizer
    unprepared = _ddp(recipe=validated_copy(get_recipe("trainer"), {"kbit_upcast": False}))
    assert new.activations == unprepared.activations < old.activations
    assert _ddp(recipe="trainer", trl_release="0.25.1") == old
    assert _ddp(recipe="trainer", trl_release="1.9.0") == new


def test_another_stack_or_a_full_fine_tune_is_unchanged():
    assert _ddp(recipe="torch", trl_release="1.9.0") == _ddp(recipe="torch")
    full = dict(lora=None, quantize=None)
    assert _ddp(recipe="trainer", trl_release="1.9.0", **full) == _ddp(recipe="trainer", **full)


def test_the_release_is_said(capsys):
    args = ["plan", "-m", "meta-llama/Llama-3.1-8B", "-g", "1xRTX4090", "--recipe", "trainer", "--lora", "16",
            "--quantize", "nf4", "--json"]
    code, out, err = run_main([*args, "--trl-release", "1.9.0"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["training"]["trl_release"] == "1.9.0"
    assert any(a.startswith("trl 1.9.0 (--trl-release): SFTTrainer keeps the k-bit base in the bf16") for a in
               doc["assumptions"])
    code, out, _ = run_main(args, capsys)
    assert "trl_release" not in json.loads(out)["training"]


def test_the_note_says_what_was_planned(capsys):
    """Under fp16-mixed the 0.26+ preparation is not modelled (the plan says it counts the older one); under the
    DeepSpeed engine the release changes nothing (the engine casts the whole model)."""
    args = ["plan", "-m", "meta-llama/Llama-3.1-8B", "-g", "1xRTX4090", "--recipe", "trainer", "--lora", "16",
            "--quantize", "nf4", "--trl-release", "1.9.0", "--json"]

    def note(*extra):
        code, out, err = run_main([*args, *extra], capsys)
        assert code in (0, 3), err
        return next(a for a in json.loads(out)["assumptions"] if a.startswith("trl 1.9.0"))

    assert "modelled under bf16-mixed only; this fp16-mixed plan counts the preparation before 0.26" in \
        note("--precision", "fp16-mixed")
    assert "changes nothing here (the DeepSpeed engine" in note("--engine", "deepspeed")

"""TRL casts PEFT's modules_to_save copies of the embedding and head to bf16 over a 4-bit base (trl/trainer/utils.py
peft_module_casting_to_bf16, called after get_peft_model in SFTTrainer: ``Recipe.kbit_casts_copies``), so they train
with bf16 weights, gradients and AdamW state, while the LoRA adapters stay fp32. Philipp Schmid's one-L4 QLoRA of
Llama 3.1 8B trains both copies (lora_modules_to_save ['lm_head', 'embed_tokens']). Worked by hand: each copy is
128,256 x 4,096 = 525,336,576 parameters; two of them, 2 bytes less a weight, a gradient, and each of AdamW's two
moments, and 2 less in the foreach step's sqrt(v) temporary."""

from __future__ import annotations

import pytest

from advisor.estimate.states import model_states
from advisor.frozen import validated_copy
from advisor.model.lora import LoraConfig, with_lora
from advisor.model.sources import resolve_model
from advisor.recipes import get_recipe
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig

COPIES = 2 * 128_256 * 4_096
LORA = LoraConfig(rank=16, targets="all-linear", modules_to_save=("lm_head", "embed_tokens"))


def _states(strategy: str, *, cast: bool, world: int = 1):
    recipe = get_recipe("trainer")
    if not cast:
        recipe = validated_copy(recipe, {"kbit_casts_copies": False})
    training = TrainingConfig(recipe=recipe, quantize="nf4", lora=LORA, optimizer_impl="foreach", seq_len=1024)
    spec = with_lora(resolve_model("meta-llama/Llama-3.1-8B"), LORA)
    return model_states(spec, training, get_strategy(strategy).on("torch"), world)


def test_the_copies_train_in_bf16_on_one_gpu():
    cast, kept = _states("ddp", cast=True), _states("ddp", cast=False)
    assert kept.grads - cast.grads == 2 * COPIES
    assert kept.optimizer - cast.optimizer == 2 * 2 * COPIES
    assert kept.step_temporary - cast.step_temporary == 2 * COPIES


@pytest.mark.parametrize("strategy", ["zero3"])
def test_a_sharded_base_keeps_them(strategy):
    """TRL skips prepare_model_for_kbit_training and the cast for FSDP / ZeRO-3 QLoRA (is_sharded_qlora)."""
    assert _states(strategy, cast=True, world=2) == _states(strategy, cast=False, world=2)


def test_only_the_trainer_over_a_4bit_base_under_bf16_mixed():
    base = dict(recipe="trainer", lora=LORA)
    assert TrainingConfig(**base, quantize="nf4").copies_in_compute_dtype
    assert not TrainingConfig(**base).copies_in_compute_dtype
    assert not TrainingConfig(**base, quantize="int8").copies_in_compute_dtype
    assert not TrainingConfig(**base, quantize="nf4", precision="fp16-mixed").copies_in_compute_dtype
    assert not TrainingConfig(recipe="torch", lora=LORA, quantize="nf4").copies_in_compute_dtype

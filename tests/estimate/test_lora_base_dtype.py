"""A LoRA model's frozen base rests as users hold it (issue 19): under bf16-mixed the recipes that load
the checkpoint's dtype (torch, trainer: from_pretrained's dtype='auto') hold it in bf16 and PEFT's
adapters in fp32; a recipe that builds the model in fp32 (lightning's bf16-mixed) holds it in fp32."""

from __future__ import annotations

import pytest

from advisor.estimate.memory import model_states
from advisor.model.lora import with_lora
from advisor.model.sources import resolve_model
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig

BASE = 7_615_616_512  # Qwen2.5-7B
# Rank 16 on q_proj (3584 -> 3584) and v_proj (3584 -> 512), 28 layers: 16 x (7168 + 4096) x 28
ADAPTERS = 16 * (3584 + 3584 + 3584 + 512) * 28  # 5,046,272


def _params(recipe: str, strategy: str = "ddp", world: int = 1, **training) -> int:
    config = TrainingConfig(recipe=recipe, lora=16, **training)
    spec = with_lora(resolve_model("Qwen/Qwen2.5-7B"), config.lora)
    assert spec.trainable_params == ADAPTERS
    return model_states(spec, config, get_strategy(strategy).on("torch"), world).params


@pytest.mark.parametrize("recipe", ["torch", "trainer"])
def test_base_rests_in_bf16_adapters_in_fp32(recipe):
    assert _params(recipe) == 2 * BASE + 4 * ADAPTERS  # 14.20 GiB (28.39 GiB before)


def test_fsdp_shards_the_bf16_base():
    assert _params("torch", "zero3", 2) == -(-(2 * BASE + 4 * ADAPTERS) // 2)


def test_fp32_model_recipe_and_pure_bf16_unchanged():
    assert _params("lightning") == 4 * (BASE + ADAPTERS)
    assert _params("torch", precision="bf16") == 2 * (BASE + ADAPTERS)
    assert _params("torch", precision="fp32") == 4 * (BASE + ADAPTERS)

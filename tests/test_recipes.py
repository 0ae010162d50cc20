"""The recipe table (profiles/recipes.json): every row validated and cited, and the facts that the
installed frameworks can show checked against them."""

from __future__ import annotations

import pytest

from advisor.recipes import get_recipe, load_recipes
from advisor.training import TrainingConfig


def test_every_stack_is_a_cited_row():
    recipes = load_recipes()
    assert set(recipes) == {"torch", "trainer", "lightning", "torchtitan", "deepspeed", "torchtune"}
    for recipe in recipes.values():
        assert {"optimizer_impl", "frozen_base", "loss", "engine"} <= set(recipe.sources)


def test_trainer_row_matches_transformers_default_optimizer():
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(output_dir="unused", report_to=[])
    assert args.optim == "adamw_torch_fused"
    assert get_recipe("trainer").optimizer_impl == "fused"


def test_torch_row_matches_torch_optim_default():
    """torch.optim.AdamW with neither flag: foreach where the device has foreach kernels, never fused."""
    torch = pytest.importorskip("torch")
    from torch.optim.optimizer import _default_to_fused_or_foreach

    fused, _ = _default_to_fused_or_foreach([torch.zeros(2)], False, use_fused=False)
    assert fused is False
    assert get_recipe("torch").optimizer_impl == "foreach"


def test_recipe_sets_engine_and_refuses_one_it_cannot_drive():
    assert TrainingConfig(recipe="deepspeed").engine == "deepspeed"
    assert TrainingConfig(recipe="trainer", engine="deepspeed").engine == "deepspeed"
    with pytest.raises(ValueError, match="torchtitan runs on torch"):
        TrainingConfig(recipe="torchtitan", engine="deepspeed")
    with pytest.raises(ValueError, match="unknown recipe"):
        TrainingConfig(recipe="keras")


def test_default_recipe_stays_out_of_the_json():
    assert "recipe" not in TrainingConfig().model_dump(mode="json")
    assert TrainingConfig(recipe="trainer").model_dump(mode="json")["recipe"] == "trainer"
    assert TrainingConfig.model_validate(TrainingConfig(recipe="trainer").model_dump()).recipe.name == "trainer"


def test_torchtune_trains_in_one_dtype():
    """torchtune builds the whole model in cfg.dtype and runs no autocast (its recipes' docstrings: 'Mixed precision
    training and fp16 precision are currently not supported'): its row defaults to bf16, takes fp32, refuses the
    mixed precisions with the reason."""
    assert TrainingConfig(recipe="torchtune").precision == "bf16"
    assert TrainingConfig(recipe="torchtune", precision="fp32").precision == "fp32"
    for mixed in ("bf16-mixed", "fp16-mixed"):
        with pytest.raises(ValueError, match="torchtune trains in bf16 or fp32"):
            TrainingConfig(recipe="torchtune", precision=mixed)
    assert TrainingConfig(recipe="torch").precision == "bf16-mixed"  # the other rows keep the planner's default


def test_torchtune_export_names_its_own_loss():
    """An export of a torchtune plan says the memory counted torchtune's chunked loss, not the eager kernel that
    wrappers.losses would run in the file's own stack."""
    from advisor.export.target import _training_notes

    notes = _training_notes(TrainingConfig(recipe="torchtune", compile=True))
    assert any("torchtune recipe's own chunked cross-entropy compiled chunk by chunk" in n for n in notes)
    assert not any("the plan's memory assumes it" in n and "--loss chunked" in n for n in notes)


def test_each_stacks_strategies_are_torch_strategies_of_the_table():
    from typing import get_args

    from advisor.strategies import STRATEGIES, StrategyName

    for recipe in load_recipes().values():
        for name in recipe.torch_strategies or ():
            assert name in get_args(StrategyName) and STRATEGIES[name].on("torch").available, (recipe.name, name)
    assert get_recipe("torch").torch_strategies is None  # wrap() applies every one


def test_lightning_registers_no_data_parallel_strategy():
    """Lightning 2 removed DataParallel: the row leaves dp out, and its registry agrees."""
    strategies = pytest.importorskip("lightning.pytorch.strategies")
    names = strategies.StrategyRegistry.available_strategies()
    assert "ddp" in names and "fsdp" in names and "dp" not in names
    assert "dp" not in get_recipe("lightning").torch_strategies


@pytest.mark.parametrize("package", ["accelerate", "transformers"])
def test_the_trainer_stack_never_builds_torchs_zero_redundancy_optimizer(package):
    """ZeRO-1 on the torch engine is DDP + torch's ZeroRedundancyOptimizer; no file of accelerate or transformers
    names it, so the trainer row leaves zero1 to DeepSpeed."""
    from pathlib import Path

    root = Path(pytest.importorskip(package).__file__).parent
    assert not [p for p in root.rglob("*.py") if "ZeroRedundancyOptimizer" in p.read_text(errors="ignore")]
    assert "zero1" not in get_recipe("trainer").torch_strategies


def test_a_stacks_plan_offers_only_what_its_loop_runs():
    """torchtune on 2 GPUs: FSDP2 only (no DDP, DataParallel or ZeRO-1 candidate), each with the reason; one GPU is
    the plain model, which its single-device recipes run. The trainer keeps DataParallel and DDP, and ZeRO-1 on
    DeepSpeed."""
    from advisor.planning.api import plan

    two = plan("meta-llama/Llama-3.2-1B", "2xA100", recipe="torchtune")
    offered = {c.strategy for c in two.candidates if c.available and c.mesh is None}
    assert offered == {"zero2", "zero3", "zero2_offload", "zero3_offload"}
    ddp = two.candidate("ddp")
    assert ddp.unavailable_reason.startswith("the torchtune recipe does not run DistributedDataParallel")
    one = plan("meta-llama/Llama-3.2-1B", "1xA100", recipe="torchtune")
    assert one.candidate("ddp").available and one.recommendation.strategy == "ddp"
    trainer = plan("meta-llama/Llama-3.2-1B", "2xA100", recipe="trainer")
    assert {c.strategy for c in trainer.candidates if not c.available} == {"zero1"}
    assert plan("meta-llama/Llama-3.2-1B", "2xA100", recipe="trainer", engine="deepspeed").candidate("zero1").available

"""wrap() on a PEFT LoRA model: 2 gloo ranks under ddp, zero2 and zero3 train the adapters exactly as
one process does on the whole batch, the frozen base stays untouched, and the plan knows it is LoRA.
The three strategies run once, in one pair of gloo processes (``gloo_runs``); each test asserts its own."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from tests.wrappers._dist import (
    ScenarioResults, assert_params_close, launch_env, rank_batch, reference_params, run_scenarios, tiny_llama,
    train_steps,
)

peft = pytest.importorskip("peft")

NUM_STEPS = 3
STRATEGIES = ["ddp", "zero2", "zero3"]


def lora_llama() -> torch.nn.Module:
    """The tiny Llama with rank-4 adapters on q_proj and v_proj, identical on every rank (seeded)."""
    model = tiny_llama()
    torch.manual_seed(1)
    return peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_alpha=8))


def _adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)


def _reference() -> dict[str, torch.Tensor]:
    return reference_params(NUM_STEPS, model_fn=lora_llama, optimizer_fn=_adamw)


def _train(rank: int, world_size: int, strategy: str, expected: dict, checkpoint: str) -> float:
    from wrappers import wrap

    env = launch_env(rank, world_size)
    model = lora_llama()
    model, optimizer = wrap(model, _adamw(model), strategy=strategy, env=env, verbose=False)
    assert model.advisor_decision.strategy == strategy
    train_steps(model, optimizer, (rank_batch(step, rank, world_size) for step in range(NUM_STEPS)))
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    names = {name.removeprefix("module."): name for name in state}
    adapters = [name for name in expected if "lora_" in name]
    assert len(adapters) == 8  # A and B on q and v in 2 layers
    max_diff = assert_params_close({name: state[names[name]] for name in expected}, expected, rtol=1e-4, atol=1e-5,
                                   label=strategy)
    # The adapters round-trip through a checkpoint into a fresh wrapped model (and its optimizer).
    from wrappers import load_checkpoint, save_checkpoint

    save_checkpoint(model, checkpoint, optimizer=optimizer)
    fresh = lora_llama()
    fresh, fresh_optimizer = wrap(fresh, _adamw(fresh), strategy=strategy, env=env, verbose=False)
    load_checkpoint(fresh, checkpoint, optimizer=fresh_optimizer)
    loaded = get_model_state_dict(fresh, options=StateDictOptions(full_state_dict=True))
    for name in adapters:
        torch.testing.assert_close(loaded[names[name]], state[names[name]], rtol=0, atol=0)
    return max_diff


@pytest.fixture(scope="module")
def expected() -> dict[str, torch.Tensor]:
    return _reference()


@pytest.fixture(scope="module")
def gloo_runs(expected, tmp_path_factory) -> ScenarioResults:
    """Every strategy below, run once in one pair of gloo processes."""
    return run_scenarios({strategy: (_train, strategy, expected, str(tmp_path_factory.mktemp(strategy) / "checkpoint"))
                          for strategy in STRATEGIES})


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_lora_trains_like_one_process_and_checkpoints(strategy, expected, gloo_runs):
    assert any(not torch.equal(expected[n], lora_llama().state_dict()[n]) for n in expected if "lora_B" in n)
    print(f"{strategy}: max |diff| {max(gloo_runs.values(strategy)):.2e}")


def test_wrap_plans_a_peft_model_as_lora():
    """decide() with the live PEFT model: the planner sees its LoraConfig (rank 4 on q_proj, v_proj), so
    the activation model is LoRA's, not the partly-frozen full count; the adapters are counted once."""
    from advisor.model.lora import LoraConfig
    from advisor.model.meta import spec_from_module
    from wrappers.launch_env import LaunchEnv
    from wrappers.wrap import decide

    model = lora_llama()
    env = LaunchEnv(world_size=2, rank=0, local_rank=0, local_world_size=2, num_gpus=2,
                    gpu_name="NVIDIA H100 80GB HBM3", accelerate_plugin=None)
    spec = spec_from_module(model)
    decision = decide(spec, env, live=model)
    assert decision.plan.training.lora == LoraConfig(rank=4, targets=("q_proj", "v_proj"))
    assert decision.plan.model.total_params == spec.total_params
    assert decision.plan.model.trainable_params == spec.trainable_params
    assert decide(spec, env).plan.training.lora is None  # by spec alone: requires_grad only

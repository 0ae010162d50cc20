"""One path through ``wrap()`` (issue 21 item 2): a model is planned the same way whatever its device, at the
batch the loader feeds, and the Decision records the mesh (data parallelism is the mesh with tp = cp = 1), the
micro-batch and the sequence it was planned at. ``plan_wrap`` is the decision ``wrap()`` applies, so these run
without a process group; the GPUs are named by a ``LaunchEnv``, as a launch on them would read them.

Before: a meta-device model skipped the planner and got zero3 in fp32 with no memory check; the planner ran
at a micro-batch ("auto", up to 64) and a sequence (2048) that ``wrap()`` invented, not the loader's."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from advisor.mesh import ParallelDims
from advisor.planning.api import plan
from tests.wrappers._dist import tiny_llama
from wrappers.launch_env import LaunchEnv
from wrappers.wrap import plan_wrap


def _env(world: int, gpus: int, name: str | None = "NVIDIA H100 80GB HBM3") -> LaunchEnv:
    return LaunchEnv(world_size=world, rank=0, local_rank=0, local_world_size=world, num_gpus=gpus,
                     gpu_name=name if gpus else None, accelerate_plugin=None)


def _loader(batch_size: int, seq_len: int) -> DataLoader:
    ids = torch.zeros(8, seq_len, dtype=torch.long)
    return DataLoader([{"input_ids": row, "labels": row} for row in ids], batch_size=batch_size)


def _on_meta(model: torch.nn.Module) -> torch.nn.Module:
    with torch.device("meta"):
        return type(model)(model.config)


def _decided(decision) -> tuple:
    return (decision.strategy, decision.precision, decision.activation_checkpointing,
            decision.selective_checkpointing, decision.mesh, decision.micro_batch_size, decision.seq_len)


def test_a_meta_model_is_planned_as_the_same_model_with_weights():
    live = tiny_llama(0)
    meta = _on_meta(live)
    assert all(p.is_meta for p in meta.parameters())
    env, loader = _env(8, 8), _loader(4, 32)
    on_meta, with_weights = plan_wrap(meta, env, loader=loader), plan_wrap(live, env, loader=loader)
    assert on_meta.plan is not None  # planned, not the unplanned zero3 fp32 of before
    assert _decided(on_meta) == _decided(with_weights)


def test_a_meta_8b_model_gets_the_plan_advisor_plan_gives():
    """Llama-3.1-8B's shapes on the meta device, 8 x H100, the loader's 1 x 8,192 tokens: the decision is
    what ``advisor plan`` recommends for the same job, not zero3 in fp32."""
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131_072,
                         rope_theta=500_000.0, tie_word_embeddings=False)
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        meta = LlamaForCausalLM(config)
    decision = plan_wrap(meta, _env(8, 8), loader=_loader(1, 8192))
    expected = plan("meta-llama/Llama-3.1-8B", "8xH100", micro_batch_size=1, seq_len=8192).recommendation
    assert (decision.strategy, decision.precision) == (expected.strategy, "bf16-mixed")
    assert decision.selective_checkpointing == expected.selective_checkpointing
    assert (decision.micro_batch_size, decision.seq_len) == (1, 8192)


def test_the_plan_is_made_at_the_batch_the_loader_feeds():
    decision = plan_wrap(tiny_llama(0), _env(2, 2), loader=_loader(4, 32))
    assert decision.plan.training.seq_len == 32 and decision.plan.recommendation.micro_batch_size == 4
    assert (decision.micro_batch_size, decision.seq_len) == (4, 32)
    assert decision.mesh == ParallelDims.data_parallel(2)


def test_asked_values_win_over_the_loader():
    decision = plan_wrap(tiny_llama(0), _env(2, 2), loader=_loader(4, 32), micro_batch_size=2, seq_len=16)
    assert decision.plan.training.seq_len == 16 and (decision.micro_batch_size, decision.seq_len) == (2, 16)


def test_without_gpus_a_meta_model_gets_the_size_default_not_zero3():
    """No GPU visible: nothing to check memory against, so the size threshold decides (under 1B: DDP), as it
    does for the same model with weights; the batch is still recorded from the loader."""
    meta = _on_meta(tiny_llama(0))
    decision = plan_wrap(meta, _env(2, 0), loader=_loader(4, 32))
    assert decision.plan is None and decision.strategy == "ddp" and decision.precision == "fp32"
    assert _decided(decision) == _decided(plan_wrap(tiny_llama(0), _env(2, 0), loader=_loader(4, 32)))
    assert (decision.micro_batch_size, decision.seq_len) == (4, 32)


def _train_meta_on_two_ranks(rank: int, world_size: int, checkpoint: str) -> dict | None:
    from tests.wrappers._dist import build_adamw, launch_env, rank_batch, train_steps
    from wrappers import wrap

    meta = _on_meta(tiny_llama(0))
    model, optimizer = wrap(meta, build_adamw(meta), checkpoint=checkpoint, env=launch_env(rank, world_size),
                            verbose=False)
    decision = model.advisor_decision
    assert (decision.strategy, decision.mesh) == ("ddp", ParallelDims.data_parallel(2)), decision
    train_steps(model, optimizer, (rank_batch(step, rank, world_size) for step in range(3)))
    return {n: p.detach().clone() for n, p in model.module.named_parameters()} if rank == 0 else None


def test_a_meta_model_trains_on_two_gloo_ranks_under_its_planned_ddp(tmp_path):
    """The size default for a meta model on 2 CPU ranks is DDP (as for the model with weights): materialised
    whole from the checkpoint on each rank, it trains 3 AdamW steps to the one-process result."""
    from tests.wrappers._dist import collect_distributed, max_abs_diff, reference_params

    tiny_llama(0).save_pretrained(tmp_path / "weights")
    trained = collect_distributed(_train_meta_on_two_ranks, str(tmp_path / "weights"))[0]  # rank 0's
    reference = reference_params(3)
    assert trained.keys() == reference.keys()
    worst = max_abs_diff(trained, reference)
    assert worst < 1e-5, worst

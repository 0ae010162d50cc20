"""Selective activation checkpointing: the same loss and gradients as no checkpointing, the planned
memory against the simulated step, and what it saves and costs against full checkpointing."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.wrappers._dist import global_batch, tiny_llama
from wrappers.blocks import find_blocks
from wrappers.checkpointing import apply_activation_checkpointing


def test_selective_checkpointing_trains_like_no_checkpointing():
    ids = global_batch(0)
    reference = tiny_llama()
    reference(input_ids=ids, labels=ids).loss.backward()
    model = tiny_llama()
    apply_activation_checkpointing(model, blocks=find_blocks(model), selective=True)
    model(input_ids=ids, labels=ids).loss.backward()
    grads = {n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()}
    for name, param in reference.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=0, atol=0)


LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=256, intermediate_size=704,
             num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, vocab_size=4096,
             max_position_embeddings=4096, tie_word_embeddings=False, _name_or_path="small-llama")


@pytest.mark.parametrize("strategy", ["ddp", "zero3"])
def test_selective_estimate_matches_the_simulated_step(strategy):
    """Per token and block the policy keeps the 1st, 3rd, 5th and 7th matmul outputs, q (256 x 2 bytes),
    v (64 x 2), gate (704 x 2) and down (256 x 2), and the attention output (256 x 2) with its fp32
    log-sum-exp (8 x 4): 3,104 bytes beyond full checkpointing."""
    from advisor.estimate.memory import estimate_memory
    from advisor.hardware.cluster import parse_gpus
    from advisor.model.sources import spec_from_config
    from advisor.simulate.step import simulate
    from advisor.strategies import get_strategy
    from advisor.training import TrainingConfig

    training = TrainingConfig(seq_len=1024, activation_checkpointing="selective")
    spec = spec_from_config(LLAMA, name="small", source="local")
    estimate = estimate_memory(spec, parse_gpus("2xH100"), training, get_strategy(strategy).on("torch"),
                               micro_batch_size=4, checkpointing=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = simulate(LLAMA, world_size=2, strategy=strategy, training=training, micro_batch_size=4,
                            checkpointing=True)
    assert abs(estimate.peak_allocated - measured.peak_allocated) <= 0.01 * measured.peak_allocated
    full = estimate_memory(spec, parse_gpus("2xH100"), training.model_copy(update={"activation_checkpointing": "on"}),
                           get_strategy(strategy).on("torch"), micro_batch_size=4, checkpointing=True)
    # 4 x 1024 tokens x 4 blocks x 2,592 bytes more than full checkpointing (the loss moment wins both)
    assert estimate.peak_allocated - full.peak_allocated == 4096 * 4 * 3_104


def test_selective_recomputes_less_than_full():
    """Llama-3.1-8B block: kept matmuls q (4096 x 4096), v (4096 x 1024), gate (4096 x 14336) and down
    (14336 x 4096); the recompute skips them and the attention kernel (4 x heads x head_dim x s x tokens
    a layer), 2 FLOPs per parameter and token."""
    from advisor.estimate.step_time import count_flops
    from advisor.model.sources import resolve_model

    spec = resolve_model("meta-llama/Llama-3.1-8B")
    full = count_flops(spec, tokens=8192, seq_len=8192, checkpointing=True)
    selective = count_flops(spec, tokens=8192, seq_len=8192, checkpointing=True, selective=True)
    kept = 4096 * 4096 + 4096 * 1024 + 2 * 4096 * 14336
    attention = 4 * 32 * 32 * 128 * 8192 * 8192
    assert full.recompute - selective.recompute == pytest.approx(2 * kept * 32 * 8192 + attention)


def test_auto_takes_selective_when_it_is_faster_than_full():
    """Llama-3.1-8B on 8 H100s at 8k tokens: without checkpointing nothing fits zero2 even at
    micro-batch 1; selective fits there and recomputes less than full, so auto takes it."""
    import advisor

    plan = advisor.plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len=8192)
    zero2 = plan.candidate("zero2")
    assert zero2.fits and zero2.activation_checkpointing and zero2.selective_checkpointing
    off = advisor.plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len=8192, activation_checkpointing="off")
    full = advisor.plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len=8192, activation_checkpointing="on")
    assert not off.candidate("zero2").fits
    assert zero2.step_time.tokens_per_s > full.candidate("zero2").step_time.tokens_per_s


def _checkpoint_flavours(model) -> list[str]:
    """Each CheckpointWrapper's flavour: "selective" when it carries the per-op policy, else "full"."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from wrappers.checkpointing import selective_context

    return ["selective" if m.checkpoint_fn.keywords.get("context_fn") is selective_context else "full"
            for m in model.modules() if isinstance(m, CheckpointWrapper)]


def _one_process_env():
    from wrappers.launch_env import LaunchEnv

    return LaunchEnv(world_size=1, rank=0, local_rank=0, local_world_size=1, num_gpus=0, gpu_name=None,
                     accelerate_plugin=None)


@pytest.mark.parametrize("asked, flavour, mode", [(True, "full", "on"), ("on", "full", "on"),
                                                  ("selective", "selective", "selective")])
def test_one_process_applies_the_checkpointing_its_decision_reports(asked, flavour, mode):
    """One process without a GPU: the model is returned unwrapped, but the checkpointing asked for is
    applied to its 2 blocks (the decision used to report it while nothing was wrapped). ``True`` and the
    plan's spelling ``"on"`` ask for the same."""
    from wrappers import wrap

    model = wrap(tiny_llama(), activation_checkpointing=asked, env=_one_process_env(), verbose=False)
    assert _checkpoint_flavours(model) == [flavour, flavour]
    decision = model.advisor_decision
    assert decision.checkpointing == mode
    assert (decision.activation_checkpointing, decision.selective_checkpointing) == (True, flavour == "selective")


@pytest.mark.parametrize("asked", [False, "off"])
def test_one_process_without_checkpointing_wraps_nothing(asked):
    from wrappers import wrap

    model = wrap(tiny_llama(), activation_checkpointing=asked, env=_one_process_env(), verbose=False)
    assert _checkpoint_flavours(model) == [] and model.advisor_decision.checkpointing == "off"


def test_an_unknown_checkpointing_request_is_refused():
    from wrappers import wrap

    with pytest.raises(ValueError, match="activation_checkpointing='full'"):
        wrap(tiny_llama(), activation_checkpointing="full", env=_one_process_env(), verbose=False)


@pytest.mark.parametrize("asked, flavour", [(True, "full"), ("selective", "selective")])
def test_accelerate_applies_the_checkpointing_asked_for(asked, flavour):
    """engine="accelerate" (the branch an accelerate launch takes): the export tells the user to ask wrap()
    for selective checkpointing, so wrap() applies it before prepare and the decision says so (it used to
    drop it and report none). The model still trains: one step through accelerator.backward."""
    from wrappers import wrap

    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = wrap(model, optimizer, engine="accelerate", activation_checkpointing=asked,
                            env=_one_process_env(), verbose=False)
    assert _checkpoint_flavours(model) == [flavour, flavour]
    decision = model.advisor_decision
    assert (decision.activation_checkpointing, decision.selective_checkpointing) == (True, flavour == "selective")
    ids = global_batch(0)
    model.advisor_accelerator.backward(model(input_ids=ids, labels=ids).loss)
    optimizer.step()


def test_accelerate_without_checkpointing_reports_none():
    from wrappers import wrap

    model = wrap(tiny_llama(), engine="accelerate", env=_one_process_env(), verbose=False)
    assert _checkpoint_flavours(model) == [] and not model.advisor_decision.activation_checkpointing


@pytest.mark.parametrize("asked", [False, True])
def test_wrap_turns_the_kv_cache_off_with_or_without_checkpointing(asked):
    """A Llama / Qwen2 config loads with use_cache=True, and the forward then builds a KV cache in training (an fp32
    copy of every layer's K/V under autocast, held through the loss: advisor.estimate.kv_cache); wrap() turns it
    off as HF Trainer does, with or without checkpointing."""
    from wrappers import wrap

    model = tiny_llama()
    model.config.use_cache = True
    model = wrap(model, activation_checkpointing=asked, env=_one_process_env(), verbose=False)
    assert model.config.use_cache is False

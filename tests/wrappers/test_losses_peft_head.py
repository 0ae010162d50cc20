"""The loss kernels with PEFT on the output head: a LoRA adapter on ``lm_head`` is trained by the chunked
kernel (it calls the head module: loss and every trainable gradient are transformers' own, whichever of
``use_loss_kernel`` and ``get_peft_model`` comes first) and refused by the fused one, which reads only the head's
weight (PEFT's ``weight`` property is the base layer's: it would train without the adapter), at
``use_loss_kernel`` and at the forward when PEFT adapted the head afterwards; the plan refuses it too (exit 2).
A head in ``modules_to_save`` is a full trainable copy whose ``weight`` the fused kernel reads: accepted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.cli._main import run_main
from tests.wrappers._dist import tiny_llama
from wrappers.losses import use_loss_kernel

peft = pytest.importorskip("peft")


def _peft(model, **extra):
    torch.manual_seed(1)  # init_lora_weights=False: lora_B non-zero, so lora_A's gradients count
    config = peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, **extra)
    return peft.get_peft_model(model, config)


def _batch():
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[1, :3] = -100
    return ids, labels


def _loss_and_grads(model, ids, labels):
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def _check(model, reference, ids, labels, trainable):
    expected_loss, expected_grads = _loss_and_grads(reference, ids, labels)
    loss, grads = _loss_and_grads(model, ids, labels)
    assert model(input_ids=ids, labels=labels).logits is None  # the kernel ran, not transformers' loss
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    assert sorted(grads) == sorted(expected_grads) and len(grads) == trainable
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("order", ["kernel_then_peft", "peft_then_kernel"])
def test_chunked_trains_a_lora_adapter_on_the_head(order):
    """q_proj in 2 blocks and lm_head: 6 adapters' A and B. peft_then_kernel was refused before ("needs a causal
    LM ... plain nn.Linear head": PEFT's LoRA layer is not an nn.Linear)."""
    targets = dict(target_modules=["q_proj", "lm_head"])
    ids, labels = _batch()
    reference = _peft(tiny_llama(), **targets)
    if order == "kernel_then_peft":
        model = _peft(use_loss_kernel(tiny_llama(), "chunked"), **targets)
    else:
        model = use_loss_kernel(_peft(tiny_llama(), **targets), "chunked")
    _check(model, reference, ids, labels, trainable=6)


def test_fused_refuses_a_lora_adapted_head_at_use_loss_kernel():
    model = _peft(tiny_llama(), target_modules=["q_proj", "lm_head"])
    with pytest.raises(ValueError, match=r"^loss kernel 'fused' reads the head's weight.*use loss='chunked'"):
        use_loss_kernel(model, "fused")


def test_fused_refuses_a_head_peft_adapted_after_use_loss_kernel():
    """The kernel set first (the simulator's order), PEFT's adapter on lm_head after: the forward refuses
    (it trained on the base head alone before: the loss differed from transformers')."""
    model = _peft(use_loss_kernel(tiny_llama(), "fused"), target_modules=["q_proj", "lm_head"])
    ids, labels = _batch()
    with pytest.raises(ValueError, match=r"^loss kernel 'fused' reads the head's weight.*use loss='chunked'"):
        model(input_ids=ids, labels=labels)


def test_fused_runs_once_the_head_adapter_is_disabled():
    """PEFT's disable_adapter(): the head is its base layer again, which the fused kernel computes exactly."""
    model = _peft(use_loss_kernel(tiny_llama(), "fused"), target_modules=["q_proj", "lm_head"])
    ids, labels = _batch()
    reference = _peft(tiny_llama(), target_modules=["q_proj", "lm_head"])
    with model.disable_adapter(), reference.disable_adapter():
        expected = reference(input_ids=ids, labels=labels).loss
        torch.testing.assert_close(model(input_ids=ids, labels=labels).loss, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("order", ["kernel_then_peft", "peft_then_kernel"])
def test_fused_trains_a_head_in_modules_to_save(order):
    """lm_head as a trainable copy (modules_to_save): its weight is the copy's; q_proj's A, B in 2 blocks + the
    copy's weight."""
    extra = dict(target_modules=["q_proj"], modules_to_save=["lm_head"])
    ids, labels = _batch()
    reference = _peft(tiny_llama(), **extra)
    if order == "kernel_then_peft":
        model = _peft(use_loss_kernel(tiny_llama(), "fused"), **extra)
    else:
        model = use_loss_kernel(_peft(tiny_llama(), **extra), "fused")
    _check(model, reference, ids, labels, trainable=5)


@pytest.mark.parametrize("targets", ["lm_head", "q_proj,lm_head"])
def test_plan_refuses_fused_with_a_lora_adapter_on_the_head(targets, capsys):
    code, out, err = run_main(["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "1xRTX4090", "--lora", "16",
                               "--lora-targets", targets, "--loss", "fused", "--json"], capsys)
    assert code == 2 and not out
    assert err.strip().count("\n") == 0 and "--loss fused" in err and "use --loss chunked" in err, err


def test_trls_chunked_loss_refuses_a_lora_adapter_on_the_head(capsys):
    """TRL's chunked_nll reads the head's weight as the fused kernel does, and TRL refuses the adapter too
    (SFTTrainer: "not supported when lm_head is wrapped by a PEFT adapter"): in the plan under the trainer recipe, at
    use_loss_kernel."""
    code, out, err = run_main(["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "1xRTX4090", "--lora", "16",
                               "--lora-targets", "q_proj,lm_head", "--recipe", "trainer", "--loss", "chunked",
                               "--json"], capsys)
    assert code == 2 and not out
    assert err.strip().count("\n") == 0 and "TRL's chunked_nll" in err and "use --loss hf" in err, err
    with pytest.raises(ValueError, match="TRL's chunked_nll"):
        use_loss_kernel(_peft(tiny_llama(), target_modules=["q_proj", "lm_head"]), "chunked", checkpointed=True)


CONFIGS = Path(__file__).parents[1] / "data" / "configs"


def test_plan_refuses_fused_with_the_head_among_recorded_linears(capsys):
    """phi-2 (no formula: its linear layers recorded on the meta device, lm_head the output); chunked plans."""
    base = ["plan", "--model", str(CONFIGS / "phi-2"), "--gpus", "1xA100", "--lora", "16", "--lora-targets",
            "q_proj,lm_head", "--no-trace", "--json"]
    code, out, err = run_main([*base, "--loss", "fused"], capsys)
    assert code == 2 and not out and "use --loss chunked" in err and err.strip().count("\n") == 0, err
    code, out, err = run_main([*base, "--loss", "chunked"], capsys)
    assert code == 0, err


@pytest.mark.parametrize("targets, refused", [(["q_proj", "lm_head"], True), (["q_proj"], False)])
def test_plan_of_a_live_peft_model_with_an_adapted_head(targets, refused):
    """A live PEFT model passed to plan(): an adapter on lm_head is refused under loss='fused' (q_proj alone plans)."""
    from advisor.planning.api import plan

    model = peft.get_peft_model(tiny_llama(), peft.LoraConfig(r=4, target_modules=targets))
    if refused:
        with pytest.raises(ValueError, match=r"^--loss fused: .*use --loss chunked"):
            plan(model, "1xA100", loss="fused", trace=False)
    else:
        assert plan(model, "1xA100", loss="fused", trace=False).recommendation is not None

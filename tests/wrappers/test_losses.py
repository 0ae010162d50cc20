"""The chunked and fused loss kernels compute transformers' own causal-LM loss and gradients."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.wrappers._dist import tiny_llama
from wrappers.losses import use_loss_kernel


def _loss_and_grads(model, ids, labels):
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kernel", ["chunked", "fused"])
def test_kernel_matches_transformers_loss_and_gradients(kernel):
    reference = tiny_llama()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, :5] = -100  # a masked prompt: ignored positions must not count
    expected_loss, expected_grads = _loss_and_grads(reference, ids, labels)
    model = use_loss_kernel(copy.deepcopy(tiny_llama()), kernel)
    loss, grads = _loss_and_grads(model, ids, labels)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_a_model_without_a_plain_head_is_refused():
    with pytest.raises(ValueError, match="needs a causal LM"):
        use_loss_kernel(torch.nn.Linear(2, 2), "fused")


def _lora(model):
    peft = pytest.importorskip("peft")
    torch.manual_seed(1)
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_alpha=8, init_lora_weights=False)
    return peft.get_peft_model(model, config)


@pytest.mark.parametrize("kernel", ["chunked", "fused"])
@pytest.mark.parametrize("order", ["kernel_then_peft", "peft_then_kernel"])
def test_kernel_on_a_peft_lora_model_matches_transformers(kernel, order):
    """A PEFT LoRA model takes the kernel whichever comes first (``get_peft_model`` wraps the causal LM,
    whose ``.model`` is then the whole LM, not the decoder): loss and the adapters' gradients are
    transformers' own. ``init_lora_weights=False`` makes lora_B non-zero, so lora_A's gradients count."""
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[1, :3] = -100
    expected_loss, expected_grads = _loss_and_grads_trainable(_lora(tiny_llama()), ids, labels)
    if order == "kernel_then_peft":
        model = _lora(use_loss_kernel(tiny_llama(), kernel))
    else:
        model = use_loss_kernel(_lora(tiny_llama()), kernel)
    loss, grads = _loss_and_grads_trainable(model, ids, labels)
    assert model(input_ids=ids, labels=labels).logits is None  # the kernel ran, not transformers' loss
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    assert sorted(grads) == sorted(expected_grads) and len(grads) == 8  # A and B on q, v in 2 layers
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


def _loss_and_grads_trainable(model, ids, labels):
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("key, value", [("final_logit_softcapping", 30.0), ("logit_scale", 0.0625),
                                        ("logits_scaling", 8.0)])
def test_a_model_that_transforms_its_logits_is_refused(key, value):
    """Gemma 2 soft-caps its logits, Cohere and Granite scale them before the loss; the kernels take the head's
    raw output, so they would train on a different loss: refused in one line, as a biased head is."""
    model = tiny_llama(0)
    setattr(model.config, key, value)
    with pytest.raises(ValueError, match=f"transforms its logits first \\({key}="):
        use_loss_kernel(model, "chunked")
    setattr(model.config, key, 1 if key != "final_logit_softcapping" else None)
    assert use_loss_kernel(model, "chunked") is model

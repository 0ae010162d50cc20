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
                                        ("logits_scaling", 8.0), ("logits_soft_cap", 30.0),
                                        ("output_logit_soft_cap", 30.0), ("lm_head_multiplier", 0.5)])
def test_a_model_that_transforms_its_logits_is_refused(key, value):
    """Gemma 2, RecurrentGemma and xLSTM soft-cap their logits, Cohere, Granite and Falcon-H1 scale them before the
    loss; the kernels take the head's raw output, so they would train on a different loss: refused in one line."""
    model = tiny_llama(0)
    setattr(model.config, key, value)
    with pytest.raises(ValueError, match=f"transforms its logits first \\({key}="):
        use_loss_kernel(model, "chunked")
    setattr(model.config, key, None if key.endswith(("softcapping", "soft_cap")) else 1)
    assert use_loss_kernel(model, "chunked") is model


def _tiny(model_type: str):
    """A two-block model of ``model_type`` built from its config on the CPU, dropout off (eval)."""
    transformers = pytest.importorskip("transformers")
    widths = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, vocab_size=128)
    extra = {"gpt2": dict(n_embd=64, n_head=4, n_layer=2, vocab_size=128),
             "gpt_neox": dict(widths, intermediate_size=128, rotary_pct=0.25),
             "falcon": dict(widths, new_decoder_architecture=False, multi_query=True, bias=True),
             "phi": dict(widths, intermediate_size=128, partial_rotary_factor=0.5, tie_word_embeddings=False)}
    config = transformers.AutoConfig.for_model(model_type, **extra[model_type])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    if model_type == "phi":  # a non-zero bias, so that its share of the logits and its gradient count
        torch.nn.init.normal_(model.lm_head.bias)
    return model


@pytest.mark.parametrize("kernel", ["chunked", "fused"])
@pytest.mark.parametrize("model_type", ["gpt2", "gpt_neox", "falcon", "phi"])
def test_kernel_on_a_decoder_named_otherwise_or_a_biased_head(model_type, kernel):
    """GPT-2 and Falcon name their decoder ``transformer``, GPT-NeoX ``gpt_neox``, Phi's head has a bias:
    the decoder and head come from transformers' ``base_model`` and ``get_output_embeddings()``, and the
    kernels' loss and every gradient (the head's bias's too) are transformers' own."""
    reference = _tiny(model_type)
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, :5] = -100
    expected_loss, expected_grads = _loss_and_grads(reference, ids, labels)
    model = use_loss_kernel(_tiny(model_type), kernel)
    loss, grads = _loss_and_grads(model, ids, labels)
    assert model(input_ids=ids, labels=labels).logits is None  # the kernel ran, not transformers' loss
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    assert sorted(grads) == sorted(expected_grads)
    if model_type == "phi":
        assert expected_grads["lm_head.bias"].abs().sum() > 0
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("model_type", ["bart", "xlnet"])
def test_a_causal_lm_with_its_own_unshifted_loss_is_refused(model_type):
    """Bart's causal LM (``model`` and a bias-free ``lm_head``, accepted before) and XLNet's take their labels
    unshifted with their own CrossEntropyLoss, not transformers' loss_function: the kernels' shifted loss
    would be another one."""
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(model_type)
    for key in ("num_hidden_layers", "n_layer", "decoder_layers", "encoder_layers"):
        if isinstance(getattr(config, key, None), int):
            setattr(config, key, 1)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match="needs a causal LM whose loss is transformers' loss_function"):
        use_loss_kernel(model, "fused")


@pytest.mark.parametrize("model_type", ["llama", "phi"])
def test_the_checkpointed_kernel_matches_transformers_loss_and_gradients(model_type, monkeypatch):
    """TRL's chunked_nll as wrappers.losses runs it (``checkpointed=True``: the counted tokens packed to the front,
    chunks under torch.utils.checkpoint): transformers' loss and every gradient, Phi's head bias's too. Chunks of 8
    tokens here, so 46 tokens make six, the masked ones last."""
    import wrappers.losses as losses

    monkeypatch.setattr(losses, "NLL_CHUNK", 8)
    monkeypatch.setattr(losses.checkpointed_cross_entropy, "__kwdefaults__", {"bias": None, "chunk": 8})
    make = tiny_llama if model_type == "llama" else (lambda: _tiny("phi"))
    reference = make()
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, :5] = -100  # a masked prompt: packed behind the counted tokens, adding nothing
    expected_loss, expected_grads = _loss_and_grads(reference, ids, labels)
    model = use_loss_kernel(make(), "chunked", checkpointed=True)
    loss, grads = _loss_and_grads(model, ids, labels)
    assert model(input_ids=ids, labels=labels).logits is None  # the kernel ran, not transformers' loss
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    assert sorted(grads) == sorted(expected_grads)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")

"""The loss kernels on an MoE causal LM with ``output_router_logits=True``: transformers' forward (5.23,
modeling_mixtral.py MixtralForCausalLM.forward) adds ``router_aux_loss_coef * load_balancing_loss_func(...)`` to
the cross-entropy; the kernels add it the same way (they dropped it before), so the loss and every gradient
(the routers' included) are transformers' own."""

from __future__ import annotations

import pytest
import torch

from wrappers.losses import use_loss_kernel


def _tiny_mixtral(**extra):
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=128, num_local_experts=4, num_experts_per_tok=2,
                           max_position_embeddings=64, use_cache=False, tie_word_embeddings=False, **extra)
    torch.manual_seed(0)
    return MixtralForCausalLM(config)


def _loss_and_grads(model, **batch):
    out = model(**batch)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kernel", ["chunked", "fused"])
@pytest.mark.parametrize("masked", [False, True])
def test_kernel_adds_the_router_aux_loss(kernel, masked):
    """A coefficient of 0.5 (default 0.001) so that the aux term is a large part of the loss; with an attention
    mask (padding), which load_balancing_loss_func reads too."""
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, :5] = -100
    batch = dict(input_ids=ids, labels=labels)
    if masked:
        mask = torch.ones_like(ids)
        mask[1, 12:] = 0
        batch["attention_mask"] = mask
    reference = _tiny_mixtral(output_router_logits=True, router_aux_loss_coef=0.5)
    expected_loss, expected_grads = _loss_and_grads(reference, **batch)
    without = _tiny_mixtral(output_router_logits=False)(**batch).loss
    assert expected_loss - without > 0.5  # the aux term: 0.5 x ~2 (its minimum is 2 for top-2 of 4 experts)
    model = use_loss_kernel(_tiny_mixtral(output_router_logits=True, router_aux_loss_coef=0.5), kernel)
    loss, grads = _loss_and_grads(model, **batch)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    assert sorted(grads) == sorted(expected_grads)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_a_forward_that_adds_the_aux_loss_otherwise_is_refused():
    """A subclass whose forward is not transformers' (the pattern the kernels repeat is not in its source)."""
    model = _tiny_mixtral(output_router_logits=True)

    class Bespoke(type(model)):
        def forward(self, input_ids=None, labels=None, **kwargs):
            logits = self.lm_head(self.model(input_ids).last_hidden_state)
            return self.loss_function(logits, labels, 128)

    model.__class__ = Bespoke
    with pytest.raises(ValueError, match=r"routers' auxiliary loss as Bespoke's forward does \(output_router_logits is on.*: use loss='hf'"):
        use_loss_kernel(model, "fused")

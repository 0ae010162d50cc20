"""Jamba counts from the config equal ``sum(p.numel())`` of transformers' JambaForCausalLM built on
the meta device, block by block (tiny configs built in code)."""

from __future__ import annotations

import pytest

from advisor.model.architectures import count_from_config
from advisor.model.meta import build_meta_model

TINY_JAMBA = {
    # Attention every 4th layer from 1, experts every 2nd from 1: all four block kinds appear.
    "jamba_mixed": dict(model_type="jamba", architectures=["JambaForCausalLM"], hidden_size=32, intermediate_size=48,
                        num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                        num_experts=4, num_experts_per_tok=2, attn_layer_period=4, attn_layer_offset=1,
                        expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_d_conv=3,
                        mamba_expand=2, use_mamba_kernels=False),
    # Biases on the Mamba projections, none on its conv, an explicit dt rank, tied head, experts on layer 0.
    "jamba_biases_tied": dict(model_type="jamba", architectures=["JambaForCausalLM"], hidden_size=40,
                              intermediate_size=24, num_hidden_layers=4, num_attention_heads=5, num_key_value_heads=5,
                              vocab_size=90, num_experts=3, num_experts_per_tok=1, attn_layer_period=2,
                              attn_layer_offset=0, expert_layer_period=3, expert_layer_offset=0, mamba_d_state=4,
                              mamba_d_conv=4, mamba_expand=3, mamba_dt_rank=6, mamba_proj_bias=True,
                              mamba_conv_bias=False, tie_word_embeddings=True, use_mamba_kernels=False),
}


@pytest.mark.parametrize("name", sorted(TINY_JAMBA))
def test_jamba_counts_match_meta_device(name):
    cfg = TINY_JAMBA[name]
    spec = count_from_config(cfg, name=name, source="local")
    assert spec is not None and spec.count_method == "formula"
    model = build_meta_model(cfg)
    assert spec.total_params == sum(p.numel() for p in model.parameters())
    blocks = model.model.layers
    assert spec.hybrid.block_params == tuple(sum(p.numel() for p in b.parameters()) for b in blocks)
    assert spec.hybrid.attention_layers == tuple(type(b).__name__ == "JambaAttentionDecoderLayer" for b in blocks)
    assert spec.layer_params == max(spec.hybrid.block_params)
    assert spec.tied_embeddings == (model.lm_head.weight is model.model.embed_tokens.weight)

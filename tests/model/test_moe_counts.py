"""MoE parameter counts from the config equal ``sum(p.numel())`` of the transformers model on the meta
device, per component as well as in total (tiny configs built in code; bundled ones in
tests/model/test_architectures.py)."""

from __future__ import annotations

import pytest

from advisor.model.architectures import count_from_config
from advisor.model.meta import build_meta_model

TINY_MOE = {
    # Dense layer 1 (mlp_only_layers) and a sparse step of 1: layers 0, 2 sparse.
    "qwen2_moe_shared": dict(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], hidden_size=32,
                             intermediate_size=80, moe_intermediate_size=24, shared_expert_intermediate_size=48,
                             num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                             num_experts=6, num_experts_per_tok=2, mlp_only_layers=[1]),
    # decoder_sparse_step 2: layers 1 and 3 sparse, 0 and 2 dense.
    "qwen3_moe_step": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_size=32,
                           intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=120,
                           num_experts=8, num_experts_per_tok=2, decoder_sparse_step=2),
    "qwen3_moe_all": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_size=32,
                          intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=120,
                          num_experts=8, num_experts_per_tok=2, tie_word_embeddings=True),
    "deepseek_v3_mla": dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], hidden_size=64,
                            intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=3,
                            num_attention_heads=4, num_key_value_heads=4, vocab_size=150, n_routed_experts=8,
                            num_experts_per_tok=2, n_shared_experts=2, first_k_dense_replace=1, n_group=2,
                            topk_group=1, q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8,
                            qk_nope_head_dim=12, v_head_dim=10),
    "deepseek_v2_no_q_lora": dict(model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"], hidden_size=64,
                                  intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=4, vocab_size=150, n_routed_experts=8,
                                  num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                                  q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=12,
                                  v_head_dim=10, n_group=1, topk_group=1),
}


@pytest.mark.parametrize("name", sorted(TINY_MOE))
def test_moe_counts_match_meta_device(name):
    cfg = TINY_MOE[name]
    spec = count_from_config(cfg, name=name, source="local")
    assert spec is not None and spec.count_method == "formula"
    model = build_meta_model(cfg)
    assert spec.total_params == sum(p.numel() for p in model.parameters())
    layers = model.model.layers
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    assert spec.layer_params == max(sizes)
    dense = [s for s in sizes if s != max(sizes)]
    assert (spec.moe.num_dense_layers, spec.moe.dense_layer_params) == (len(dense), dense[0] if dense else 0)
    assert spec.embedding_params == model.get_input_embeddings().weight.numel()
    # Active: one token passes all dense parameters and k of E experts in each sparse layer.
    experts = [m for m in model.modules() if type(m).__name__.endswith("Experts")]
    one_expert = sum(p.numel() for p in experts[0].parameters()) // spec.num_experts
    idle = len(experts) * (spec.num_experts - spec.num_experts_per_token) * one_expert
    assert spec.expert_params == one_expert
    assert spec.active_params == spec.total_params - idle

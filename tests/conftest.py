"""Shared fixtures: tiny configs of several families, built in code (no network, no weights)."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# CI runs a fresh clone with no example database: the property tests draw the same examples every run, so a case they
# have not met yet cannot fail one run and pass the next (one did, 2026-11-29: the Mistral-7B example in
# tests/planning/test_policy_properties.py). HYPOTHESIS_EXPLORE=1 draws new examples, to look for such cases.
settings.register_profile("fixed", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("explore" if os.environ.get("HYPOTHESIS_EXPLORE") else "fixed")

TINY_CONFIGS = {
    "llama_gqa_untied": dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64,
                             intermediate_size=160, num_hidden_layers=3, num_attention_heads=8,
                             num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=False),
    "llama_tied_bias": dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=48,
                            intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                            vocab_size=500, tie_word_embeddings=True, attention_bias=True, mlp_bias=True),
    "qwen2_bias_gqa": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=64,
                           intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=777, tie_word_embeddings=True),
    "qwen3_qk_norm": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=64,
                          intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=32, vocab_size=300, tie_word_embeddings=False),
    "mixtral_moe": dict(model_type="mixtral", architectures=["MixtralForCausalLM"], hidden_size=32,
                        intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=200, num_local_experts=4, num_experts_per_tok=2),
    "gemma2_headdim": dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"], hidden_size=64,
                           intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=24, vocab_size=256),
    "phi3_fused": dict(model_type="phi3", architectures=["Phi3ForCausalLM"], hidden_size=64,
                       intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=4, vocab_size=320, pad_token_id=0),
    "gpt2_mha": dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=64, n_layer=2, n_head=4,
                     n_positions=128, vocab_size=400),
    "bert_mlm": dict(model_type="bert", architectures=["BertForMaskedLM"], hidden_size=64,
                     intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=300,
                     max_position_embeddings=64),
    # No formula: counted on the meta device.
    "gpt_neox_fallback": dict(model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"], hidden_size=64,
                              intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                              vocab_size=500, max_position_embeddings=128),
    "opt_fallback": dict(model_type="opt", architectures=["OPTForCausalLM"], hidden_size=64, ffn_dim=128,
                         word_embed_proj_dim=64, num_hidden_layers=2, num_attention_heads=4,
                         vocab_size=300, max_position_embeddings=128),
}


@pytest.fixture(params=sorted(TINY_CONFIGS))
def tiny_config(request) -> tuple[str, dict]:
    return request.param, dict(TINY_CONFIGS[request.param])


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory):
    """CLI runs cache traced profiles and meta-device counts in $XDG_CACHE_HOME/dp-advisor: keep the
    test session's out of the user's cache (and the user's out of the tests)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    yield
    patch.undo()


@pytest.fixture
def gpu_work_only():
    """Plans without the host floor (advisor.estimate.host_time): for tests that work a term of the GPU's time by
    hand on a model or micro-batch small enough for the host's launches to decide the step."""
    from advisor.estimate.host_time import floor_disabled

    with floor_disabled():
        yield

"""The traced-profile cache (``advisor.simulate.profile_cache``) keys a config by what the user gave,
not by what transformers made of it. CPU only, no network."""

from __future__ import annotations

import copy
import warnings

import advisor.simulate.profile as profile_module
from advisor.planning.api import plan

# OLMo-2 has no activation formula, so a full fine-tune traces it. transformers adds rope_theta to the
# rope_scaling dict in place while it validates the config; a cache key computed after that differed
# from the next plan's, so every plan traced again (6-23 s instead of under 1 s: issue 20, item 5).
OLMO2_ROPE = dict(model_type="olmo2", architectures=["Olmo2ForCausalLM"], hidden_size=128, intermediate_size=352,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, vocab_size=1000,
                  max_position_embeddings=4096, rope_scaling={"rope_type": "linear", "factor": 2.0})


def test_second_plan_of_a_rope_scaling_config_reads_the_cache(tmp_path, monkeypatch):
    traced = []
    trace = profile_module.trace_profile

    def counting(cfg, key, **kwargs):
        traced.append(key)
        return trace(cfg, key, **kwargs)

    monkeypatch.setattr(profile_module, "trace_profile", counting)
    given = copy.deepcopy(OLMO2_ROPE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = plan(given, gpus="2xA100", seq_len=256, activation_checkpointing="off", cache_dir=tmp_path)
        # Checkpointing off: one profile per recipe (fp32 weights under autocast: DDP; bf16: FSDP2).
        assert [key.compute_bytes for key in traced] == [2, 2] and len(set(traced)) == 2
        assert given == OLMO2_ROPE  # the caller's dict (and its rope_scaling) untouched
        second = plan(copy.deepcopy(OLMO2_ROPE), gpus="2xA100", seq_len=256, activation_checkpointing="off",
                      cache_dir=tmp_path)
    assert len(traced) == 2, traced  # both read from the cache: none traced again
    assert second.model.traced == first.model.traced
    assert [c.memory_bytes for c in second.candidates] == [c.memory_bytes for c in first.candidates]

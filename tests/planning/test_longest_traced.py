"""``--seq-len max`` on a family with no activation formula (``advisor.planning.longest.longest_traced``):
the length it returns fits with the profile traced at that length, and 10% more does not. CPU only."""

from __future__ import annotations


import pytest

import advisor.simulate.profile as profile_module
from advisor.planning.api import plan

# StarCoder2 (no formula: traced), scaled down; its 49k vocabulary makes the logits and the loss most of
# the memory, so a T4 fills at a few ten thousand tokens. Sliding-window attention.
TINY_STARCODER2 = dict(model_type="starcoder2", architectures=["Starcoder2ForCausalLM"], hidden_size=128,
                       intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       vocab_size=49152, max_position_embeddings=16384, sliding_window=512, use_bias=True,
                       tie_word_embeddings=True, residual_dropout=0.0, embedding_dropout=0.0, attention_dropout=0.0)
ARGS = dict(gpus="1xT4", strategy="ddp", activation_checkpointing="off")


pytestmark = pytest.mark.filterwarnings("ignore")  # transformers / PEFT warnings at model build


def test_longest_on_a_traced_family_fits_and_ten_percent_more_does_not(tmp_path, monkeypatch):
    """Before, the search ran on the Llama-like estimate: 21,104 tokens, where the traced plan needs 16.26
    GiB of the T4's 14.57. Now: 18,948, after tracing 21,104, then 18,709 (that profile scaled by tokens),
    18,945 and 18,948 (interpolated between the two nearest traced lengths)."""
    traced = []
    trace = profile_module.trace_profile
    monkeypatch.setattr(profile_module, "trace_profile",
                        lambda cfg, key, **kw: traced.append(key.seq_len) or trace(cfg, key, **kw))
    found = plan(dict(TINY_STARCODER2), seq_len="max", cache_dir=tmp_path, **ARGS)
    best = found.training.seq_len
    assert found.longest_seq_len == {"ddp": best}
    assert found.candidate("ddp").fits
    assert best in {p.key.seq_len for p in found.model.traced}  # decided by the profile traced at that length
    assert len(set(traced)) <= 4, traced  # the search converges in a few traces
    longer = plan(dict(TINY_STARCODER2), seq_len=int(best * 1.1), micro_batch_size=1, cache_dir=tmp_path, **ARGS)
    assert not longer.candidate("ddp").fits
    exact = plan(dict(TINY_STARCODER2), seq_len=best, micro_batch_size=1, cache_dir=tmp_path, **ARGS)
    assert exact.candidate("ddp").fits
    assert exact.candidate("ddp").memory_bytes == found.candidate("ddp").memory_bytes


def test_activation_offload_is_refused_on_a_traced_family(tmp_path):
    """A traced profile holds no block input apart, so offloading them cannot be planned: a one-line refusal,
    not the plan without it under the flag's name."""
    with pytest.raises(ValueError, match="--activation-offload is planned for text decoders.*traced"):
        plan(dict(TINY_STARCODER2), gpus="1xT4", strategy="ddp", activation_checkpointing="on", seq_len=1024,
             micro_batch_size=1, activation_offload=True, cache_dir=tmp_path)

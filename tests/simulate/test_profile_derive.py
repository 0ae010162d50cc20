"""The tracer's one-block points are derived from a two-block step (``advisor.simulate.profile.one_block_less``)
instead of traced: checked here against one-block steps the tracer really runs, moment by moment, on tiny
configs of families whose blocks differ where the derivation could go wrong (OPT: the one-block backward
peak lies below the block at batch 1; Gemma 3: a block that does not keep its input; GPT-J: eager attention
with its s^2 scores)."""

from __future__ import annotations

import pytest

from advisor.model.block_profile import ProfileKey
from advisor.simulate.profile import measure_traced_step, one_block_less

# Layouts of facebook/opt-125m, google/gemma-3-1b-pt (gemma3_text) and EleutherAI/gpt-j-6b, scaled down.
TINY = {
    "opt": dict(model_type="opt", architectures=["OPTForCausalLM"], hidden_size=64, ffn_dim=256, num_hidden_layers=3,
                num_attention_heads=4, vocab_size=512, max_position_embeddings=256, word_embed_proj_dim=64),
    "gemma3": dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], hidden_size=64,
                   intermediate_size=256, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                   head_dim=16, vocab_size=512, sliding_window=32, max_position_embeddings=256),
    "gptj": dict(model_type="gptj", architectures=["GPTJForCausalLM"], n_embd=64, n_layer=3, n_head=4, rotary_dim=8,
                 vocab_size=512, n_positions=256, bos_token_id=0, eos_token_id=0),
}
MOMENTS = ("forward", "loss", "at_blocks", "blocks")


def _key(family: str, *, fp32: bool, checkpointing: str) -> ProfileKey:
    return ProfileKey(residual_bytes=4 if fp32 else 2, compute_bytes=2, input_casts=fp32, checkpointing=checkpointing,
                      seq_len=64, attention="eager" if family == "gptj" else "sdpa", loss="hf")


@pytest.mark.parametrize("family", list(TINY))
@pytest.mark.parametrize("fp32,checkpointing", [(False, "off"), (True, "selective")])
def test_one_block_less_equals_a_traced_one_block_step(family, fp32, checkpointing):
    """At batch 1 and 2: every moment of the traced one-block step equals the two-block step's less what its
    top block added, to the byte; so the profile (solved from these four points) is the one four traced
    steps give."""
    key = _key(family, fp32=fp32, checkpointing=checkpointing)
    built: dict = {}
    for batch in (1, 2):
        one = measure_traced_step(TINY[family], key, num_layers=1, micro_batch_size=batch, built=built)
        two = measure_traced_step(TINY[family], key, num_layers=2, micro_batch_size=batch, built=built)
        derived = one_block_less(two)
        assert two["top_block"] > 0
        assert {m: derived[m] for m in MOMENTS} == {m: one[m] for m in MOMENTS}
        assert two["layer_saved"] == one["layer_saved"]  # the bottom block's saved tensors, either way


def test_one_block_less_by_hand():
    """Moments after the top block lose what it added; the blocks' backward peak is the larger of the top
    block's own (less what it added) and the one after every block is done."""
    point = dict(forward=100, loss=90, at_blocks=80, blocks=95, blocks_top=95, blocks_bottom=30, top_block=20,
                 layer_saved=7)
    assert one_block_less(point) == dict(point, forward=80, loss=70, at_blocks=60, blocks=75)
    assert one_block_less(dict(point, blocks_bottom=78))["blocks"] == 78

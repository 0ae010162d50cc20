"""Phi-3's block (fused ``qkv_proj`` and ``gate_up_proj``, a concatenating rotation) against what autograd saves.

Found by issue 20's sweep (row 60db245fc976: a 192-wide Phi-3, DDP, fp32, micro-batch 8, s 512, -7.32% at the
loss backward). Counted with ``torch.autograd.graph.saved_tensors_hooks`` on the meta-built model given fake
storage (transformers 5.23; one block, storages once, parameters and autocast's weight copies left out), at s 512:
19,232 bytes a token in fp32 and 11,168 under bf16 autocast. Against a Llama block of the same shape: v is a view
of the fused projection's output and keeps all of it (q + kv more elements), o_proj's input is a copy (the
rotation's ``cat`` leaves q contiguous per head and SDPA's output follows q), and under autocast only two linears
cast their input (qkv_proj and gate_up_proj), not five. The formula leaves out the two norms' rsqrt (8 bytes)."""

from __future__ import annotations

import pytest

from advisor.estimate.activations import Dtypes, shape_of
from advisor.estimate.activations_blocks import decoder_layer_per_token
from advisor.estimate.memory import estimate_memory
from advisor.hardware.cluster import parse_gpus
from advisor.model.sources import spec_from_config
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig

PHI3 = dict(model_type="phi3", architectures=["Phi3ForCausalLM"], hidden_size=192, intermediate_size=576,
            num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=6, vocab_size=1216,
            max_position_embeddings=8192, original_max_position_embeddings=8192, tie_word_embeddings=True,
            resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            _name_or_path="sweep/phi3-h192-l2-v1216")


@pytest.mark.parametrize("dt,measured", [
    (Dtypes(residual=4, compute=4, input_casts=False), 19_232),
    (Dtypes(residual=4, compute=2, input_casts=True), 11_168),
], ids=["fp32", "autocast"])
def test_phi3_block_matches_saved_tensors(dt, measured):
    shape = shape_of(spec_from_config(PHI3, name="phi3", source="local"))
    assert measured - decoder_layer_per_token(shape, dt, seq_len=512, eager=False) == 8  # the two rsqrt


def test_phi3_step_matches_the_simulated_step():
    """The sweep's row 60db245fc976: advisor.simulate.step, rank 0 of 4, 246,021,312 bytes (the loss backward)."""
    spec = spec_from_config(PHI3, name=PHI3["_name_or_path"], source="local")
    training = TrainingConfig(seq_len=512, precision="fp32", activation_checkpointing="off", optimizer="adamw")
    memory = estimate_memory(spec, parse_gpus("4xH100"), training, get_strategy("ddp").on("torch"),
                             micro_batch_size=8, checkpointing=False)
    assert abs(memory.peak_allocated - 246_021_312) <= 0.01 * 246_021_312

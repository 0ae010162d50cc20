"""Phi's MLP on a TP mesh: NewGELU (``hidden_act`` 'gelu_new', PhiConfig's default and phi-2's) runs as Python
ops that save five tensors of the MLP's inner width a block, where the decoder count's gated MLP lists four, so
TP takes one more of them off a rank (``profiles/tensor_parallel.json`` mlp_wide_saved). Found by issue 20's
sweep (seed 13, 4d125865cec1: +11.09% against the simulated mesh step). Plans as ``advisor plan`` does: the
profile is traced on the CPU (fake tensors) into ``tmp_path``."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

PHI = {"_name_or_path": "sweep/phi-h512-l4-v1088", "architectures": ["PhiForCausalLM"], "bos_token_id": 1,
       "embd_pdrop": 0.0, "eos_token_id": 2, "hidden_size": 512, "intermediate_size": 2048,
       "max_position_embeddings": 8192, "model_type": "phi", "num_attention_heads": 16, "num_hidden_layers": 4,
       "num_key_value_heads": 2, "pad_token_id": 0, "partial_rotary_factor": 0.5, "resid_pdrop": 0.0,
       "tie_word_embeddings": False, "vocab_size": 1088}
# advisor.simulate.mesh_step.simulate_mesh of the sweep row (zero3, tp 2 x dp_shard 4 on 8 GPUs, fp16-mixed, AdamW,
# transformers' loss, mb 1, not checkpointed; torch 2.13, transformers 5.23): s 2048 measured for this test, s 8192
# the row itself.
SIMULATED = {2048: 167_328_092, 8192: 604_363_100}


@pytest.mark.parametrize("seq_len", [2048, 8192])
def test_matches_the_simulated_mesh_step(seq_len, tmp_path):
    from advisor.planning.api import plan

    result = plan(dict(PHI), gpus="8xH100", cache_dir=tmp_path, strategy="zero3", tp=2, micro_batch_size=1,
                  seq_len=seq_len, activation_checkpointing="off", precision="fp16-mixed", loss="hf", optimizer="adamw")
    candidate = next(c for c in result.candidates if c.mesh is not None and c.mesh.tp == 2 and c.mesh.dp_shard == 4)
    simulated = SIMULATED[seq_len]
    # Four wide tensors taken off a rank left it 4 blocks x s x 1,024 columns x 2 bytes over (+10.0%, +11.1%).
    assert abs(candidate.memory_bytes.peak_allocated - simulated) <= 0.001 * simulated

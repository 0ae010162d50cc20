"""A traced family on a tp 2 mesh, planned and simulated here (slow: the plan traces the family, 5-15 s on a
shared CPU, and ``advisor.simulate.mesh_step.simulate_mesh`` runs 8 fake ranks, 3-6 s): the mesh estimate
(``advisor.estimate.model_parallel``) against the step PyTorch runs, for the two kinds of traced family the
sweep's TP rows fixed: StableLM (no transformers TP plan, so embedding and head whole; o_proj's copy of the
attention output, here one head a rank) and a tied Granite (the head gradient that bends the loss line)."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("torch")

STABLELM = dict(model_type="stablelm", architectures=["StableLmForCausalLM"], hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, vocab_size=512,
                tie_word_embeddings=False, max_position_embeddings=2048, partial_rotary_factor=0.25,
                _name_or_path="test/stablelm-tiny")
# Width 64 over 24 tokens a sample: the tied head's backward (N x V + V x h fp32) outweighs the log-softmax's three
# N x V at micro-batch 1, not from 2 on; planned at 4.
GRANITE = dict(model_type="granite", architectures=["GraniteForCausalLM"], hidden_size=64, intermediate_size=128,
               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, vocab_size=4096,
               tie_word_embeddings=True, max_position_embeddings=2048, _name_or_path="test/granite-tiny")


@pytest.mark.slow
@pytest.mark.parametrize("cfg, batch, seq_len", [(STABLELM, 1, 128), (GRANITE, 4, 24)],
                         ids=["stablelm", "granite-tied"])
def test_mesh_estimate_of_a_traced_family_is_the_simulated_step(cfg, batch, seq_len):
    from advisor.planning.api import plan
    from advisor.simulate.mesh_step import simulate_mesh

    warnings.filterwarnings("ignore")
    result = plan(dict(cfg), gpus="8xH100", strategy="zero3", tp=2, micro_batch_size=batch, seq_len=seq_len,
                  activation_checkpointing="off", precision="fp32", loss="hf", optimizer="adamw", cache_dir=None)
    candidate = next(c for c in result.candidates if c.mesh is not None and c.mesh.tp == 2)
    step = simulate_mesh(dict(cfg), dims=candidate.mesh, training=result.training, micro_batch_size=batch)
    estimated = candidate.memory_bytes.peak_allocated
    # On the branch's base (4203ba9): StableLM -7.56% (2,024,200 bytes against 2,189,840: embedding and head split
    # by tp), Granite -7.23% (6,895,944 against 7,433,496: the loss line one N x V fp32 short); with o_proj's copy
    # taken off by half, not whole (one head a rank), StableLM was +1.41%.
    assert abs(estimated - step.peak_bytes) / step.peak_bytes < 0.005, (estimated, step.peak_bytes)

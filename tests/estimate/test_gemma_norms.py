"""Gemma's RMSNorm scales by ``(1 + weight)`` in fp32 and casts back (transformers 5.23 modeling_gemma.py
``GemmaRMSNorm``), so where the residual stream is 16-bit (pure bf16, FSDP2's MixedPrecisionPolicy) it saves its
normalised tensor in fp32, where Llama's RMSNorm keeps it in the input dtype (``profiles/architectures.json``:
``fp32_norm_scale``). Found by issue 20's sweep, read tensor by tensor on the simulated step:

- 31bbc0c6d375 (256-wide Gemma, ZeRO-3 on 16, micro-batch 1, s 4096, selective checkpointing, bf16, chunked loss):
  -2.58% in the top block's backward; each recomputed norm held ``x.float()`` and ``x * rsqrt`` in fp32 (2 x 4,194,304
  bytes) and its bf16 output; after the fix -0.04%.
- 567628d4934e (512-wide Gemma, ZeRO-2 on 8, micro-batch 1, s 256, bf16-mixed, hf loss): -1.67% at the end of
  forward; after the fix -0.02%.

Simulated peaks: advisor.simulate.step (fake tensors, torch 2.13, transformers 5.23), as stored in the sweep."""

from __future__ import annotations

import warnings

import pytest

from advisor.planning.api import plan


def _gemma(hidden: int, inter: int, heads: int, head_dim: int, vocab: int) -> dict:
    return dict(model_type="gemma", architectures=["GemmaForCausalLM"], hidden_size=hidden, intermediate_size=inter,
                num_hidden_layers=4, num_attention_heads=heads, num_key_value_heads=1 if heads == 2 else 2,
                head_dim=head_dim, vocab_size=vocab, max_position_embeddings=8192, tie_word_embeddings=True,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, _name_or_path=f"sweep/gemma-h{hidden}-l4-v{vocab}")


CASES = [  # config, world, job, simulated peak, its moment
    (_gemma(256, 1248, 2, 128, 1792), 16, dict(strategy="zero3", micro_batch_size=1, seq_len=4096,
     activation_checkpointing="selective", precision="bf16", loss="chunked", optimizer="adam"),
     165_210_630, "block_backward"),
    (_gemma(512, 2720, 16, 32, 6848), 8, dict(strategy="zero2", micro_batch_size=1, seq_len=256,
     activation_checkpointing="off", precision="bf16-mixed", loss="hf", optimizer="adamw"),
     142_672_942, "end_of_forward"),
]


@pytest.mark.parametrize("config,world,job,simulated,moment", CASES, ids=["zero3-bf16-selective", "zero2-hf"])
def test_gemma_matches_the_simulated_step(config, world, job, simulated, moment):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        memory = plan(dict(config), gpus=f"{world}xH100", **job).candidate(job["strategy"]).memory_bytes
    assert memory.peak_moment == moment
    assert abs(memory.peak_allocated - simulated) <= 0.002 * simulated, (memory.peak_allocated, simulated)


def test_gemma_block_by_hand():
    """A 256-wide Gemma block against the same block as Llama, pure bf16: each of its two norms saves its normalised
    tensor in fp32, 2 bytes a channel more, 2 x 2 x 256 = 1,024 bytes a token; under autocast over fp32 weights (an
    fp32 residual) the normalised tensor is fp32 in both: no difference."""
    from advisor.estimate.activations import Dtypes, shape_of
    from advisor.estimate.activations_blocks import decoder_layer_per_token
    from advisor.model.sources import spec_from_config

    gemma_cfg = _gemma(256, 1248, 2, 128, 1792)
    gemma = shape_of(spec_from_config(gemma_cfg, name="g", source="local"))
    llama = shape_of(spec_from_config(dict(gemma_cfg, model_type="llama", architectures=["LlamaForCausalLM"],
                                           tie_word_embeddings=False), name="l", source="local"))
    bf16 = Dtypes(residual=2, compute=2, input_casts=False)
    autocast = Dtypes(residual=4, compute=2, input_casts=True)
    per_token = {dt.residual: decoder_layer_per_token(gemma, dt, seq_len=4096, eager=False)
                 - decoder_layer_per_token(llama, dt, seq_len=4096, eager=False) for dt in (bf16, autocast)}
    assert per_token == {2: 1_024, 4: 0}

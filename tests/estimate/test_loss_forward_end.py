"""The end of forward and the top block's backward of a full fine-tune under autocast, read tensor by tensor on the
simulated step. Found by issue 20's sweep, case b86536f72b68 (128-wide Llama, DDP on one GPU, micro-batch 8, s 256,
selective checkpointing, bf16-mixed, chunked loss): +2.75%, the estimate peaking in the block backward where the step
peaks in the loss's forward. What the step holds and the count did not say:

- the RoPE cos/sin tables are one (1, s, head_dim) pair a micro-batch (transformers makes ``position_ids`` as
  ``cache_position.unsqueeze(0)``), 2 x 65,536 bytes, not one a sample (1,048,576 counted);
- the final norm's fp32 output is live while the loss runs (the model's forward holds it; autocast's head saves only
  its bf16 cast), 2,048 x 128 x 4 = 1,048,576 bytes at the end of forward;
- the chunked loss ends its forward with the last chunk's fp32 logits beside every chunk's log-softmax; the chunk's
  bf16 logits were freed as ``.float()`` returned (256 x 1,344 x 2 = 688,128 bytes counted);
- the fused loss reads the head's input with autocast off: no autocast cast of it (2,048 x 128 x 2) is saved;
- in a block's backward autocast's copy of the head (1,344 x 128 x 2 = 344,064) is gone: the head's backward ran;
  at its MLP's product rule down_proj's copy (106,496) is gone too (sweep 99301ffaf053, Phi: fc2's, +1.89% -> -0.01%).

Simulated (advisor.simulate.step, fake tensors, torch 2.13, transformers 5.23): the forward's peak (read with the
memory tracker over the forward's ops) and the top block's backward peak."""

from __future__ import annotations

import warnings

import pytest

from advisor.planning.api import plan

LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=128, intermediate_size=416,
             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, vocab_size=1344,
             max_position_embeddings=8192, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
             _name_or_path="sweep/llama-h128-l2-v1344")


def _memory(loss: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = plan(dict(LLAMA), gpus="1xH100", strategy="ddp", micro_batch_size=8, seq_len=256,
                      activation_checkpointing="selective", precision="bf16-mixed", loss=loss, optimizer="sgd-momentum")
    return result.candidate("ddp").memory_bytes


@pytest.mark.parametrize("loss,forward_peak", [
    ("hf", 47_873_352),  # before -0.33% (47,716,352)
    ("chunked", 32_734_568),  # +1.62% (33,265,664): the step's peak
    ("fused", 24_384_076),  # +1.53% (24,123,392) against 23,759,436, simulated before the simulator allocated
    # logsumexp's scratch beside the kernel's fp32 logits (advisor.simulate.fake_env.kernel_scratch)
])
def test_end_of_forward_matches_the_simulated_forward(loss, forward_peak):
    memory = _memory(loss)
    assert abs(memory.at_end_of_forward - forward_peak) <= 0.003 * forward_peak, (memory.at_end_of_forward, forward_peak)


def test_the_sweep_case_peaks_in_the_loss_forward():
    memory = _memory("chunked")
    assert memory.peak_moment == "end_of_forward"  # before: block_backward, +2.75% (33,633,792 vs 32,734,568)
    # The top block's MLP backward (selective recomputation), 32,284,424 simulated: before +4.18%; -0.06% now that
    # down_proj's autocast copy (416 x 128 x 2 = 106,496 bytes) is freed by its backward, before the product rule.
    assert abs(memory.at_block_backward - 32_284_424) <= 0.001 * 32_284_424


def test_rope_tables_once_a_micro_batch_by_hand():
    """Micro-batch 8 against 8 x micro-batch 1: the blocks and the rest scale with the samples, the RoPE tables
    (2 x 4 bytes x head_dim 64 a position, s 256: 131,072 bytes) do not: 7 x 131,072 = 917,504 bytes less."""
    from advisor.estimate.activations import Dtypes, estimate_activations, shape_of
    from advisor.model.sources import spec_from_config

    shape = shape_of(spec_from_config(LLAMA, name="m", source="local"))
    dt = Dtypes(residual=4, compute=2, input_casts=True)
    one, eight = (estimate_activations(shape, dt, micro_batch_size=b, seq_len=256, checkpointing=False, eager=False)
                  for b in (1, 8))
    assert 8 * one.saved_bytes - eight.saved_bytes == 7 * 131_072


def test_chunked_loss_forward_end_by_hand():
    """2,048 tokens x 1,344: every chunk's fp32 log-softmax (11,010,048) and the last chunk's fp32 logits (256 x
    1,344 x 4 = 1,376,256), in bf16-mixed as in fp32."""
    from advisor.estimate.activations import Dtypes
    from advisor.estimate.activations_loss import loss_bytes

    for dt in (Dtypes(residual=4, compute=2, input_casts=True), Dtypes(residual=4, compute=4, input_casts=False)):
        assert loss_bytes("chunked", tokens=2_048, vocab=1_344, hidden=128, dt=dt)[0] == 11_010_048 + 1_376_256

"""A frozen base's attention where no single kernel saves its tensors: eager, and CUDA's math SDPA (fp32 with
grouped-query attention, ``activations_blocks.cuda_math_sdpa``). The two matmuls save q and the repeated k and v,
the softmax its fp32 output (in fp32 the compute-dtype copy is the same tensor), and nothing saves the output made
contiguous for o_proj unless an adapter on o_proj does (its ``lora_A``).

Found by issue 20's sweep, case a7b943fccdde (384-wide Gemma, fp32, GQA, ZeRO-3 on 8, micro-batch 4, s 128, DoRA
r4 on q and v): +4.84% at the loss backward. The count charged each score 4 + 4 bytes (the fp32 softmax output
and a compute-dtype copy that fp32 does not make) and o_proj's input (4 x 384 a token) in every block: 4,608
bytes a token and layer too many; after the fix +0.48% against the step without the stray DoRA identities below.

Simulated peaks (advisor.simulate.step, fake tensors, torch 2.13, transformers 5.23, PEFT 0.21), read tensor by
tensor at the peak (the loss backward). PEFT's DoRA builds ``torch.eye(in_features)`` in every adapted linear's
forward (``DoraLinearLayer.get_lora_weight``); the simulated step frees some of them only when Python's cycle
collector runs (the memory tracker's module hooks hold them in a reference cycle; on a GPU the refcount frees
each as the forward returns), so its peak carries 0 to a few of them at random: the figures below are the peaks
less the identities live there (all-linear: 14,127,496 read with one 192 x 192 and two 64 x 64 fp32 identities,
180,224 bytes; o_proj: 8,567,432 with one 64 x 64)."""

from __future__ import annotations


import pytest

from advisor.model.lora import LoraConfig
from advisor.planning.api import plan

# GQA (2 heads, 1 key/value head) in fp32: CUDA runs the math kernel, and so does the simulator.
MISTRAL = dict(model_type="mistral", architectures=["MistralForCausalLM"], hidden_size=64, intermediate_size=192,
               num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, vocab_size=1024,
               max_position_embeddings=8192, sliding_window=None, tie_word_embeddings=False, pad_token_id=0,
               bos_token_id=1, eos_token_id=2, _name_or_path="frozen/mistral-gqa-h64-l3")


pytestmark = pytest.mark.filterwarnings("ignore")  # transformers / PEFT warnings at model build


@pytest.mark.parametrize("targets,simulated", [
    (("q_proj", "v_proj"), 9_421_320),  # before the fix +19.38%
    (("o_proj",), 8_551_048),  # +11.95%
    ("all-linear", 13_947_272),  # +9.53%
], ids=["q-v", "o", "all-linear"])
def test_dora_over_math_attention_matches_the_simulated_step(targets, simulated):
    result = plan(dict(MISTRAL), gpus="1xH100", strategy="ddp", micro_batch_size=1, seq_len=256,
                  activation_checkpointing="off", precision="fp32", loss="hf", optimizer="sgd",
                  lora=LoraConfig(rank=4, targets=targets, dora=True))
    memory = result.candidate("ddp").memory_bytes
    assert memory.peak_moment == "loss_backward"
    # q-v: +0.60%, one q-width of the first block over (its k needs no gradient, so QK^T does not save q).
    assert abs(memory.peak_allocated - simulated) <= 0.007 * simulated, (memory.peak_allocated, simulated)


def test_frozen_math_attention_block_by_hand():
    """The config above, fp32, s 256, DoRA r4 on every linear: a block saves its two norms' fp32 inputs (2 x 4 x 64
    = 512), the gated MLP's three wide tensors (3 x 4 x 192 = 2,304), q and the repeated k and v (3 x 4 x 64 = 768),
    the fp32 softmax output (4 x 2 heads x 256 = 2,048), the adapters' x A (7 x 4 x 4 = 112), the inputs they read
    (the attention norm's output, o_proj's input, the MLP norm's output, down_proj's input: 4 x (3 x 64 + 192) =
    1,536) and DoRA's two outputs a target (2 x 4 x (64 + 32 + 32 + 64 + 192 + 192 + 64) = 5,120): 12,400 bytes a
    token. Read on the simulated step: 9,550,848 bytes in the three blocks at s 256, 12,436 a token and block (36
    of them the norms' rsqrt and DoRA's weight-norm vectors, not counted)."""
    from advisor.estimate.activations import Adapters, Dtypes, shape_of
    from advisor.estimate.activations_blocks import frozen_decoder_layer_per_token
    from advisor.model.sources import spec_from_config

    shape = shape_of(spec_from_config(MISTRAL, name="m", source="local"))
    fp32 = Dtypes(residual=4, compute=4, input_casts=False, buffer=4)
    adapters = Adapters(rank=4, dropout=False, inputs=((64, "attn_norm"),) * 3 + ((64, "attention"),)
                        + ((64, "mlp_norm"),) * 2 + ((192, "mlp_act"),), dora_outputs=(64, 32, 32, 64, 192, 192, 64))
    assert frozen_decoder_layer_per_token(shape, fp32, adapters, seq_len=256, eager=True) == 12_400
    # SDPA's kernels save q, k, v (unrepeated), the output and the fp32 log-sum-exp (4 x (64 + 2 x 32 + 64) + 4 x 2
    # = 776) in place of the matmuls' 768 and the softmax's 2,048, and o_proj's adapter reads the saved output as a
    # view (256 less): 10,104.
    assert frozen_decoder_layer_per_token(shape, fp32, adapters, seq_len=256, eager=False) == 10_104


@pytest.mark.parametrize("checkpointing,simulated", [
    ("on", 38_952_840),  # before the fix -8.52% (27,961,600 against 30,564,232, simulated before CUDA's softmax
    # backward product was held: advisor.simulate.cuda_kernels.cuda_softmax_backward, 2 x 1024^2 x 4 bytes more)
    ("off", 78_719_368),  # -3.08% (68,167,936 against 70,330,760)
])
def test_dora_softmax_backward_matches_the_simulated_step(checkpointing, simulated):
    """The top block's softmax backward decides at s 1024 (DoRA r4 with dropout 0.05 on every linear, fp32 GQA:
    the math kernel, chunked loss). Sweep b88491b6efc6 (384-wide Llama, ZeRO-3 on 8, s 2048, checkpointed) was
    -4.01% there, read tensor by tensor: the count kept the q, k and v adapters' inputs, dropout masks and x A but
    not DoRA's base and adapter outputs of q, k and v (saved until q, k and v's backward, after the softmax's), and
    the memory model took down_proj's adapter tensors (``mlp_freed_bytes``) off this point though the softmax
    backward's count (what the block still holds) had none of the MLP's left: 4,608 + 8,688 bytes a token short.
    After the fix +0.04% there (1,345,185,088 estimated, 1,344,667,464 simulated)."""
    result = plan(dict(MISTRAL), gpus="1xH100", strategy="ddp", micro_batch_size=1, seq_len=1024,
                  activation_checkpointing=checkpointing, precision="fp32", loss="chunked", optimizer="sgd",
                  lora=LoraConfig(rank=4, targets="all-linear", dora=True, dropout=0.05))
    memory = result.candidate("ddp").memory_bytes
    assert memory.peak_moment == "block_backward"
    assert abs(memory.peak_allocated - simulated) <= 0.007 * simulated, (memory.peak_allocated, simulated)

"""Activation memory of hybrid attention / state-space stacks (Jamba), per layer as its kind is.

What belongs here: Jamba's Mamba mixer (``JambaMambaMixer`` in transformers 5.x ``modeling_jamba.py``)
as a difference from the Mamba-1 mixer of ``advisor.estimate.activations_ssm``, and the composition of
a Jamba stack from the decoder's attention and feed-forward pieces (``advisor.estimate.activations_blocks``)
and that mixer. Pure functions, integer bytes.

Jamba's mixer runs the same reference scan as Mamba without ``mamba_ssm`` (the CUDA kernels are not
modelled: ``JAMBA_NOTE``), but RMS-normalises dt (R), B and C (N each) after x_proj: each norm saves
its fp32 input copy, its rsqrt (4 bytes) and the normalised value cast back (cb), instead of x_proj's
output kept whole; dt_proj (a matmul on the dt norm's output) saves that output (cb R), the C product
the C norm's output (cb N), and the scan one more low-precision state per sequence (its zero start;
in fp32 two more fp32 states, and B's norm output stands in for its fp32 copy). Listed with
``saved_tensors_hooks`` on a tiny JambaForCausalLM (h 64, d 128, N 8, R 4, seq 16): beyond the
mixer's input and the per-layer constants (exp(A_log) twice, D), 17,772 bytes a token in bf16 and
18,012 in fp32, both equal to this count; ``tests/estimate/test_hybrid_activations.py``.
"""

from __future__ import annotations

from advisor.estimate.activations_blocks import attention_per_token, decoder_layer_per_token
from advisor.estimate.activations_ssm import SSM_NOTE, mamba_mixer_per_token
from advisor.model.hybrid import HybridFacts
from advisor.precision import FP32


JAMBA_NOTE = ("Jamba: attention layers as the decoder's, feed-forward as a dense gated MLP or the MoE block "
              "(dropless top-k, weights unnormalised), Mamba layers as " + SSM_NOTE.removeprefix("Mamba: ")
              + "; autocast casts inside the Mamba mixer are not counted")


def jamba_mixer_per_token(cb: int, *, hidden: int, hybrid: HybridFacts, seq_len: int) -> int:
    """Bytes one token leaves saved in one Jamba Mamba mixer (its input is the block norm's, counted there)."""
    ssm, inner = hybrid.ssm, hybrid.mamba_inner
    low = cb != FP32
    x_proj_out = ssm.time_step_rank + 2 * ssm.state_size
    mamba = mamba_mixer_per_token(cb, hidden=hidden, inner=inner, ssm=ssm, seq_len=seq_len)
    # dt, B, C norms replace x_proj's kept output: each saves its fp32 input (a copy; in fp32 x_proj's
    # output itself), its rsqrt and the normalised value; dt_proj saves the dt norm's output, the C
    # product the C norm's; in fp32 the B norm's output is B itself (no fp32 copy for the scan).
    norms = (FP32 + cb) * x_proj_out + 3 * FP32 - cb * x_proj_out
    inputs = cb * ssm.time_step_rank + cb * ssm.state_size + (0 if low else FP32 * ssm.state_size)
    # Per sequence: the zero initial state's cast (low precision), or two more fp32 states (fp32).
    start = (cb if low else 2 * FP32) * inner * ssm.state_size // seq_len
    return mamba + norms + inputs + start


def hybrid_layers_per_token(shape, dt, *, seq_len: int, eager: bool) -> list[int]:
    """Per layer, the bytes a token leaves saved: an attention layer is the decoder's block (its MLP
    dense or MoE as the layer is); a Mamba layer is the same block with the attention piece (and its
    three input casts under autocast) replaced by the mixer (and in_proj's cast)."""
    hybrid: HybridFacts = shape.hybrid
    cb = dt.compute
    mixer = jamba_mixer_per_token(cb, hidden=shape.hidden_size, hybrid=hybrid, seq_len=seq_len)
    attn = attention_per_token(shape, dt, seq_len=seq_len, eager=eager) + (3 * cb * shape.hidden_size if dt.input_casts else 0)
    in_proj_cast = cb * shape.hidden_size if dt.input_casts else 0
    per_layer = []
    for is_attn, is_moe in zip(hybrid.attention_layers, hybrid.expert_layers):
        block = decoder_layer_per_token(shape, dt, seq_len=seq_len, eager=eager, dense=not is_moe)
        per_layer.append(block if is_attn else block - attn + mixer + in_proj_cast)
    return per_layer

"""Activation memory of a Mamba-1 block, per token, as transformers 5.x runs it without the
``mamba_ssm`` / ``causal_conv1d`` CUDA kernels (its reference PyTorch path, ``MambaMixer.slow_forward``
and the reference ``selective_scan_fn``): a Python loop over the sequence that keeps every step's
state for backward. With the fused CUDA kernels installed the scan recomputes its states in
backward and saves far less; that path is not modelled (``SSM_NOTE`` says so in the plan).

Counted per token (d = d_inner, N = state, R = dt rank, K = conv width, cb the compute bytes): the
RMSNorm (as the decoder's), in_proj's output (x and z, 2d, kept whole), the causal conv's padded
output (d (s + K - 1) / s), the inputs of x_proj and out_proj (d each), x_proj's output (R + 2N,
kept whole), dt_proj's output and softplus(dt) (d each); in fp32: exp(delta A) and delta B u
(d N each), the state after every step but the last (d N (s - 1) / s) and, when the activations are
low precision, each state's cast for the C product (cb d N), fp32 copies of B (N) and u (d); the
scan output plus u D in fp32 (d), its transposed low-precision copy and silu(z) (d each).
Listed with ``saved_tensors_hooks`` on a tiny MambaForCausalLM (bf16: 18,444 bytes a token a layer
measured, 18,040 counted + 4 (rsqrt) + 400 of per-layer constants: exp(A_log), D, the zero initial
state); checked in ``tests/estimate/test_ssm_activations.py``. Pure functions, integer bytes.
"""

from __future__ import annotations

from advisor.model.kinds import SsmFacts
from advisor.precision import FP32


SSM_NOTE = ("Mamba: activations of transformers' reference PyTorch scan (mamba_ssm / causal_conv1d not installed), "
            "which keeps every step's state; the fused CUDA kernels save far less and are not modelled")


def mamba_mixer_per_token(cb: int, *, hidden: int, inner: int, ssm: SsmFacts, seq_len: int) -> int:
    """Bytes one token leaves saved in one Mamba mixer (the block's RMSNorm is counted by the caller)."""
    d, n = inner, ssm.state_size
    low = cb != FP32  # fp32 copies and state casts exist only when the activations are low precision
    wide = cb * (2 * d + 2 * d + 2 * d + 2 * d) + cb * (ssm.time_step_rank + 2 * n)
    conv = cb * d * (seq_len + ssm.conv_kernel - 1) // seq_len
    scan = FP32 * 2 * d * n + FP32 * d * n * (seq_len - 1) // seq_len + (cb * d * n + FP32 * (n + d) if low else 0)
    return wide + conv + scan + FP32 * d

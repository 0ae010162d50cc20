"""Activation memory: the tensors autograd saves for backward, per micro-batch, from the
architecture; and the logits/loss transient at the start of backward.

The decoder formula counts what Hugging Face's Llama-style modeling code saves (RMSNorm in fp32,
RoPE, SDPA, gated MLP), so it depends on the dtype of the residual stream (fp32 under autocast
with fp32 weights, bf16 when the weights themselves are bf16, as with FSDP2's MixedPrecisionPolicy
or DeepSpeed) and on whether each linear layer makes its own bf16 copy of an fp32 input (autocast
does not cache casts of activations). Sources: Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", section 4) for the method; the saved tensors of each op
from PyTorch's derivatives.yaml. GPT-2 and BERT use the same method with their LayerNorm, GELU and
dropout. Validated against PyTorch's own execution by the simulator (``advisor simulate``).

All functions are pure: integers in, integer bytes out.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from advisor.model_spec import ModelSpec

FP32 = 4
BOOL = 1
INT64 = 8


class ActivationShape(BaseModel):
    """The shape fields the activation model needs (from a spec, or assumed for a bare size)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    family: str = Field(description="decoder, gpt2 or bert")
    num_experts: int | None = None
    num_experts_per_token: int | None = None
    assumed: bool = Field(default=False, description="Shape invented from the size alone.")


class Dtypes(BaseModel):
    """Byte widths that decide activation sizes under a given recipe."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    residual: int = Field(description="Bytes of the residual stream (4 under autocast with fp32 weights).")
    compute: int = Field(description="Bytes of matmul outputs (2 for bf16/fp16).")
    input_casts: bool = Field(description="Each linear makes its own low-precision copy of an fp32 input.")


class ActivationEstimate(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    saved_bytes: int = Field(description="Saved for backward at the end of forward (all layers, or block inputs).")
    logits_bytes: int = Field(description="Logits the model returns (held until backward ends).")
    loss_transient_bytes: int = Field(description="fp32 log-softmax output and its gradients at loss backward.")
    layer_bytes: int = Field(description="One block's saved tensors (what checkpointing recomputes).")


def shape_of(spec: ModelSpec) -> ActivationShape:
    """The spec's own shape, or an assumed Llama-like one when only the size is known."""
    family = {"gpt2": "gpt2", "bert": "bert"}.get(spec.model_type or "", "decoder")
    if spec.has_architecture:
        heads = spec.num_attention_heads
        head_dim = spec.head_dim or spec.hidden_size // heads
        return ActivationShape(
            num_layers=spec.num_layers,
            hidden_size=spec.hidden_size,
            num_attention_heads=heads,
            num_kv_heads=spec.num_kv_heads or heads,
            head_dim=head_dim,
            intermediate_size=spec.intermediate_size or 4 * spec.hidden_size,
            vocab_size=spec.vocab_size,
            family=family,
            num_experts=spec.num_experts,
            num_experts_per_token=spec.num_experts_per_token,
        )
    # Size only: a Llama-like shape with P ~= 12 L h^2 and L ~= h / 128 (Llama 2 7B: h=4096, L=32).
    hidden = max(256, round((spec.total_params * 128 / 12) ** (1 / 3) / 256) * 256)
    layers = max(1, round(spec.total_params / (12 * hidden * hidden)))
    return ActivationShape(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=hidden // 128,
        num_kv_heads=hidden // 128,
        head_dim=128,
        intermediate_size=hidden * 8 // 3,
        vocab_size=32000,
        family="decoder",
        assumed=True,
    )


def _decoder_layer_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool) -> int:
    """Bytes one token leaves saved in one Llama-style block."""
    h, I = shape.hidden_size, shape.intermediate_size
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_kv_heads * shape.head_dim
    cb = dt.compute
    # RMSNorm (HF): pow/mul save the fp32 input (or its fp32 upcast), mul saves the normalised output.
    norms = 2 * (FP32 * h + dt.residual * h)
    casts = 5 * cb * h if dt.input_casts else 0  # q,k,v and gate,up each cast their input
    if eager:
        # matmul saves q and (repeated) k; softmax output in fp32 plus its low-precision copy; v repeated.
        attn = cb * 3 * q + (FP32 + cb) * shape.num_attention_heads * seq_len + cb * q
    else:
        # SDPA saves q, k, v (post-RoPE, low precision), its output and the fp32 logsumexp.
        attn = cb * (q + kv) + cb * kv + cb * q + FP32 * shape.num_attention_heads + cb * q
    mlp = 4 * cb * I  # gate out, act(gate), up out, act*up
    if shape.num_experts:
        k = shape.num_experts_per_token or 1
        # Routed copies of the input and each chosen expert's MLP, plus fp32 router logits/probs.
        mlp = k * (cb * h + mlp + cb * h) + 2 * FP32 * shape.num_experts
    return norms + casts + attn + mlp


def _encoder_layer_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool) -> int:
    """GPT-2 / BERT block: LayerNorms, MHA with biases, GELU MLP, dropout masks (p=0.1 in train mode)."""
    h, I, heads = shape.hidden_size, shape.intermediate_size, shape.num_attention_heads
    cb = dt.compute
    # LayerNorm saves its input (plus small mean/rstd); under autocast the next linear casts a copy.
    layer_norms = 2 * (dt.residual * h + (cb * h if dt.input_casts else 0))
    if eager:
        attn = cb * 3 * h + (FP32 + cb + BOOL) * heads * seq_len + cb * h
    else:
        attn = cb * 3 * h + FP32 * heads + cb * h
    o_in = cb * h
    dropout_masks = 2 * BOOL * h
    # GELU (tanh form, Python ops): saves its input, tanh output, 0.5*x and 1+tanh; fc2 saves the result.
    mlp = (FP32 if dt.input_casts else cb) * I * 4 + cb * I
    return layer_norms + attn + o_in + dropout_masks + mlp


def estimate_activations(
    shape: ActivationShape, dt: Dtypes, *, micro_batch_size: int, seq_len: int, checkpointing: bool, eager: bool
) -> ActivationEstimate:
    """Saved activations of one micro-batch at the end of forward, and the loss transient."""
    tokens = micro_batch_size * seq_len
    per_layer = _decoder_layer_per_token if shape.family == "decoder" else _encoder_layer_per_token
    layer = tokens * per_layer(shape, dt, seq_len=seq_len, eager=eager)
    h, vocab = shape.hidden_size, shape.vocab_size
    # Outside the blocks: token ids for the embedding backward, the final norm, the head's input cast.
    outside = tokens * (INT64 + FP32 * h + dt.residual * h + (dt.compute * h if dt.input_casts else 0))
    if checkpointing:
        # Non-reentrant checkpointing keeps each block's input; one block is recomputed at a time.
        saved = tokens * shape.num_layers * dt.residual * h + layer + outside
    else:
        saved = shape.num_layers * layer + outside
    logits = tokens * vocab * dt.compute
    # Loss backward (HF upcasts logits to fp32): saved log-softmax output, NLL grad, log-softmax grad.
    loss = tokens * vocab * 3 * FP32
    return ActivationEstimate(saved_bytes=saved, logits_bytes=logits, loss_transient_bytes=loss, layer_bytes=layer)

"""A frozen base's blocks (LoRA / DoRA on a Llama-style decoder) beyond what each block saves
(``activations_blocks.frozen_decoder_layer_per_token``): what the first block does not save without
checkpointing, what a block's backward has freed by its MLP's peak, and what is live as a checkpointed
block's recomputation stops inside down_proj's adapter. ``advisor.estimate.activations.estimate_activations``
multiplies these per-token figures by the tokens; ``advisor.estimate.memory`` places them at the block
backward's points.

The first block. Autograd saves a tensor only on a path to a tensor that requires a gradient. Under LoRA the
embedding is frozen, so the first block's input needs no gradient, and nothing before the block's first adapter
does either: the ops there save nothing. What the first adapter's source decides (a Llama-style block, in
order: ``attn_norm`` q/k/v, ``attention`` o_proj, ``mlp_norm`` gate/up, ``mlp_act`` down_proj;
``advisor.model.lora.INPUT_SOURCE``):

- the attention norm's fp32 input: never saved in the first block;
- RoPE and SDPA's tensors (eager: the matmuls' and softmax's): saved only when q, k or v is adapted;
- the MLP norm's fp32 input (and Gemma 2's post-attention norm's): only when the attention is adapted;
- the gated MLP's three wide tensors: only when gate, up or an earlier linear is adapted;
- o_proj's adapter input is SDPA's saved output, shared, only when SDPA saves it: with o_proj the
  first adapter it is the adapter's own (new memory, counted back).

Measured (advisor.simulate, 128-wide Mistral, fp32, s 2048, LoRA r8 on down_proj, DDP, no checkpointing):
the first block saved the down_proj adapter's input and ``x A`` alone (tests/estimate/test_frozen_first_block.py
holds the 64-wide readings). Under checkpointing the recomputed block that decides is not the first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from advisor.estimate.activations_blocks import frozen_adapters_per_token, frozen_attention_per_token
from advisor.frozen import validated_copy
from advisor.precision import FP32

if TYPE_CHECKING:
    from advisor.estimate.activations import ActivationShape, Adapters, Dtypes

SOURCE_ORDER = ("attn_norm", "attention", "mlp_norm", "mlp_act")  # a Llama-style block's adapter inputs, in order


def first_block_unsaved_per_token(shape: ActivationShape, dt: Dtypes, ad: Adapters, *, seq_len: int,
                                  eager: bool) -> int:
    """Bytes a token of ``frozen_decoder_layer_per_token`` the first block does not save (module docstring)."""
    h = shape.hidden_size
    first = min((SOURCE_ORDER.index(source) for _, source in ad.inputs), default=len(SOURCE_ORDER))
    unsaved = FP32 * h  # the attention norm's fp32 input
    if first > SOURCE_ORDER.index("attn_norm"):
        unsaved += frozen_attention_per_token(shape, dt, seq_len=seq_len, eager=eager)
        if (first == SOURCE_ORDER.index("attention") and not dt.input_casts and dt.adapter is None
                and not ad.dropout and not eager):
            unsaved -= dt.compute * shape.num_attention_heads * shape.head_dim  # o_proj's input: its adapter's own
    if first > SOURCE_ORDER.index("attention"):
        unsaved += FP32 * h * (2 if shape.sandwich_norms else 1)  # the MLP norm (Gemma 2: and the post-attention one)
    if first > SOURCE_ORDER.index("mlp_norm"):
        unsaved += 3 * dt.compute * shape.intermediate_size
    return unsaved


def frozen_mlp_freed_per_token(dt: Dtypes, ad: Adapters) -> int:
    """What a block's down_proj adapters saved (their input, its dropout mask, ``x A``; DoRA: the base layer's and
    the adapter's outputs), a token: freed by their backward, which runs before the gated MLP's product rule, the
    peak of the block's backward (read op by op on the simulated step: 64-wide Mistral, fp32, s 1024, LoRA on
    down_proj: the adapter's input, 786,432 bytes, and ``x A``, 32,768, gone before the MLP's gradients)."""
    pairs = list(zip(ad.inputs, ad.dora_outputs or (None,) * len(ad.inputs)))
    down = [(fan_in, fan_out) for fan_in, fan_out in pairs if fan_in[1] == "mlp_act"]
    if not down:
        return 0
    outputs = tuple(fan_out for _, fan_out in down if fan_out is not None)
    return frozen_adapters_per_token(dt, validated_copy(ad, {"inputs": tuple(i for i, _ in down),
                                                              "dora_outputs": outputs}))



def frozen_recompute_end_per_token(shape: ActivationShape, dt: Dtypes, ad: Adapters) -> int:
    """Live a token as a checkpointed block of a frozen base with down_proj adapters stops its recomputation, beside
    the recomputed saved tensors. The last tensor the block's backward reads is ``x A`` of down_proj's adapter, so the
    recomputation stops inside that adapter (torch.utils.checkpoint ``_StopRecomputationError``) while the forward's
    frames still hold the MLP's input product ``act * up`` (compute dtype; the adapter's own saved input only when
    nothing casts or drops it), PEFT's copy of it in the adapter's fp32 (``_cast_input_dtype``) and its dropout
    output (fp32) where autocast casts, and five residual-wide tensors: the incoming residual gradient, the
    residual, the MLP norm's output, down_proj's base output and one more not singled out. Read on the simulated
    step (64-wide Mistral, LoRA r8 on down_proj, full checkpointing, s 1024, a bf16 base under autocast): beyond
    the estimate's kept and recomputed tensors 6 I + 10 h bytes a token without dropout and 10 I + 10 h with it
    (intermediate 192 and 256, within 20 bytes a token); there the block's backward peaks (-16.7% and -29.0%
    without this point). Below the MLP's point elsewhere (fp32, pure bf16: the product is the adapter's input).
    0 without a down_proj adapter (the recomputation stops earlier)."""
    if not any(source == "mlp_act" for _, source in ad.inputs):
        return 0
    h, I, cb = shape.hidden_size, shape.intermediate_size, dt.compute
    copies = dt.input_casts or dt.adapter is not None  # the adapter reads its own fp32 copy of the product
    product = 0 if not copies and not ad.dropout else cb * I
    casts = FP32 * I * (2 if ad.dropout else 1) if copies else 0
    return 5 * dt.residual * h + product + casts

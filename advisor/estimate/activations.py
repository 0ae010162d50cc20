"""Activation memory: the tensors autograd saves for backward, per micro-batch, from the
architecture; and the logits/loss transient at the start of backward.

Here: the shape the activation model reads from a spec (``shape_of``: which family's formula
applies, or what is assumed and said in ``ActivationShape.note``), the recipe's byte widths
(``Dtypes``), LoRA adapters (``Adapters``), and ``estimate_activations``, which composes one
micro-batch from the per-token formulas: per block and family (``activations_blocks.py``; MoE,
Mamba, Jamba, encoder-decoder and vision pieces in their own ``activations_*.py``), times layers,
with checkpointing, plus the loss path (``activations_loss.py``). Which kind a spec is and what each
kind contributes is one registry (``advisor.model.block_kinds``, ``advisor.estimate.activation_kinds``):
a new family is its module and its rows there; nothing here tests a family's facts fields.

A language model of another family (Llava's language model) is treated as a Llama-like decoder of
its own vocabulary, width and depth, and the shape says so (``ActivationShape.note``); a model
without token embeddings (ViT, ResNet, Wav2Vec2, CLIP, any ``nn.Module``) has no activation model:
its estimate counts model states only.

All functions are pure: integers in, integer bytes out.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from advisor.estimate.activation_kinds import activation_kind, row_of
from advisor.frozen import per_instance
from advisor.estimate.activations_blocks import (
    block_input_in_layer_per_token, cuda_math_sdpa_at, eager_backward_per_token, eager_masks_bytes,
    eager_remaining_per_token, frozen_adapters_per_token, frozen_decoder_layer_per_token, outside_norm_per_token,
    outside_to_embedding_per_token, rope_tables_per_token,
    selective_kept_per_token, window_mask_input_bytes,
)
from advisor.estimate.activations_frozen import first_block_unsaved_per_token, frozen_mlp_freed_per_token, frozen_recompute_end_per_token
from advisor.estimate.activations_loss import FUSED_KERNELS, head_loss_bytes, loss_bytes
from advisor.frozen import validated_copy
from advisor.model.block_kinds import activation_family  # noqa: F401 (re-exported: traced.py, planning.api)
from advisor.model.kinds import EncDecFacts, SsmFacts
from advisor.model.hybrid import HybridFacts
from advisor.model.heads import TaskHead
from advisor.model.moe import MlaFacts, MoeFacts
from advisor.model.spec import ModelSpec
from advisor.precision import FP32

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
    vocab_size: int = Field(ge=0, description="0: no token embeddings (family 'none').")
    family: str = Field(description="decoder (Llama-like), gpt2, bert, gpt_neox, mamba, encdec (T5, BART), or none (not modelled)")
    kind: str | None = Field(default=None, description="The block kind shape_of found (advisor.model.block_kinds); "
                             "None: a shape built by hand, read as its family's kind.")
    num_experts: int | None = None
    num_experts_per_token: int | None = None
    moe: MoeFacts | None = Field(default=None, description="Router kind, shared and dense layers (MoE).")
    mla: MlaFacts | None = Field(default=None, description="Multi-head latent attention (DeepSeek).")
    qk_norm: bool = Field(default=False, description="Per-head RMSNorm on q and k (Qwen3).")
    sliding_window: int | None = Field(default=None, description="Attention span of every layer (tokens); None: full.")
    attn_softcap: bool = Field(default=False, description="Soft-capped attention scores (Gemma 2; eager only).")
    logit_softcap: bool = Field(default=False, description="Soft-capped output logits (Gemma 2).")
    sandwich_norms: bool = Field(default=False, description="RMSNorms after attention and after the MLP too, "
                                 "in fp32 with (1 + weight) (Gemma 2: four a block).")
    fp32_norm_scale: bool = Field(default=False, description="The two RMSNorms a block and the final one scale by "
                                  "(1 + weight) in fp32 (Gemma): the normalised tensor is saved in fp32.")
    one_op_mlp_act: bool = Field(default=False, description="GPT-2 family: the MLP activation saves only its "
                                 "input (F.gelu); False: gelu_new's Python ops.")
    no_residual_dropout: bool = Field(default=False, description="GPT-2 family: resid_pdrop 0, the blocks' two "
                                      "dropouts save no mask.")
    no_embedding_dropout: bool = Field(default=False, description="GPT-2 family: embd_pdrop 0, the embeddings' "
                                       "dropout saves no mask.")
    eager_masks: int = Field(default=1, ge=1, description="b x s x s float masks eager attention is given.")
    sequential_residual: bool = Field(default=False, description="GPT-NeoX without the parallel residual: the "
                                      "second LayerNorm saves its own input (the attention output plus the residual).")
    fused_qkv: bool = Field(default=False, description="q, k and v are slices of one projection's output (Phi-3's "
                            "qkv_proj): v, a view, keeps that whole output saved.")
    ssm: SsmFacts | None = Field(default=None, description="Mamba mixer widths (family 'mamba').")
    encdec: EncDecFacts | None = Field(default=None, description="Encoder/decoder depths (family 'encdec').")
    hybrid: HybridFacts | None = Field(default=None, description="Attention / Mamba layer pattern (Jamba).")
    head: TaskHead | None = Field(default=None, description="Task head in place of the vocabulary's (decoder).")
    assumed: bool = Field(default=False, description="Some shape fields invented from the size.")
    note: str | None = Field(default=None, description="What is assumed or not modelled, for the user.")


class Dtypes(BaseModel):
    """Byte widths that decide activation sizes under a given recipe."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    residual: int = Field(description="Bytes of the residual stream (4 under autocast with fp32 weights).")
    compute: int = Field(description="Bytes of matmul outputs (2 for bf16/fp16).")
    input_casts: bool = Field(description="Each linear makes its own low-precision copy of an fp32 input.")
    buffer: int = Field(default=2, description="Bytes of a model buffer (BART's final_logits_bias): 4 unless the "
                        "engine casts the whole module (pure bf16, DeepSpeed); FSDP2 and autocast cast no buffer.")
    adapter: int | None = Field(default=None, description="Bytes of a LoRA adapter's own input copy and x A where the "
                                "adapters compute in their own fp32 without autocast (TrainingConfig.fp32_adapters: "
                                "PEFT casts each input to lora_A's dtype); None: the adapters compute in the compute "
                                "dtype.")
    mlp: int | None = Field(default=None, description="Bytes of a frozen block's gated-MLP gate, up and activation "
                            "outputs where they are not the compute dtype: 4 where bitsandbytes' 4-bit linears read "
                            "an fp32 norm output and return its dtype (QLoRA over fp32 norms, benchmarks/"
                            "qlora_layer_bytes.py); None: compute.")


class Adapters(BaseModel):
    """LoRA adapters on a frozen base, as the activation model needs them: the rank, whether
    dropout runs on their input, and each adapted linear's input width and source in one block
    (``advisor.model.lora.adapter_inputs``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(ge=1)
    dropout: bool
    inputs: tuple[tuple[int, str], ...] = Field(description="(in_features, source) per adapted linear in a block.")
    dora_outputs: tuple[int, ...] = Field(default=(), description="DoRA: out_features per adapted linear in a "
                                          "block (empty for plain LoRA).")


class ActivationEstimate(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    saved_bytes: int = Field(description="Saved for backward at the end of forward (all layers, or block inputs).")
    logits_bytes: int = Field(description="Logits, their fp32 copy and the log-softmax output at the end of forward.")
    loss_transient_bytes: int = Field(description="fp32 log-softmax output and its gradients at loss backward.")
    layer_bytes: int = Field(description="One block's saved tensors (what checkpointing recomputes).")
    recompute_bytes: int = Field(default=0, description="What a checkpointed block's backward recomputes: the "
                                 "whole block, less what selective checkpointing kept.")
    backward_temp_bytes: int = Field(description="Gradients alive inside one block's backward.")
    block_kept_bytes: int = Field(default=0, description="What one block's backward frees of saved_bytes (its input "
                                  "and kept tensors under checkpointing, its saved tensors without); 0: not known.")
    early_temp_bytes: int = Field(default=0, description="Live early in an MoE block's backward (its routing-weight "
                                  "product's, before any weight gradient of the block), beside in_backward_early.")
    late_temp_bytes: int = Field(default=0, description="Live late in a block's backward (its attention's input "
                                 "projections), beside its input: the gradients passing through there; 0: not known.")
    outside_freed_bytes: int = Field(default=0, description="Part of saved_bytes gone before any block's backward: "
                                     "the labels and the final norm's tensors (their backward runs first).")
    mlp_freed_bytes: int = Field(default=0, description="Part of one block's saved tensors its backward has freed by "
                                 "the MLP's peak: a frozen base's down_proj adapters' (their backward runs first); "
                                 "Gemma 2's sandwich norm's where they exceed the MLP's gradients (a narrow TP rank).")
    recompute_end_bytes: int = Field(default=0, description="Live as a checkpointed block's recomputation stops, beside "
                                     "its recomputed tensors (the residual gradient, the forward's locals); 0: no such "
                                     "point (``activations_frozen.frozen_recompute_end_per_token``).")
    returned_logits_bytes: int = Field(description="The low-precision logits alone (what a model returns).")
    offloaded_bytes: int = Field(default=0, description="Saved for backward in CPU memory, not in saved_bytes: every "
                                 "block's offloaded tensors (``activation_offload``); 0: none offloaded.")


@per_instance
def shape_of(spec: ModelSpec) -> ActivationShape:
    """The spec's own shape; for a bare size an assumed Llama-like one; for a language model of a
    family with no formula, a Llama-like decoder of its own vocabulary, width and depth; for a
    model without token embeddings, no activation model (family 'none'). ``note`` says which: all of it
    read from the spec's block kind (``advisor.estimate.activation_kinds``)."""
    row = activation_kind(spec)
    return ActivationShape(**row.shape(spec), kind=row.name, note=row.note(spec))


def _eager_attention_backward(shape: ActivationShape, dt: Dtypes, adapters: Adapters | None, *, seq_len: int,
                              layer_per_token: int, outside_per_token: int, checkpointing: bool) -> int | None:
    """A Llama-style block's eager softmax backward, beyond its saved tensors, a token
    (``activations_blocks.eager_backward_per_token``); None for blocks it does not describe (latent
    attention, Jamba's layers, the other families). By then the final norm, the head's input and the
    labels (``outside_per_token``, less the token ids and the RoPE tables the blocks still read) were
    freed by their backward; under checkpointing a block's fp32 input is the tensor the checkpoint kept
    (counted once, in ``saved_bytes``), which the recomputed norm reads instead of a copy of its own."""
    row = row_of(shape)
    if not row.eager_softmax(shape):
        return None
    if row.eager_remaining is not None:  # a block of its own kind (BERT's)
        return eager_backward_per_token(shape, dt, seq_len=seq_len, layer=layer_per_token,
                                        remaining=row.eager_remaining(shape, dt, seq_len=seq_len))
    remaining = eager_remaining_per_token(shape, dt, seq_len=seq_len, frozen=adapters is not None)
    if checkpointing and dt.residual == FP32:
        remaining -= FP32 * shape.hidden_size
    remaining -= outside_per_token - INT64 - 2 * dt.residual * shape.head_dim
    if adapters is not None:  # the LoRA adapters on q, k and v keep their inputs until their backward,
        # and DoRA's base and adapter outputs of q, k and v (read on the simulated step, sweep b88491b6efc6:
        # 384-wide Llama, fp32 GQA, DoRA all-linear, checkpointed; 4,608 bytes a token missing without them)
        pairs = zip(adapters.inputs, adapters.dora_outputs or (None,) * len(adapters.inputs))
        qkv = [(fan_in, fan_out) for fan_in, fan_out in pairs if fan_in[1] == "attn_norm"]
        first = validated_copy(adapters, {"inputs": tuple(i for i, _ in qkv),
                                          "dora_outputs": tuple(o for _, o in qkv if o is not None)})
        remaining += frozen_adapters_per_token(dt, first, eager=True)
    return eager_backward_per_token(shape, dt, seq_len=seq_len, layer=layer_per_token, remaining=remaining)


def estimate_activations(
    shape: ActivationShape, dt: Dtypes, *, micro_batch_size: int, seq_len: int, checkpointing: bool, eager: bool,
    adapters: Adapters | None = None, loss_kernel: str = "hf", selective: bool = False, kept_width: int = 0,
    kept_tail_width: int = 0, kept_elements: int = 0, target_len: int | None = None, head_grads: bool = True, head_frozen: bool | None = None,
    head_bytes: int | None = None,
) -> ActivationEstimate:
    """Saved activations of one micro-batch at the end of forward, and the loss transient.
    ``kept_width``: the output features of the matrix products selective checkpointing keeps in a block;
    ``kept_tail_width``: those of them past the last tensor the block's backward reads (Llama's
    ``down_proj``), which the recomputation never reaches and so never hands back; ``kept_elements``: the
    kept products that do not grow with the tokens (DoRA's weight products, ``advisor.model.selective``).
    ``head_grads``: count the chunked loss's per-chunk head gradients (``loss_bytes``) when the head
    trains; False leaves them out (a vocabulary-sharded TP head, not checked against the simulator).
    ``adapters``: LoRA on a frozen base (Llama-like dense decoders; BERT's block, ``ActivationKind.frozen_layer``; T5
    and BART in their own module, ``activations_encdec``; other families keep the full fine-tune count, an
    overestimate, and the plan says so)."""
    row = row_of(shape)
    if row.whole is not None:  # composed apart: the encoder-decoder's two stacks, or no activation model
        return ActivationEstimate(**row.whole(shape, dt, micro_batch_size=micro_batch_size, seq_len=seq_len,
                                              target_len=target_len, checkpointing=checkpointing, eager=eager,
                                              adapters=adapters))
    tokens = micro_batch_size * seq_len
    h, vocab = shape.hidden_size, shape.vocab_size
    frozen = adapters is not None and row.frozen_base
    # eager attention, or SDPA where CUDA runs its math kernel: scores saved and a softmax backward
    math_attention = eager or cuda_math_sdpa_at(shape, dt, seq_len=seq_len)
    if frozen:
        layer = tokens * frozen_decoder_layer_per_token(shape, dt, adapters, seq_len=seq_len,
                                                        eager=math_attention)
        # Frozen embedding, final norm and head: only the labels (nll_loss) and the RoPE tables stay,
        # and the final norm's fp32 input (its input gradient), which the final norm's backward frees before
        # any block's (read op by op on the simulated step: 64-wide Mistral, fp32, LoRA on q, v or down_proj).
        outside = tokens * (INT64 + FP32 * h + 2 * dt.residual * shape.head_dim)
        to_embedding = tokens * (INT64 + 2 * dt.residual * shape.head_dim)
        frozen = True
    else:
        layer = tokens * (row.layer(shape, dt, seq_len=seq_len, eager=eager) if adapters is None or row.frozen_layer is None
                          else row.frozen_layer(shape, dt, adapters, seq_len=seq_len, eager=eager))
        # Outside the blocks: token ids (embedding backward) and the shifted int64 labels (nll_loss),
        # the final norm and the head's input (its autocast cast, or the norm output).
        outside = tokens * (2 * INT64 + outside_norm_per_token(shape, dt))
        to_embedding = tokens * (INT64 + outside_to_embedding_per_token(shape, dt))
    # The memory model frees ``outside - to_embedding`` before any block's backward (``outside_freed_bytes``);
    # the eager softmax moment discounts only what a frozen base's count frees there (its to_embedding is outside).
    attention_backward = _eager_attention_backward(
        shape, dt, adapters if frozen else None, seq_len=seq_len, layer_per_token=layer // tokens,
        outside_per_token=to_embedding // tokens, checkpointing=checkpointing) if math_attention else None
    shared = (tokens - seq_len) * rope_tables_per_token(shape, dt)  # one RoPE table pair a micro-batch, not a sample
    outside, to_embedding = outside - shared, to_embedding - shared
    if loss_kernel in FUSED_KERNELS and shape.family == "decoder" and dt.input_casts and not frozen \
            and shape.head is None:
        outside -= tokens * dt.compute * h  # the fused kernel reads the head's input with autocast off, a chunk at a
        # time: no autocast cast of it is saved (read on the simulated step, sweep b86536f72b68 as fused: none there)
    # all blocks: Jamba's layers each as its kind is, an MoE stack's dense layers and router weight copy
    layers_total, layer = (shape.num_layers * layer, layer) if row.layers is None else row.layers(
        shape, dt, tokens, layer, seq_len=seq_len, eager=eager)
    if checkpointing:
        # Non-reentrant checkpointing keeps each block's input; one block is recomputed at a time
        # in backward (``layer_bytes``, added by the memory model at that moment, not here). Under
        # selective checkpointing the recomputation takes the kept tensors back and drops those backward
        # does not read (q, o), except the ones past its early stop (torch.utils.checkpoint
        # ``_StopRecomputationError``: it ends at the last tensor backward reads), which stay kept.
        if selective and row.kept_width is not None and not kept_width:  # an MoE block's
            kept_width = row.kept_width(shape)
        kept = selective_kept_per_token(shape, dt, kept_width) if selective else 0
        if selective and attention_backward is not None:  # eager runs no attention kernel op to keep (its
            # products are bmm, not mm): only the linears' outputs are kept (wrappers.checkpointing)
            kept -= dt.compute * shape.num_attention_heads * shape.head_dim + FP32 * shape.num_attention_heads
        # SDPA's boolean window mask is every block's input too; eager's masks are whole, counted below
        mask = 0 if eager else window_mask_input_bytes(shape, seq_len=seq_len)
        # DoRA's kept weight products: held from forward through the block's backward (measured on the simulated
        # step: the recomputation hands none back; all-linear and q + down_proj, s 1024 and 2048)
        fixed = dt.compute * kept_elements if selective else 0
        block_kept = tokens * (dt.residual * h + kept) + fixed
        saved = shape.num_layers * block_kept + outside + mask
        recompute = layer - tokens * (kept + block_input_in_layer_per_token(shape, dt))
        recompute += tokens * dt.compute * kept_tail_width if selective else 0
        if eager:  # the blocks' recomputation reads the masks: kept to the end
            saved += eager_masks_bytes(shape, dt, micro_batch_size=micro_batch_size, seq_len=seq_len)
    else:
        saved, recompute, block_kept = layers_total + outside, 0, layer
        if frozen:  # the first block reads the frozen embedding's output, which needs no gradient: nothing before
            # its first adapter saves (its RMSNorm no fp32 input; measured: saved_tensors_hooks, PEFT 0.21)
            saved -= tokens * first_block_unsaved_per_token(shape, dt, adapters, seq_len=seq_len,
                                                            eager=math_attention)
    logits, loss = loss_bytes(loss_kernel, tokens=tokens, vocab=vocab, hidden=h, dt=dt,
                              head_trains=head_grads and adapters is None,
                              head_frozen=adapters is not None if head_frozen is None else head_frozen,
                              head_bytes=head_bytes)
    if shape.family == "decoder" and dt.input_casts and not frozen:  # the final norm's output: the model's forward
        # holds it while the loss runs, and under autocast no linear saves it (the head saves its cast). Read on the
        # simulated step (sweep b86536f72b68, bf16-mixed, hf, chunked and fused): 4 x 128 bytes a token more at the end
        logits += tokens * dt.residual * h  # of forward than the norm's saved tensors
    if shape.family == "decoder" and shape.head is None and frozen:
        # A frozen base's final RMSNorm backward, right after the loss's, beside every saved tensor: its fp32 path
        # (``x.float()``, ``x * rsqrt``) runs backward in fp32, five tensors of tokens x hidden at its peak (the
        # incoming gradient's fp32 cast, the product rule's two, mean's expanded gradient, pow's). It decides where the
        # loss's own backward is small (the fused kernel: sweep caf386ea0056, a LoRA Qwen2, bf16, s 8192, was -3.77%
        # at the top block, -0.04% with it; bf16-mixed and DDP alike). A full fine-tune's step peaks elsewhere there
        # (the same job without LoRA: +1.2% with it, so not counted).
        loss = max(loss, 5 * tokens * FP32 * h)
    task = None if shape.head is None else head_loss_bytes(
        shape.head, micro_batch_size=micro_batch_size, seq_len=seq_len, hidden=h, dt=dt, frozen=frozen)
    if task is not None:  # a task head in place of the vocabulary's (advisor.model.heads)
        # what the head keeps (its input, a dropout mask) is freed by the head's backward, before any block's
        logits, loss, saved, outside = task.forward_end, task.backward, saved + task.saved, outside + task.saved
    elif shape.logit_softcap and loss_kernel == "hf":
        # Gemma 2's head: tanh(logits / cap) is saved (tanh's backward reads its output) until the loss's
        # gradient reaches it. Measured: +33,554,432 bytes = 2048 tokens x 8192 x 2 (bf16-mixed).
        logits, loss = logits + tokens * vocab * dt.compute, loss + tokens * vocab * dt.compute
    # Inside a block's backward, at its peak (the gated MLP's product rule): the incoming residual gradient
    # and the MLP's gradients w.r.t. its two widest intermediates, the product's own input gradient and
    # down_proj's saved input freed. Measured on the simulated step, op by op (a 256-wide Qwen2 block at
    # s 1024, bf16: 3,200 bytes a token over the recomputed block, tests/estimate/test_block_backward.py).
    # The outgoing residual gradient is made later, once the MLP's tensors are gone.
    # GPT-NeoX's F.gelu MLP has no product: its peak is gelu's input gradient beside the output's, fc2's
    # saved input freed (measured: 384-wide fp32 block, 1,536 + 6,144 bytes a token over the recomputed block).
    # A frozen base's down_proj saves no input, so nothing of the block's count is freed at that op: one residual
    # gradient and three intermediate-wide gradients beside the whole block (read op by op on the simulated step:
    # 64-wide Mistral, fp32, s 1024, LoRA on q and v; a 256-wide Qwen3 over a bf16 base, s 4096, showed the same
    # three gradients), less what down_proj's adapters saved, freed by their backward first (``mlp_freed_bytes``).
    # GPT-2 with a one-op activation ('gelu') runs GPT-NeoX's fc1 / F.gelu / fc2 sequence: the same one gradient.
    # GPT-2's gelu_new under autocast: pow's fp32 input makes the chain after it fp32 (the final mul promotes), so
    # its backward's product rule holds fp32 gradients of the MLP's width: three fp32 tensors (the incoming one cast
    # up and the two factors') without checkpointing, two fp32 and one in the compute dtype under it. Read on the
    # simulated step: 822b1090a834 (512-wide, fp16-mixed, s 1024) -5.2% with two in fp16, +0.2% with three fp32;
    # e833a91921f9 (checkpointed, bf16-mixed, mb 8) -13.2% with two in bf16, +5.1% with three fp32, +0.5% with
    # 2 x 4 + 2 bytes (mb 1: +0.2%). fp32 and pure bf16 steps were exact with two in the compute dtype.
    one_op = row.one_op_mlp(shape)
    wide = 1 if one_op else 3 if frozen else 2
    widened = shape.family == "gpt2" and not one_op and dt.input_casts and dt.compute != FP32 and not frozen
    width_bytes = wide * ((dt.mlp or dt.compute) if frozen else dt.compute)
    if widened:
        width_bytes = 2 * FP32 + (dt.compute if checkpointing else FP32)
    backward_temp = tokens * (dt.residual * h + width_bytes * shape.intermediate_size)
    early = 0
    if row.backward is not None:  # an MoE MLP: its experts' and its routing product's backward
        backward_temp, early = row.backward(shape, dt, tokens, checkpointing=checkpointing)
    mlp_freed = tokens * frozen_mlp_freed_per_token(dt, adapters) if frozen else 0
    recompute_end = tokens * frozen_recompute_end_per_token(shape, dt, adapters) if frozen and checkpointing else 0
    if shape.sandwich_norms:  # Gemma 2: the norm after the MLP ran its backward first, freeing its fp32 input
        backward_temp -= tokens * FP32 * h * (1 if frozen else 2)  # and normalised tensor (a frozen weight: none)
    if attention_backward is not None:  # or eager attention's softmax backward, if it holds more. The memory model
        # takes ``mlp_freed`` (down_proj's adapter tensors) off this point, but the softmax backward's count keeps only
        # what the block still holds (``remaining``), which has none of the MLP's: added back here, so that point is
        # the recomputed block + this (sweep b88491b6efc6: DoRA all-linear, fp32 GQA, 8,688 bytes a token short).
        backward_temp = max(backward_temp, tokens * attention_backward + mlp_freed)
    if eager and not checkpointing:  # the model's forward holds the eager masks through
        # its final norm; the logits come after it returns (the forward's peak beyond what is saved, as traced.py)
        logits = max(logits, eager_masks_bytes(shape, dt, micro_batch_size=micro_batch_size, seq_len=seq_len))
    returned = tokens * vocab * dt.compute if loss_kernel == "hf" else 0
    # Late in a block's backward (the input projections of its attention), where the block's weight gradients
    # all exist: the residual gradient, the attention norm's output, q's gradient and the input gradients of
    # q, k and v being summed (measured on the simulated step: Mistral, 384 wide, fp32, s 128: six widths).
    late = tokens * h * (dt.residual + 5 * dt.compute) if shape.family == "decoder" else 0
    returned = returned if task is None else task.returned
    if backward_temp < 0:  # Gemma 2's sandwich norm frees more of the recomputed block than the MLP's gradients take
        # (a TP rank's share of a narrow MLP: Gemma-2-2B at tp 4); the point's sum is the same, the excess comes off
        # the block's count as down_proj's freed adapter tensors do
        mlp_freed, backward_temp = mlp_freed - backward_temp, 0
    return ActivationEstimate(saved_bytes=saved, logits_bytes=logits, loss_transient_bytes=loss, layer_bytes=layer,
                              backward_temp_bytes=backward_temp, returned_logits_bytes=returned, late_temp_bytes=late,
                              recompute_bytes=max(0, recompute), outside_freed_bytes=outside - to_embedding,
                              early_temp_bytes=early,
                              block_kept_bytes=block_kept, mlp_freed_bytes=mlp_freed,
                              recompute_end_bytes=recompute_end)

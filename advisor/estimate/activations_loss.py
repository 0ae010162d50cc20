"""The loss path's memory beyond the saved activations: the logits, their fp32 copy and the
log-softmax at the end of forward, and what loss backward holds, for each loss kernel (``--loss``:
transformers' ForCausalLMLoss, ``wrappers.losses.chunked_cross_entropy`` and
``wrappers.losses.fused_linear_cross_entropy``), and a task head's in its place (``head_loss_bytes``).
Pure function, integer bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from advisor.precision import FP32

if TYPE_CHECKING:
    from advisor.estimate.activations import Dtypes
    from advisor.model.heads import TaskHead

LOSS_CHUNKS = 8  # wrappers.losses.CHUNKS
# The fused linear cross-entropies: wrappers.losses' kernel, and Liger's, which accumulates in place (loss_bytes).
FUSED_KERNELS = ("fused", "fused_in_place")


def loss_bytes(kernel: str, *, tokens: int, vocab: int, hidden: int, dt: Dtypes,
               head_trains: bool = True, head_frozen: bool = False, head_bytes: int | None = None) -> tuple[int, int]:
    """(end of forward, loss backward) bytes of the loss path beyond the saved activations. ``head_bytes``: a
    trained head's dtype where it is not the residual's (a copy cast to the compute dtype); None: the residual's.

    hf (transformers' ForCausalLMLoss): the forward ends with the low-precision logits, their fp32
    copy and the saved log-softmax output, 2 + 4 + 4 bytes per logit (the loop keeps only the loss,
    so the logits are freed before backward; in fp32 ``.float()`` returns them, no copy); loss backward holds the saved log-softmax output, the
    NLL gradient and log_softmax_backward's output, all fp32 (aten derivatives.yaml: log_softmax
    saves ``result``). chunked (``wrappers.losses.chunked_cross_entropy``): each chunk's logits and
    their fp32 copy die with the chunk, only the fp32 log-softmax of every chunk is kept: the forward ends with
    the last chunk's fp32 logits beside every chunk's log-softmax (its low-precision logits were freed as
    ``.float()`` returned, before the log-softmax; in fp32 the logits are the copy. Read on the simulated step,
    sweep b86536f72b68: 11,010,048 + 1,376,256 bytes, 256 tokens x 1,344 x 4 of them the chunk); backward
    adds one chunk's two fp32 gradients and its low-precision one. fused
    (``wrappers.losses.fused_linear_cross_entropy``, Liger's algorithm): one chunk's logits at a time
    (fp32, softmax in place; under autocast also a low-precision copy of the fp32 head) while the forward
    computes the input gradient (residual dtype) and the head's gradient (an fp32 accumulator, then the
    head's dtype), which are kept for backward; backward makes a scaled copy of each. Beside one chunk's
    fp32 logits the loop holds a second chunk-sized tensor: ``torch.logsumexp`` (one aten op,
    ``CompositeExplicitAutograd``: aten/src/ATen/native/ReduceOps.cpp ``logsumexp_out_impl``, the same
    code on CUDA) allocates ``self - maxes``, fp32 and as large as the chunk (measured on real CPU tensors,
    tests/estimate/test_loss_fused.py; the simulator allocates it too: ``advisor.simulate.fake_env.
    kernel_scratch``), in every precision; in low precision the matmul's output before ``.float()`` and the
    softmax's ``.to(compute)`` before its product with the head are smaller (compute bytes a logit), the
    latter beside that product's rows. Under autocast over an fp32 residual, also the chunk's
    low-precision input.
    fused_in_place (Liger's kernel, ``Recipe.fused_loss_in_place``): the same loop, but the head's gradient
    accumulates in the head's own dtype (``torch.zeros_like(weight)``, ``addmm`` in place) and is the tensor kept,
    and backward scales the kept gradients in place: no fp32 accumulator, no copy, one kept set in backward.
    ``head_frozen`` (a frozen base: LoRA): the head's weight needs no gradient, so the kernel makes no fp32
    accumulator, no copy of it in the head's dtype and keeps none for backward (``ctx.needs_input_grad``); what
    is left is the input gradient and the chunk's tensors.

    chunked, when the head trains (``head_trains``, not ``head_frozen``): its weight is used once per chunk, so backward
    sums one head-sized gradient per chunk (compute dtype: the autocast cast of the weight is cached,
    FSDP2's unsharded parameter is in the compute dtype). At the second chunk's head backward autograd
    holds the first gradient, the second and their sum (``InputBuffer::accumulate``, out of place),
    while the log-softmax of the two chunks done is freed: ``all chunks - 2 chunks + 3 x head`` fp32
    and compute bytes, measured by the simulator (``tests/estimate/test_loss_chunked.py``).

    A head bias (Phi, GPT-J, CodeGen: ``wrappers.losses`` adds it to each chunk's logits) adds only
    vocabulary-sized tensors: fused, its fp32 gradient accumulator in the loop and its copy in the head's
    dtype kept for backward (and the scaled copy there); chunked, one chunk's bias gradient beside each
    head-sized one. Not counted here: no formula family's head has a bias (``profiles/architectures.json``),
    and a traced family's profile (``advisor.estimate.traced``) is measured with the kernel running, bias
    included; ``_loss_bend``'s line through the traced batches carries these constant terms unchanged
    (a Phi at micro-batch 4: fused +0.16%, chunked +0.03% of the simulated step,
    tests/estimate/test_loss_kernels_traced.py)."""
    per_chunk = -(-tokens // LOSS_CHUNKS) * vocab
    if kernel in CHUNKED_NLL_KERNELS:
        return chunked_nll_bytes(kernel, tokens=tokens, vocab=vocab, hidden=hidden, dt=dt,
                                 head_trains=head_trains and not head_frozen, head_bytes=head_bytes)
    if kernel in CHUNKED_KERNELS:
        return chunked_loss_bytes(kernel, tokens=tokens, vocab=vocab, hidden=hidden, dt=dt,
                                  head_grads=head_trains and not head_frozen and tokens >= 2)
    if kernel in FUSED_KERNELS:
        in_place = kernel == "fused_in_place"
        head = 0 if head_frozen else vocab * hidden  # the head's gradient; its low-precision copy is made either way
        grad_input = tokens * hidden * dt.residual
        # Each chunk: its fp32 logits beside logsumexp's ``self - maxes`` (fp32, as large), or beside the
        # softmax's low-precision copy and the rows of its product with the head, whichever is larger; and,
        # cast from a wider residual, the chunk's input throughout.
        rows = -(-tokens // LOSS_CHUNKS) * hidden * dt.compute
        copy = dt.compute if dt.compute != FP32 else 0
        chunk = max(per_chunk * 2 * FP32, per_chunk * (FP32 + copy) + rows)
        head_dtype = dt.residual if head_bytes is None else head_bytes
        accumulator = head * (head_dtype if in_place else FP32)  # Liger: zeros_like(weight); ours: fp32
        in_loop = grad_input + accumulator + chunk + (rows if dt.residual != dt.compute else 0)
        if dt.input_casts and dt.residual != dt.compute:  # autocast over an fp32 head: one low-precision copy of
            # it for the chunks; over LoRA's bf16 base (a bf16 residual) the head is bf16 and ``weight.to`` returns it
            in_loop += vocab * hidden * dt.compute
        # After the loop the accumulator becomes the head's dtype (a copy unless that is fp32).
        if in_place:  # the accumulator is the gradient kept; backward scales it and the input's in place
            kept = grad_input + accumulator
            return max(in_loop, kept), kept
        at_end = grad_input + head * FP32 + (head * dt.residual if dt.residual != FP32 else 0)
        kept = grad_input + head * dt.residual
        return max(in_loop, at_end), 2 * kept
    if kernel == "compiled":
        return compiled_loss_bytes(tokens=tokens, vocab=vocab, dt=dt)
    # The fp32 copy (``logits.float()``) is the logits themselves when they are fp32 already.
    copy = FP32 if dt.compute != FP32 else 0
    return tokens * vocab * (dt.compute + copy + FP32), tokens * vocab * 3 * FP32


# The chunked cross-entropies: ``chunked`` is wrappers.losses.chunked_cross_entropy run eager (each chunk's
# logits made in the loss); ``_held`` the model returns every chunk's logits first (torchtune's
# CEWithChunkedOutputLoss); ``_compiled`` each chunk's cross-entropy under torch.compile (a stack's own chunked
# loss with ``Recipe.compile_loss``: torchtune's compile_loss).
CHUNKED_KERNELS = ("chunked", "chunked_held", "chunked_compiled", "chunked_compiled_held")


def chunked_loss_bytes(kernel: str, *, tokens: int, vocab: int, hidden: int, dt: "Dtypes",
                       head_grads: bool) -> tuple[int, int]:
    """(end of forward, loss backward) bytes of a chunked cross-entropy (``CHUNKED_KERNELS``) beyond the saved
    activations; ``head_grads``: the head trains, so backward sums one head-sized gradient per chunk.

    Eager (``chunked``, ``loss_bytes``' docstring): the forward ends with every chunk's fp32 log-softmax beside
    the last chunk's fp32 logits; with the logits made by the model (``_held``) every chunk's low-precision logits
    are live too until the loss returns (the loop drops them before backward: nothing saved them, ``.float()``'s
    backward needs no input). Compiled: inductor fuses the upcast, log-softmax and NLL of a chunk into row
    reductions (``compiled_loss_bytes``), so each chunk keeps its low-precision logits and two fp32 values a token
    for backward, nothing fp32 as large. Its backward writes the chunk's gradient in the logits' dtype: beside the
    chunk's saved logits where the model made them (graph inputs), into their buffer where the compiled graph
    made them itself (``chunked_compiled``: the projection inside). With the head training, the second chunk's
    head backward holds the first chunk's weight gradient, its own and their sum beside what the chunks not yet
    done keep, or only two of them (inside the compiled graph, whose first chunk also holds its weight gradient
    beside every chunk's logits). With the logits made by the model, every chunk's cross-entropy backward runs
    before any head backward (autograd takes the later-made nodes first), so the head's moment holds the chunks'
    gradients in the logits' dtype, not their log-softmax.

    Measured on real CPU tensors with the profiler's allocation records, forward and backward of each form
    (``python benchmarks/chunked_loss_bytes.py``: 1,024 tokens, vocabularies 2,048-8,192, widths 64-2,048, bf16,
    the head frozen and training; tests/estimate/test_chunked_loss_bytes.py): the eager forms to 40 bytes at the
    forward's peak, every backward and the compiled forwards above these by at most the hidden-state chunks'
    gradients (2 x tokens x width x 2 bytes, counted on the blocks' side) and 1% of the logits."""
    per_chunk = -(-tokens // LOSS_CHUNKS) * vocab
    logits, stats, head = tokens * vocab, tokens * 2 * FP32, vocab * hidden * dt.compute
    if kernel in ("chunked", "chunked_held"):
        forward = logits * FP32 + per_chunk * FP32
        if kernel == "chunked_held":  # the model's low-precision logits; in fp32 they are the chunk's logits
            forward += logits * dt.compute - (per_chunk * FP32 if dt.compute == FP32 else 0)
        backward = logits * FP32 + per_chunk * 2 * FP32
        if head_grads:  # held: every chunk's cross-entropy backward runs before any head backward (made later, so
            # first in autograd's order), leaving each chunk's gradient in the logits' dtype, not its log-softmax
            width = dt.compute if kernel == "chunked_held" else FP32
            backward = max(backward, (logits - 2 * per_chunk) * width + 3 * head)
        return forward, backward
    forward = logits * dt.compute + stats
    if kernel == "chunked_compiled_held":
        backward = forward + per_chunk * dt.compute
        if head_grads:
            backward = max(backward, forward - 2 * per_chunk * dt.compute + 3 * head)
        return forward, backward
    backward = forward
    if head_grads:  # the first chunk's weight gradient beside every chunk's logits, or two of them a chunk later
        backward = max(forward + head, forward - per_chunk * dt.compute + 2 * head)
    return forward, backward


# TRL's SFTTrainer loss_type "chunked_nll" (``Recipe.chunked_logits`` "checkpointed"): run under the Trainer's autocast
# (accelerate's native_amp: the torch engine under a mixed precision) or without (DeepSpeed, pure bf16, fp32).
CHUNKED_NLL_KERNELS = ("chunked_nll", "chunked_nll_autocast")
NLL_CHUNK = 256  # trl/trainer/sft_trainer.py _CHUNKED_LM_HEAD_CHUNK_SIZE


def chunked_nll_bytes(kernel: str, *, tokens: int, vocab: int, hidden: int, dt: "Dtypes", head_trains: bool,
                      head_bytes: int | None = None) -> tuple[int, int]:
    """(loss forward's peak, loss backward's peak) bytes beyond the saved activations of TRL's chunked_nll
    (trl/trainer/sft_trainer.py ``_chunked_cross_entropy_loss`` and ``_chunk``, huggingface/trl@f2cd577): the valid
    tokens reordered into one copy of the hidden states (``hidden[order]``, kept for backward: every chunk's
    checkpoint saves its slice), then per 256-token chunk under ``torch.utils.checkpoint`` (non-reentrant)
    ``logits = hidden.float() @ weight.float().t()``, their log-softmax, NLL, argmax and entropy, so a chunk's
    tensors live only while it runs, in forward and again in backward's recomputation. ``head_bytes``: the head
    weight's dtype as the kernel reads it where it is not the residual's (a QLoRA base's bf16 head under fp32 norms).

    Per chunk (c tokens, vocabulary V, width H, w the weight's dtype at the matmul: the compute dtype under
    autocast, else fp32; L the logits' dtype, the same): ``weight.float()`` copies a 16-bit head to fp32 (4VH) and
    autocast casts an fp32 weight (the head itself or that copy) to bf16 (2VH): the weight is read through its
    transpose, a view, which autocast never caches; the hidden chunk likewise (4cH where it is 16-bit, 2cH under
    autocast). Forward's peak is the matmul (those copies and cV L) or the entropy (the logits, the log-softmax,
    its exponential and their product: cV (L + 12)). Backward recomputes each chunk: a frozen head holds the
    matmul's saved copy of the weight beside the chunk's fp32 tensors, or the recomputed matmul; a trained head
    adds its gradient's chain through the copies (the matmul's weight gradient beside its saved weight, then each
    cast's backward: 2VH to 4VH under autocast, 4VH to the head's dtype after ``.float()``) beside the running sum
    of the chunks' head gradients in autograd's input buffer (the head's dtype; every chunk's gradient reaches the
    head's one ``AccumulateGrad``), and from the second chunk that sum made out of place (3 x the head).

    Measured on real CPU tensors with the profiler's allocation records under CUDA's autocast op list
    (``python benchmarks/trl_chunked_loss_bytes.py --rows``; tests/estimate/test_trl_chunked_loss.py): the fp32
    head under autocast (a full fine-tune on DDP), a bf16 head under autocast (FSDP2's unsharded parameters; a bf16
    LoRA base, frozen), a bf16 head without autocast (pure bf16, DeepSpeed) and fp32 throughout, training and
    frozen. Not counted here: the hidden states' gradient (the blocks' side counts it), FSDP2's ``full_tensor()`` of a
    head sharded as its own unit (the planned stacks' root unit holds the head unsharded while the loss runs),
    DeepSpeed ZeRO-3's gather of the head per chunk (its memory counted as the head's gather at the loss, its time by
    ``step_time.chunked_head_gather_s``)."""
    autocast = kernel == "chunked_nll_autocast"
    chunk, chunks = min(tokens, NLL_CHUNK), -(-tokens // NLL_CHUNK)
    cv, ch, vh = chunk * vocab, chunk * hidden, vocab * hidden
    head = dt.residual if head_bytes is None else head_bytes
    logit = dt.compute if autocast else FP32
    float_copy = FP32 if head != FP32 else 0  # weight.float()
    cast = dt.compute if autocast else 0  # autocast's copy of the fp32 weight (or of that copy) for the matmul
    weight_copy = cast or float_copy  # the copy the matmul saves for its backward
    hidden_copies = (FP32 if dt.residual != FP32 else 0) + cast
    reordered = tokens * hidden * dt.residual
    matmul = vh * (float_copy + cast) + ch * hidden_copies + cv * logit
    entropy = cv * (logit + 3 * FP32)
    forward = reordered + max(matmul, entropy)
    saved_weight = vh * weight_copy + entropy
    if not head_trains:
        return forward, reordered + max(matmul, saved_weight)
    running = vh * head if chunks > 1 else 0
    w = dt.compute if autocast else FP32
    chunk_grads = cv * logit + ch * hidden_copies
    moments = [vh * (weight_copy + w) + chunk_grads + ch * w]  # the matmul's backward
    if autocast:
        moments.append(vh * (w + FP32))  # autocast's cast backward: the bf16 gradient to fp32
    if float_copy:
        moments.append(vh * (FP32 + head) + chunk_grads)  # .float()'s backward: to the head's dtype
    heads = running + max(moments)
    if chunks > 1:  # the running sum, the chunk's gradient and their out-of-place sum
        heads = max(heads, 3 * vh * head + ch * (hidden_copies + w))
    return forward, reordered + max(heads, running + max(matmul, saved_weight))


def compiled_loss_bytes(*, tokens: int, vocab: int, dt: "Dtypes") -> tuple[int, int]:
    """(end of forward, loss backward) bytes of ``F.cross_entropy(logits.float(), labels)`` under ``torch.compile``
    (a stack whose recipe compiles the loss: ``Recipe.compile_loss``): inductor fuses the upcast, the log-softmax
    and the NLL into row reductions, so the forward allocates only two fp32 values a token (the row max and the
    log of the sum of exponentials), which it saves with the logits themselves (the partitioner saves its input
    rather than an fp32 copy); backward recomputes the softmax from them in one kernel that writes the logits'
    gradient in their own dtype. Read in inductor's generated code (CPU backend, torch 2.13; benchmarks/
    compile_loss.py): forward buffers (N, 1) fp32 x 2 and the scalar loss, saved (logits, labels, max, log);
    backward buffers (N, 1) fp32 and the (N, V) gradient in the logits' dtype, no (N, V) fp32 tensor. So the end of
    forward holds the low-precision logits and 8 bytes a token, the loss backward the logits and their gradient."""
    stats = tokens * 2 * FP32
    return tokens * vocab * dt.compute + stats, 2 * tokens * vocab * dt.compute + stats


def loss_kept_bytes(kernel: str, *, tokens: int, vocab: int, hidden: int, dt: "Dtypes",
                    head_frozen: bool = False) -> int:
    """What the loss path keeps for its backward once the forward has returned the loss (``loss_bytes``'
    kernels): hf and chunked the fp32 log-softmax output of every logit; fused the input gradient and the
    head's gradient its forward computed (none for a frozen head: ``loss_bytes``); TRL's chunked_nll the reordered
    hidden states its checkpoints saved (``chunked_nll_bytes``). A pipeline's last stage
    computes the loss in each micro-batch's forward, so each of its micro-batches in flight keeps this until its
    backward."""
    if kernel in FUSED_KERNELS:
        return tokens * hidden * dt.residual + (0 if head_frozen else vocab * hidden * dt.residual)
    if kernel == "compiled":  # what the end of forward holds: the logits and two fp32 values a token
        return compiled_loss_bytes(tokens=tokens, vocab=vocab, dt=dt)[0]
    if kernel in ("chunked_compiled", "chunked_compiled_held"):  # each chunk's logits and its two fp32 values a token
        return tokens * vocab * dt.compute + tokens * 2 * FP32
    if kernel in CHUNKED_NLL_KERNELS:  # the reordered hidden states, every chunk's checkpointed input
        return tokens * hidden * dt.residual
    return tokens * vocab * FP32


class HeadLossBytes(NamedTuple):
    """A task head's loss path (``head_loss_bytes``), bytes."""

    forward_end: int  # at the end of forward beyond the saved activations (as loss_bytes' first figure)
    backward: int  # what the loss backward holds (as loss_bytes' second figure)
    returned: int  # the logits the forward returns, held by the output until the loss backward
    saved: int  # saved for backward beyond a causal LM's (token classification's dropout mask)


def head_loss_bytes(head: "TaskHead", *, micro_batch_size: int, seq_len: int, hidden: int,
                    dt: "Dtypes", frozen: bool = False) -> HeadLossBytes:
    """The loss path of a task head (``advisor.model.heads``; transformers ``modeling_layers.GenericFor*``
    and ``loss/loss_utils.py``), in place of ``loss_bytes``: no vocabulary, so a few labels wide.

    Sequence classification: the head's logits of every token (``b x s x labels``, compute dtype), the
    last non-pad token's gathered (``b x labels``) for the cross-entropy, which autocast runs in fp32
    (an fp32 copy, the saved log-softmax); its backward three ``b x labels`` fp32 tensors, as the
    causal LM's over a vocabulary. Token classification: the logits of every token, ``logits.float()``
    and the log-softmax, ``b x s x labels`` (the causal LM's ``hf`` path with the labels for the
    vocabulary), and the dropout before the head saves a bool mask of the last hidden state
    (``native_dropout``, one byte per element). Question answering: two logits per token split into the
    start and end logits (contiguous copies, ``b x s`` each) and a cross-entropy of each over the
    sequence: an fp32 copy and a saved log-softmax of each.

    ``frozen``: over a frozen base (LoRA) the head's input is kept only when the head trains, as PEFT's
    copy of it (``modules_to_save``, ``TaskHead.saved_copy``): its weight gradient reads it (the final
    norm's output, compute dtype), which a frozen head never keeps."""
    tokens = micro_batch_size * seq_len
    width = head.out_features
    kept_input = tokens * hidden * dt.compute if frozen and head.saved_copy else 0
    if head.task == "question-answering":
        split = 2 * tokens * dt.compute  # start and end logits, contiguous
        return HeadLossBytes(forward_end=tokens * width * dt.compute + split + 2 * tokens * 2 * FP32,
                             backward=2 * tokens * 3 * FP32, returned=split, saved=kept_input)
    if head.pooled:
        rows = micro_batch_size * width
        return HeadLossBytes(forward_end=tokens * width * dt.compute + rows * (dt.compute + 2 * FP32),
                             backward=rows * 3 * FP32, returned=rows * dt.compute, saved=kept_input)
    logits = tokens * width
    return HeadLossBytes(forward_end=logits * (dt.compute + 2 * FP32), backward=logits * 3 * FP32,
                         returned=logits * dt.compute, saved=kept_input + (tokens * hidden if head.dropout else 0))

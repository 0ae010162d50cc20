"""Activation memory of mixture-of-experts blocks and multi-head latent attention, per token.

What belongs here: the bytes one token leaves saved for backward in an MoE MLP (router, routed
experts, shared experts) and in DeepSeek's multi-head latent attention, as transformers 5.x runs
them; and what an MoE MLP's backward holds beyond them at its two points (the routing-weight product,
the experts' product rule). The rest of a decoder block (norms, Llama attention) is in ``advisor.estimate.activations_blocks``,
the composition into a step in ``advisor.estimate.activations``. Pure functions, integers in, integer bytes out.

Sources: transformers 5.x ``integrations/moe.py`` (``grouped_mm_experts_forward``, the default
experts implementation when ``torch._grouped_mm`` can dispatch: tokens are sorted by expert,
gathered, run through two grouped matmuls, weighted and scattered back), the routers of
``modeling_mixtral.py`` / ``modeling_qwen3_moe.py`` / ``modeling_deepseek_v3.py``, and PyTorch's
derivatives.yaml for what each op saves. The saved tensors were listed with
``torch.autograd.graph.saved_tensors_hooks`` on tiny Mixtral, Qwen2-MoE, Qwen3-MoE and DeepSeek-V3
blocks (bf16 and fp32) and agree with these counts to the RMSNorm ``rsqrt`` statistics (4 bytes a
token a norm, left out as in the dense count) (``tests/estimate/test_moe_activations.py``).

Assumptions, stated in the plan notes (``MOE_NOTE``): the implementations are dropless (every token
goes to its k experts; there is no capacity factor and no dropped token, unlike Switch/GShard's
capacity-limited routing), so the routed activations are exactly k x tokens rows whatever the
balance, and the load balance matters only for expert parallelism (``advisor.estimate.pipeline``: the busiest
ep rank's extra rows are the top of the error range).
"""

from __future__ import annotations

from advisor.model.moe import MlaFacts, MoeFacts
from advisor.precision import FP32

INT64 = 8

MOE_NOTE = ("MoE: dropless top-k routing as transformers runs it (grouped matmuls: k x tokens rows through the "
            "experts whatever the balance; no capacity factor, no dropped tokens); router probabilities in fp32; "
            "experts are replicated or FSDP-sharded like any weight, or split over ep ranks on a mesh with ep; the "
            "experts run torch._grouped_mm in their weights' dtype (not an autocast op: under autocast over fp32 "
            "weights, DDP's bf16-mixed, they compute and save in fp32 and none of their weights is cast); checked "
            "against the simulator with bf16 weights (FSDP2, pure bf16) and, for fp32 experts under autocast, on "
            "real CPU tensors (the simulator's fake tensors take bf16 only in _grouped_mm; real kernels take fp32 "
            "and fp16)")
MLA_NOTE = ("multi-head latent attention: keys and values are expanded per head before attention, so attention "
            "saves full-width q, k and v as a GPU's memory-efficient SDPA kernel does (the CPU simulator runs the "
            "math kernel when the value width differs from the query width)")


def router_per_token(dt_compute: int, dt_residual: int, *, hidden: int, experts: int, k: int, moe: MoeFacts) -> int:
    """Router bytes a token leaves saved. Softmax routers (Mixtral, Qwen-MoE, DeepSeek-V2): the fp32
    softmax output (E), the top-k indices (int64); renormalised top-k weights (Mixtral always, Qwen and
    DeepSeek with ``norm_topk_prob``) add the fp32 sum and the clone an in-place division saves.
    DeepSeek-V3's sigmoid router runs in fp32 (a copy of a low-precision input), saves the sigmoid
    output, the group top-k indices (two per group, then ``topk_group``), the expert mask (bool) and
    the gathered top-k weights."""
    saved = FP32 * experts + INT64 * k
    if moe.router == "sigmoid":
        saved += (FP32 * hidden if dt_residual != FP32 else 0) + experts  # fp32 input copy; bool mask
        saved += INT64 * (2 * moe.num_groups + moe.topk_groups) + INT64 * k  # group top-k; gather index
    if moe.normalized_top_k:
        saved += FP32 + FP32 * k
    return saved


def router_weight_copy_bytes(dt_residual: int, *, hidden: int, experts: int, moe: MoeFacts) -> int:
    """Per MoE layer, not per token: DeepSeek-V3's router multiplies ``weight.float()``, an fp32 copy
    of the E x h router weight that autograd keeps when the weights are low precision."""
    return FP32 * experts * hidden if moe.router == "sigmoid" and dt_residual != FP32 else 0


def routed_experts_per_token(cb: int, *, hidden: int, inter: int, k: int, weights_bytes: int) -> int:
    """``grouped_mm_experts_forward``, per token (k rows): the gathered input (the first grouped
    matmul's input), its output (gate and up, 2 x inter, kept whole: the activation and the product
    save views of it), act(gate) and act(gate) x up (the second matmul's input), the second matmul's
    output (saved by the routing-weight product) and the routing weight; three int64 index vectors of
    k entries (``perm // k``, ``perm``, the inverse permutation; the top-k indices are the router's)."""
    return k * (cb * (2 * hidden + 4 * inter) + weights_bytes) + 3 * INT64 * k


def shared_experts_per_token(cb: int, *, hidden: int, moe: MoeFacts) -> int:
    """A gated MLP of ``shared_intermediate_size`` on every token (gate out, act, up out, product);
    Qwen2-MoE's sigmoid gate adds its output and the shared output it scales."""
    if not moe.shared_intermediate_size:
        return 0
    return 4 * cb * moe.shared_intermediate_size + (cb + cb * hidden if moe.shared_gate else 0)


def experts_bytes(cb: int, residual: int, *, input_casts: bool) -> int:
    """Byte width of the routed experts' activations: the weights' dtype in forward. ``_grouped_mm`` is not an
    autocast op; transformers casts the experts' input to the weights' dtype instead (``integrations/moe.py``
    ``_grouped_mm``: ``input.to(weight.dtype)``, pytorch#174763), so autocast over fp32 weights (``input_casts``
    with an fp32 residual) runs the experts in fp32 and casts none of their weights. Measured with
    ``saved_tensors_hooks`` on a tiny Mixtral under CPU autocast (tests/estimate/test_moe_backward.py)."""
    return residual if input_casts else cb


def moe_mlp_per_token(cb: int, residual: int, *, hidden: int, inter: int, experts: int, k: int,
                      moe: MoeFacts, routed_bytes: int | None = None) -> int:
    """One MoE MLP (router, routed experts, shared experts), bytes per token. Routing weights are fp32
    except where the router casts them to the activations' dtype (Qwen-MoE). ``routed_bytes``: the routed
    experts' width (``experts_bytes``; default ``cb``)."""
    eb = routed_bytes or cb
    weights = eb if moe.weights_in_compute_dtype else FP32
    return (router_per_token(cb, residual, hidden=hidden, experts=experts, k=k, moe=moe)
            + routed_experts_per_token(eb, hidden=hidden, inter=inter, k=k, weights_bytes=weights)
            + shared_experts_per_token(cb, hidden=hidden, moe=moe))


def routing_backward_per_token(cb: int, residual: int, *, hidden: int, k: int, moe: MoeFacts,
                               recomputed: bool = False) -> int:
    """Bytes a token holds beyond its saved tensors early in an MoE MLP's backward: the routing-weight
    product's backward (``grouped_mm_experts_forward``: ``proj_out * sample_weights_g``, then ``[inv_perm]``
    and ``view(T, k, h).sum(1)``), before any expert's grouped product runs backward, so no expert weight
    gradient exists yet. The product is in the wider of the activations' and the routing weights' dtype
    (``p``: fp32 for Mixtral's fp32 weights, by type promotion; autocast does not list ``mul``). Live then:
    the incoming residual gradient, the gradient of the reordered product (``index_put`` into zeros, ``p``,
    k rows a token), the two gradients of the product (``grad * weights`` and ``grad * proj_out``, ``p``) and
    the first one cast back to ``proj_out``'s dtype (``cb``) when ``p`` is wider. Read op by op on the
    simulated step (torch 2.13, transformers 5.23; Mixtral 512 wide, 8 experts top-2, s 4096, FSDP2
    bf16-mixed: 58.7 MB = 4,096 tokens x 2 x 512 x (3 x 4 + 2) over the residual gradient).

    ``recomputed`` (non-reentrant activation checkpointing, full or selective): the autograd engine makes that
    cast after the product's backward returns (``validate_outputs``), and a recomputed saved tensor is held only
    by that backward once unpacked (the checkpoint's unpack hook drops its own reference), so ``proj_out``
    (``cb``, k rows a token) is freed just before the cast is made: no more is live there than at the
    ``index_put`` before it (the expanded incoming gradient's ``clone``, the zeros and the ``index_put`` result,
    three ``p``-wide tensors of k rows a token). Without checkpointing ``proj_out`` stays saved through the
    cast (released after ``validate_outputs``). Read op by op on the simulated step (sweep 91b2d9e98ef9:
    Mixtral 64 wide, top-2, FSDP2 x8, mb 8, s 1024, full checkpointing, pure bf16 and bf16-mixed alike: the
    block's peak at that ``index_put``, 248 bytes a token under the cast's count with ``proj_out``)."""
    weights = cb if moe.weights_in_compute_dtype else FP32
    wide = max(cb, weights)
    cast = cb if wide != cb and not recomputed else 0
    return residual * hidden + k * hidden * (3 * wide + cast)


def experts_backward_per_token(cb: int, residual: int, *, hidden: int, inter: int, k: int) -> int:
    """Bytes a token holds beyond its saved tensors at the experts' product rule (``act(gate) * up``), after
    the down projection's grouped product ran backward (its weight gradient, every expert's, is the
    strategy's: ``strategy_buffers.block_backward_buffers``): the residual gradient, that product's input
    gradient and its two gradients (``inter`` wide, k rows a token), less what is freed by then: the down
    projection's saved input and its output (saved by the routing-weight product). Read on the same
    simulated step as above (4.19 MB under the routing product's point with 12.6 MB of down_proj gradients:
    11,264 bytes a token; Mixtral 192 wide, inter 768, DDP pure bf16: the step's peak, 2.36 MB over it)."""
    return residual * hidden + k * cb * (2 * inter - hidden)


def moe_backward_per_token(cb: int, residual: int, *, hidden: int, inter: int, k: int,
                           moe: MoeFacts, recomputed: bool = False) -> tuple[int, int]:
    """(at the experts' product rule, at the routing-weight product's backward before it), a token, beyond the
    saved tensors, in an MoE decoder's top block (``recomputed``: under checkpointing); a shared expert or
    DeepSeek's dense layers, where wider, count the dense gated MLP's product rule
    (``activations.estimate_activations``) at the first."""
    experts = experts_backward_per_token(cb, residual, hidden=hidden, inter=inter, k=k)
    dense = max(moe.shared_intermediate_size, moe.dense_intermediate_size if moe.num_dense_layers else 0)
    experts = max(experts, residual * hidden + 2 * cb * dense if dense else 0)
    return experts, routing_backward_per_token(cb, residual, hidden=hidden, k=k, moe=moe, recomputed=recomputed)


def selective_kept_width(*, q_out: int, kv_out: int, experts: int, moe: MoeFacts | None) -> int:
    """Output features of the matrix products selective checkpointing keeps in an MoE block
    (``wrappers.checkpointing.selective_context``: the 1st, 3rd, 5th ... ``aten.mm`` in forward order). The
    experts run ``aten._grouped_mm``, which the policy recomputes and does not count; the block's ``mm`` are
    q, k, v, o and the router's logits (``F.linear`` over the flattened tokens): q, v and the logits are kept.
    Mixtral and Qwen3-MoE (bias-free projections, no shared expert); 0 for the others (not read)."""
    if moe is not None and (moe.shared_intermediate_size or moe.router != "softmax"):
        return 0
    return q_out + kv_out + experts


def mla_attention_per_token(cb: int, *, heads: int, mla: MlaFacts, seq_len: int, eager: bool) -> int:
    """DeepSeek's attention (``DeepseekV3Attention``) beyond the block's input norm: the RMSNorms on
    the q and kv latents (fp32 copy, normalised value, the up-projection's input), then attention over
    per-head q and k of ``qk_nope + qk_rope`` (both new tensors: q is concatenated, k assembled with
    ``copy_``) and v, a view of the kv up-projection's output (nope keys and values, kept whole); the
    kernel's output and fp32 log-sum-exp. Eager attention saves the fp32 probabilities and their
    low-precision copy instead of the log-sum-exp."""
    qk = heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    latents = (FP32 + 2 * cb) * (mla.kv_lora_rank + (mla.q_lora_rank or 0))
    kv_up = cb * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    out = cb * heads * mla.v_head_dim
    scores = (FP32 + (cb if cb != FP32 else 0)) * heads * seq_len if eager else FP32 * heads
    return latents + 2 * cb * qk + kv_up + out + scores

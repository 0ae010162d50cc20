"""One expert-parallel MoE layer on one rank, on fake tensors: what its forward leaves held for the
backward, and the peak of its forward and backward.

``simulate_moe_layer(hidden=, expert_intermediate=, num_experts=, top_k=, ep=, tokens=)`` builds the
rank's share of a routed-expert layer (the router, replicated; E/ep SwiGLU experts held as
transformers' fused ``gate_up_proj`` and ``down_proj``) and runs the path ``wrappers.experts``
(``ExpertParallelExperts``) runs, dropless expert parallelism as in Megatron-LM's
``MoEAlltoAllTokenDispatcher`` (DeepSeek-V3 section 3.2): router logits, an fp32 softmax and top-k
(renormalised with ``normalized_top_k`` as Mixtral's router does; cast to the activations' dtype
with ``weights_in_compute_dtype``, as Qwen-MoE's router does); the (token, choice) pairs sorted by expert; the dispatch copy of k x tokens rows; the
all-to-all that trades them with the other ep ranks; the received rows sorted by local expert; each
local expert on its rows (the grouped matmuls, as a batched matmul over equal groups); the rows put back in received order; the all-to-all back; the combine as
transformers' ``grouped_mm_experts_forward`` does it (rows times their router weights, back in
(token, choice) order, summed over the k choices).

Routing is balanced: each of the E experts gets k x tokens / E rows, so this rank receives k x tokens
rows in all (from every ep rank, k x tokens / ep each). Fake tensors have no values, so which token
goes where is fixed, not read from the router. The all-to-alls are copies into fresh receive buffers
of the same shape (what a balanced exchange holds), with a fresh buffer for the gradient on the way
back. Routing imbalance (the busiest rank's extra rows) is left to the error range.

Compared with the estimate's per-rank figure (``advisor.estimate.pipeline_experts``) by
``benchmarks/accuracy_moe_ep.py``. Imports torch; the planning path never imports this module.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class MoeLayerPeak(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    num_local_experts: int
    tokens: int = Field(description="Tokens of this rank's micro-batch (b x s).")
    rows: int = Field(description="Expert rows this rank computes after the dispatch (k x tokens, balanced).")
    params: int = Field(description="Router and local experts, bytes.")
    held_after_forward: int = Field(description="Bytes the forward leaves for the backward, the layer's input "
                                                "and output excluded.")
    peak: int = Field(description="Most live bytes during forward and backward, parameters and gradients included.")


def simulate_moe_layer(*, hidden: int, expert_intermediate: int, num_experts: int, top_k: int, ep: int,
                       tokens: int, dtype: str = "float32", normalized_top_k: bool = False,
                       weights_in_compute_dtype: bool = False) -> MoeLayerPeak:
    """Measure one rank of an ep-sharded MoE layer (module docstring)."""
    if num_experts % ep:
        raise ValueError(f"--ep {ep} does not divide the {num_experts} experts")
    if (tokens * top_k) % num_experts:
        raise ValueError("balanced routing needs k x tokens divisible by the experts")
    import torch

    from advisor.simulate.fake_env import fake_mode
    from advisor.simulate.measure import LiveBytes

    local = num_experts // ep
    rows = tokens * top_k
    dt = getattr(torch, dtype)
    with fake_mode():
        router = torch.nn.Parameter(torch.empty(num_experts, hidden, dtype=dt))
        # Held [E/ep, h, 2I] and [E/ep, I, h], the layout the batched matmul reads, so that its weight
        # gradients come out in the parameters' layout (a transposed view would make AccumulateGrad copy them,
        # a transient the grouped kernels do not have).
        gate_up = torch.nn.Parameter(torch.empty(local, hidden, 2 * expert_intermediate, dtype=dt))
        down = torch.nn.Parameter(torch.empty(local, expert_intermediate, hidden, dtype=dt))
        params = [router, gate_up, down]
        x = torch.empty(tokens, hidden, dtype=dt, requires_grad=True)
        live = LiveBytes(params, None)
        live.track_existing([x])
        with live:
            base = live.total
            out = _forward(x, router, gate_up, down, top_k=top_k, normalized=normalized_top_k,
                           weights_dtype=dt if weights_in_compute_dtype else torch.float32)
            held = live.total - base - out.untyped_storage().nbytes()
            torch.autograd.backward(out, torch.empty_like(out))
    return MoeLayerPeak(num_local_experts=local, tokens=tokens, rows=rows,
                        params=sum(p.numel() * p.element_size() for p in params), held_after_forward=held,
                        peak=live.peak)


def _forward(x: Any, router: Any, gate_up: Any, down: Any, *, top_k: int, normalized: bool,
             weights_dtype: Any) -> Any:
    """``ExpertParallelExperts.forward`` after the replicated router, on balanced rows."""
    import torch
    import torch.nn.functional as F

    probs = torch.softmax((x @ router.t()).float(), dim=-1)
    weights, chosen = torch.topk(probs, top_k, dim=-1)  # top-k saves its indices
    if normalized:  # Mixtral, norm_topk_prob: the division saves the top-k values and their sum
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights.to(weights_dtype)
    order = torch.argsort(chosen.reshape(-1), stable=True)  # (token, choice) pairs by expert
    token_of = order // top_k
    received = _all_to_all().apply(x[token_of])  # the dispatch copy, then the receive buffer
    by_expert = torch.argsort(torch.empty_like(token_of), stable=True)  # received rows by local expert
    sorted_rows = received[by_expert]
    # The grouped matmuls (torch._grouped_mm in transformers and torchtitan) on balanced groups: a batched
    # matmul over the E/ep local experts, each weight used whole, its gradient one tensor.
    groups = sorted_rows.view(gate_up.shape[0], -1, x.shape[-1])
    gate, up = torch.bmm(groups, gate_up).chunk(2, dim=-1)
    outs = torch.bmm(F.silu(gate) * up, down).reshape(sorted_rows.shape)
    returned = _all_to_all().apply(outs[torch.argsort(by_expert)])
    weighted = returned * weights.reshape(-1)[order][:, None]
    per_token = weighted[torch.argsort(order)].view(-1, top_k, weighted.shape[-1]).sum(dim=1)
    return per_token.to(x.dtype)


@functools.cache
def _all_to_all() -> Any:
    """A balanced all-to-all as an autograd Function: the same shape arrives in a fresh buffer, both ways."""
    import torch

    class AllToAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, rows: Any) -> Any:
            return torch.empty_like(rows)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return torch.empty_like(grad)

    return AllToAll

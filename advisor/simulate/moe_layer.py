"""One expert-parallel MoE layer on one rank, on fake tensors: what its forward leaves held for the
backward, and the peak of its forward and backward.

``simulate_moe_layer(hidden=, expert_intermediate=, num_experts=, top_k=, ep=, tokens=)`` builds the
rank's share of a routed-expert layer (the router, replicated; E/ep SwiGLU experts, as torchtitan's
``GroupedExperts`` and Megatron's ``SequentialMLP`` hold them) and runs the path of dropless expert
parallelism (Megatron-LM ``MoEAlltoAllTokenDispatcher``; DeepSeek-V3 section 3.2): router logits, an
fp32 softmax and top-k; the dispatch copy of k x tokens rows, ordered by expert; the all-to-all that
trades them with the other ep ranks; each local expert on its rows; the all-to-all back; the combine
(rows scaled by their router weights and added into their tokens).

Routing is balanced: each of the E experts gets k x tokens / E rows, so this rank receives k x tokens
rows in all (from every ep rank, k x tokens / ep each). Fake tensors have no values, so which token
goes where is fixed, not read from the router. The all-to-alls are copies into fresh receive buffers
of the same shape (what a balanced exchange holds), with a fresh buffer for the gradient on the way
back. Routing imbalance (the busiest rank's extra rows) is left to the error range.

Imports torch; the planning path never imports this module.
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
                       tokens: int, dtype: str = "float32") -> MoeLayerPeak:
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
        gate = torch.nn.Parameter(torch.empty(local, expert_intermediate, hidden, dtype=dt))
        up = torch.nn.Parameter(torch.empty(local, expert_intermediate, hidden, dtype=dt))
        down = torch.nn.Parameter(torch.empty(local, hidden, expert_intermediate, dtype=dt))
        params = [router, gate, up, down]
        x = torch.empty(tokens, hidden, dtype=dt, requires_grad=True)
        # Rows in expert order (balanced): row r carries token r // k.
        order = torch.arange(rows) // top_k
        live = LiveBytes(params, None)
        live.track_existing([x, order])
        with live:
            base = live.total
            out = _forward(x, order, router, gate, up, down, top_k=top_k)
            held = live.total - base - out.untyped_storage().nbytes()
            torch.autograd.backward(out, torch.empty_like(out))
    return MoeLayerPeak(num_local_experts=local, tokens=tokens, rows=rows,
                        params=sum(p.numel() * p.element_size() for p in params), held_after_forward=held,
                        peak=live.peak)


def _forward(x: Any, order: Any, router: Any, gate: Any, up: Any, down: Any, *, top_k: int) -> Any:
    import torch
    import torch.nn.functional as F

    probs = torch.softmax((x @ router.t()).float(), dim=-1)
    weights, _ = torch.topk(probs, top_k, dim=-1)  # which experts: fixed by ``order`` (balanced)
    sent = x.index_select(0, order)  # the dispatch copy, rows ordered by expert
    received = _all_to_all().apply(sent)
    chunks = received.chunk(gate.shape[0])
    outs = [(F.silu(c @ g.t()) * (c @ u.t())) @ d.t() for c, g, u, d in zip(chunks, gate, up, down)]
    returned = _all_to_all().apply(torch.cat(outs))
    scaled = returned * weights.reshape(-1, 1).to(returned.dtype)
    return torch.zeros_like(x).index_add(0, order, scaled)


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

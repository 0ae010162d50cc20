"""One MoE layer on one expert-parallel rank: the bytes the estimate books for it.

    moe_rank_bytes(spec, dt, *, ep, tp, tokens, param_bytes) -> MoeRankBytes

What belongs here: what one rank holds of one routed-expert layer under ``ep`` (torchtitan's
placement, expert tensor parallelism = tp), as ``wrappers.experts`` runs it: the router (replicated)
and E/ep experts, each split by tp; what the forward saves for the backward; the all-to-all buffers;
the busiest rank's extra rows. ``advisor.estimate.pipeline`` books these in each stage's moments
(the experts through ``_stage_spec``, the rest here); ``benchmarks/accuracy_moe_ep.py`` compares them
with ``advisor.simulate.moe_layer``, which runs the same path on fake tensors. What does not belong
here: the step's moments (``advisor.estimate.memory``), the dense parts of the block.

- Saved per token: the router and the routed experts as transformers' ``grouped_mm_experts_forward``
  runs them (``advisor.estimate.activations_moe``: k rows of the gathered input, 2I + I + I of the
  SwiGLU, the returned output and the routing weight; three int64 index vectors of k entries). The
  ep path keeps the same tensors (the receive buffers take the places of the gathered input and the
  second matmul's output; the combine saves no weighted rows) and two int64 index vectors more per
  row: the received rows are sorted by local expert and put back (``ExpertParallelExperts._run_local``).
- Dispatch buffers: the send and receive buffers of one exchange, k x tokens rows of width h
  (Megatron-LM ``MoEAlltoAllTokenDispatcher``), while a block's backward runs.
- Imbalance: dropless routing sends k x tokens rows in all; the busiest rank receives
  ``routing_imbalance`` times its share (``profiles/expert_parallel.json``). Its extra routed rows
  are the top of the error range, never the expected figure.

Pure functions of frozen inputs, integer bytes.
"""

from __future__ import annotations

import functools
import json

from pydantic import BaseModel, ConfigDict, Field

from advisor.estimate.activations import Dtypes
from advisor.estimate.activations_moe import router_per_token, routed_experts_per_token, shared_experts_per_token
from advisor.model.moe import MoeFacts
from advisor.model.spec import ModelSpec
from advisor.precision import FP32
from profiles import PROFILES_DIR

INT64 = 8
EP_SORT_INDICES = 2  # int64 vectors of k x tokens entries the ep path saves beyond transformers' (module docstring)


class MoeRankBytes(BaseModel):
    """One routed-expert layer on one (ep, tp) rank, bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    params: int = Field(ge=0, description="Router (replicated) and the rank's E/ep routed experts, split by tp.")
    router_saved: int = Field(ge=0, description="What the router saves for the backward.")
    routed_saved: int = Field(ge=0, description="What the routed experts, dispatch and combine save for the backward "
                              "as transformers' unsharded module does.")
    sort_indices_saved: int = Field(ge=0, description="The ep path's sort by local expert and its inverse (0 at ep 1).")
    shared_saved: int = Field(ge=0, description="What the shared experts save (0 without them).")
    dispatch: int = Field(ge=0, description="Send and receive buffers of one all-to-all, while a backward runs "
                          "(0 at ep 1).")
    imbalance: int = Field(ge=0, description="The busiest rank's extra routed saved bytes (top of the error range).")

    @property
    def saved(self) -> int:
        return self.router_saved + self.routed_saved + self.sort_indices_saved + self.shared_saved


@functools.cache
def routing_imbalance() -> float:
    """Busiest ep rank's routed rows over the mean (``profiles/expert_parallel.json``)."""
    return float(json.loads((PROFILES_DIR / "expert_parallel.json").read_text())["routing_imbalance"]["value"])


def moe_rank_bytes(spec: ModelSpec, dt: Dtypes, *, ep: int, tp: int, tokens: int, param_bytes: int) -> MoeRankBytes:
    """One MoE layer of ``spec`` on one rank of ``ep`` x ``tp``, ``tokens`` of its micro-batch (module docstring)."""
    experts, k, h = spec.num_experts or 0, spec.num_experts_per_token or 0, spec.hidden_size or 0
    inter = (spec.intermediate_size or 0) // tp
    moe = spec.moe or MoeFacts(router="softmax")  # Mixtral: softmax, renormalised, fp32 weights
    cb = dt.compute
    weights = cb if moe.weights_in_compute_dtype else FP32
    local_experts = -(-experts * (spec.expert_params or 0) // (tp * ep))
    rows_extra = k * tokens * (routing_imbalance() - 1) if ep > 1 else 0
    return MoeRankBytes(
        params=param_bytes * (experts * h + local_experts),
        router_saved=tokens * router_per_token(cb, dt.residual, hidden=h, experts=experts, k=k, moe=moe),
        routed_saved=tokens * k * routed_experts_per_token(cb, hidden=h, inter=inter, k=1, weights_bytes=weights),
        sort_indices_saved=tokens * k * EP_SORT_INDICES * INT64 if ep > 1 else 0,
        shared_saved=tokens * shared_experts_per_token(cb, hidden=h, moe=moe),
        dispatch=2 * k * tokens * h * cb if ep > 1 else 0,
        imbalance=int(rows_extra * cb * (2 * h + 4 * inter)))

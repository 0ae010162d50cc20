"""Expert parallelism: the routed experts of a Hugging Face MoE block sharded over an ``ep`` group.

Each of the ``ep`` ranks keeps ``num_experts / ep`` whole experts (rank ``r`` experts
``[r E/ep, (r+1) E/ep)``) and reads its own tokens. The router (and any shared expert) stays
replicated and runs on the rank's tokens; only the ``experts`` module is replaced:

1. dispatch: every (token, choice) pair is sorted by expert and sent to the rank owning that expert
   with ``all_to_all_single`` (the counts per expert first, then the hidden states);
2. each rank runs its local experts on what it received (SwiGLU: ``down(act(gate) * up)``);
3. combine: the outputs go back the same way, are weighted by the router's top-k weights and summed
   per token, as the unsharded module does (put back in (token, choice) order and summed over the k
   choices, so the weighted rows are not saved for the backward; ``advisor.simulate.moe_layer`` runs
   the same path on fake tensors).

Both exchanges are ``torch.distributed._functional_collectives.all_to_all_single_autograd`` (what
torchtitan's ``expert_parallel`` uses): its backward is the reverse all-to-all, so an expert's
gradient collects every rank's tokens. It runs on gloo (CPU) and NCCL.

Which implementations shard: transformers >= 5 stores the experts of Mixtral, Qwen2-MoE, Qwen3-MoE,
OLMoE, DeepSeek-V2 and DeepSeek-V3 (and the other ``@use_experts_implementation`` classes with the
default layout) as one module with 3-D ``gate_up_proj`` ``[E, 2I, H]`` (gate then up, concatenated)
and ``down_proj`` ``[E, H, I]``, no biases, the default ``act(gate) * up``, called as
``experts(hidden, top_k_index, top_k_weights)``: those shard here, whatever their router does
(DeepSeek's group-limited routing is in the replicated router, as are Qwen2-MoE's and DeepSeek's
shared experts). Parity is tested for Mixtral, Qwen2-MoE and DeepSeek-V3 blocks; transformers 5.23's
Qwen3-MoE, OLMoE, DeepSeek-V2, Qwen3-Next, Jamba, GraniteMoe, GLM-4-MoE, MiniMax and ERNIE-4.5-MoE
experts pass the layout check. Refused, with the reason (``expert_layout_problem``): transposed or
biased experts (GPT-OSS, Llama 4's ``[E, H, 2I]``), their own gate (``_apply_gate``: GPT-OSS,
DeepSeek-V4), LongCat-Flash (its two projections count different experts), and expert lists of
separate MLP modules (transformers < 5 and DeepSeek's remote code, whose own ``ep_size`` path is
inference-only).

Not here: composing with FSDP2 over the expert data-parallel group (``dp_shard / ep``, torchtitan's
``edp``) and its gradient scaling, token-dropping capacity factors, load-balancing losses.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn


def expert_layout_problem(experts: nn.Module) -> str | None:
    """Why ``experts`` cannot be sharded here (see the module docstring); None when it can."""
    gate_up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor):
        return f"{type(experts).__name__} holds no fused 3-D gate_up_proj / down_proj (a list of expert MLPs?)"
    flags = {"is_transposed": False, "has_bias": False, "is_concatenated": True, "has_gate": True,
             "has_post_expert_norm": False}
    odd = [name for name, wanted in flags.items() if getattr(experts, name, wanted) != wanted]
    if odd:
        return f"{type(experts).__name__} has another weight layout ({', '.join(odd)})"
    num = gate_up.shape[0]
    if gate_up.ndim != 3 or down.ndim != 3 or down.shape[0] != num or gate_up.shape[1] != 2 * down.shape[2] \
            or gate_up.shape[2] != down.shape[1]:
        return f"{type(experts).__name__}: gate_up_proj {tuple(gate_up.shape)} and down_proj {tuple(down.shape)} " \
               "are not [E, 2I, H] and [E, H, I]"
    extra = sorted({n for n, _ in experts.named_parameters()} - {"gate_up_proj", "down_proj"})
    if extra:
        return f"{type(experts).__name__} has further parameters ({', '.join(extra)})"
    gate = getattr(type(experts), "_apply_gate", None)
    if gate is not None and gate.__name__ != "_default_apply_gate":
        return f"{type(experts).__name__} gates its experts its own way (_apply_gate), not act(gate) * up"
    if not hasattr(experts, "act_fn"):
        return f"{type(experts).__name__} has no act_fn"
    return None


class ExpertParallelExperts(nn.Module):
    """This rank's slice of an experts module, with all-to-all dispatch and combine (module docstring)."""

    def __init__(self, experts: nn.Module, group: dist.ProcessGroup) -> None:
        super().__init__()
        problem = expert_layout_problem(experts)
        if problem:
            raise ValueError(f"expert parallelism: {problem}")
        self.group = group
        self.ep = dist.get_world_size(group)
        self.num_experts = experts.gate_up_proj.shape[0]
        if self.num_experts % self.ep:
            raise ValueError(f"ep {self.ep} does not divide the {self.num_experts} experts")
        self.num_local = self.num_experts // self.ep
        start = dist.get_rank(group) * self.num_local
        local = slice(start, start + self.num_local)
        self.gate_up_proj = nn.Parameter(experts.gate_up_proj.detach()[local].clone())
        self.down_proj = nn.Parameter(experts.down_proj.detach()[local].clone())
        self.act_fn = experts.act_fn

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        top_k = top_k_index.shape[1]
        flat_experts = top_k_index.reshape(-1)
        order = torch.argsort(flat_experts, stable=True)  # (token, choice) pairs grouped by expert
        token_of = order // top_k
        send_per_expert = torch.bincount(flat_experts, minlength=self.num_experts)
        recv_per_expert = torch.empty_like(send_per_expert)
        dist.all_to_all_single(recv_per_expert, send_per_expert, group=self.group)  # [src rank, local expert]
        send_splits = send_per_expert.view(self.ep, self.num_local).sum(1).tolist()
        recv_counts = recv_per_expert.view(self.ep, self.num_local)
        recv_splits = recv_counts.sum(1).tolist()
        received = funcol.all_to_all_single_autograd(hidden_states[token_of], recv_splits, send_splits, self.group)
        expert_ids = torch.arange(self.num_local, device=recv_counts.device).repeat(self.ep)
        local_expert = torch.repeat_interleave(expert_ids, recv_counts.reshape(-1))
        outputs = self._run_local(funcol.wait_tensor(received), local_expert)
        returned = funcol.wait_tensor(funcol.all_to_all_single_autograd(outputs, send_splits, recv_splits, self.group))
        # Combine as transformers' grouped_mm_experts_forward does: weight the rows in the router's dtype, put
        # them back in (token, choice) order and sum the k choices. Neither the index nor the sum saves the
        # weighted rows for the backward (``index_add`` keeps its source: k x tokens rows of width h more).
        weighted = returned * top_k_weights.reshape(-1)[order][:, None]
        per_token = weighted[torch.argsort(order)].view(-1, top_k, weighted.shape[-1]).sum(dim=1)
        return per_token.to(hidden_states.dtype)

    def _run_local(self, tokens: torch.Tensor, local_expert: torch.Tensor) -> torch.Tensor:
        """Each received row through its local expert; rows keep their order."""
        by_expert = torch.argsort(local_expert, stable=True)
        counts = torch.bincount(local_expert, minlength=self.num_local).tolist()
        pieces = []
        for index, chunk in enumerate(torch.split(tokens[by_expert], counts)):
            gate, up = nn.functional.linear(chunk, self.gate_up_proj[index]).chunk(2, dim=-1)
            pieces.append(nn.functional.linear(self.act_fn(gate) * up, self.down_proj[index]))
        out = torch.cat(pieces) if pieces else tokens[:0]
        return out[torch.argsort(by_expert)]


def find_experts(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every experts module of ``model`` (a module named ``experts`` holding a 3-D ``gate_up_proj``)."""
    return [(name, module) for name, module in model.named_modules()
            if name.rsplit(".", 1)[-1] == "experts" and getattr(getattr(module, "gate_up_proj", None), "ndim", 0) == 3]


def apply_expert_parallel(model: nn.Module, group: dist.ProcessGroup) -> list[str]:
    """Replace every experts module of ``model`` by this rank's ``ExpertParallelExperts``; their names.

    All of them are checked before any is replaced. Rebuild the optimizer afterwards (new parameters)."""
    found = find_experts(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no fused experts module to shard (see wrappers.experts)")
    problems = [f"{name}: {problem}" for name, module in found if (problem := expert_layout_problem(module))]
    if problems:
        raise ValueError("expert parallelism: " + "; ".join(problems[:3]))
    for name, module in found:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, ExpertParallelExperts(module, group))
    return [name for name, _ in found]

"""Exact parameter counts of hybrid attention / state-space models (Jamba) from a ``config.json``
dict, without torch.

What belongs here: the module tree of transformers 5.x ``modeling_jamba.py`` as arithmetic, and
``HybridFacts``, the per-layer pattern the activation model (``advisor.estimate.activations_hybrid``)
composes. Jamba's layers are not alike: layer i is an attention layer when
``i % attn_layer_period == attn_layer_offset`` and a Mamba layer elsewhere, and its feed-forward is a
sparse MoE block when ``i % expert_layer_period == expert_layer_offset`` and a dense gated MLP
elsewhere (``JambaConfig.layers_block_type`` / ``layers_num_experts``). The spec reports the largest
block as ``layer_params`` (what FSDP's buffers are sized for) and every block in ``HybridFacts``.
Checked against ``sum(p.numel())`` of the meta-device model (``tests/model/test_hybrid_counts.py``).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from advisor.model.config_keys import config_flag
from advisor.model.kinds import SsmFacts
from advisor.model.moe import MoeFacts


class HybridFacts(BaseModel):
    """Which layer is which in a Jamba stack, and the Mamba mixer's widths."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    attention_layers: tuple[bool, ...] = Field(description="Per layer: attention (True) or a Mamba mixer.")
    expert_layers: tuple[bool, ...] = Field(description="Per layer: sparse MoE feed-forward (True) or a dense MLP.")
    block_params: tuple[int, ...] = Field(description="Parameters of each block, in order.")
    mamba_inner: int = Field(ge=1, description="Mamba mixer width (mamba_expand x hidden).")
    ssm: SsmFacts = Field(description="Mamba mixer state, conv width and dt rank.")


def _whole(*values: object) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)


def _jamba_mixer(cfg: dict, h: int, inner: int, state: int, kernel: int, rank: int) -> int:
    """``JambaMambaMixer``: in_proj (h -> 2 d), depthwise conv1d (d x K, bias with mamba_conv_bias),
    x_proj (d -> R + 2 N), dt_proj (R -> d, bias), A_log (d x N), D (d), out_proj (d -> h), biases on
    in_proj / out_proj with mamba_proj_bias, and RMSNorms on dt (R), B and C (N each)."""
    pb, cb = config_flag(cfg, "mamba_proj_bias", False), config_flag(cfg, "mamba_conv_bias", True)
    return (h * 2 * inner + 2 * inner * pb + inner * kernel + inner * cb + inner * (rank + 2 * state)
            + rank * inner + inner + inner * state + inner + inner * h + h * pb + rank + 2 * state)


def jamba_parts(cfg: dict, architecture: str | None) -> dict | None:
    """JambaForCausalLM: embeddings; per layer two RMSNorms, attention (q, k, v, o without biases,
    GQA) or the Mamba mixer, then a dense gated MLP (3 h I) or the MoE block (router E x h, E experts
    of a fused gate_up (2 I x h) and down (h x I)); a final RMSNorm; the head untied by default."""
    if architecture not in (None, "JambaForCausalLM"):
        return None
    h, inter, n_layers = cfg.get("hidden_size", 4096), cfg.get("intermediate_size", 14336), cfg.get("num_hidden_layers", 32)
    heads = cfg.get("num_attention_heads", 32)
    kv = cfg.get("num_key_value_heads") or heads
    vocab, experts, k = cfg.get("vocab_size", 65536), cfg.get("num_experts", 16), cfg.get("num_experts_per_tok", 2)
    state, kernel, expand = cfg.get("mamba_d_state", 16), cfg.get("mamba_d_conv", 4), cfg.get("mamba_expand", 2)
    rank = cfg.get("mamba_dt_rank", "auto")
    periods = [cfg.get(key, default) for key, default in (("attn_layer_period", 8), ("attn_layer_offset", 4),
                                                          ("expert_layer_period", 2), ("expert_layer_offset", 1))]
    if not _whole(h, inter, n_layers, heads, kv, vocab, experts, k, state, kernel, expand, periods[0], periods[2]) \
            or not (rank == "auto" or _whole(rank)) or h % heads:
        return None
    rank = math.ceil(h / 16) if rank == "auto" else rank
    inner = expand * h
    head_dim = h // heads
    attention = h * heads * head_dim + 2 * h * kv * head_dim + heads * head_dim * h
    mixer = _jamba_mixer(cfg, h, inner, state, kernel, rank)
    mlp, moe = 3 * h * inter, experts * h + experts * 3 * h * inter
    is_attn = tuple(i % periods[0] == periods[1] for i in range(n_layers))
    is_moe = tuple(experts > 1 and i % periods[2] == periods[3] for i in range(n_layers))
    blocks = tuple(2 * h + (attention if a else mixer) + (moe if e else mlp) for a, e in zip(is_attn, is_moe))
    largest = max(blocks)
    tied = config_flag(cfg, "tie_word_embeddings", False)
    n_dense = is_moe.count(False)
    return dict(embedding_params=vocab * h, layer_params=largest, head_params=0 if tied else vocab * h,
                other_params=h, tied_embeddings=tied, num_layers=n_layers, hidden_size=h,
                num_attention_heads=heads, num_kv_heads=kv, head_dim=head_dim, intermediate_size=inter,
                vocab_size=vocab, gated_mlp=True,
                num_experts=experts if any(is_moe) else None, num_experts_per_token=k if any(is_moe) else None,
                expert_params=3 * h * inter if any(is_moe) else None,
                moe=MoeFacts(num_dense_layers=n_dense, dense_intermediate_size=inter if n_dense else 0,
                             router="softmax", normalized_top_k=False, weights_in_compute_dtype=True)
                if any(is_moe) else None,
                max_position_embeddings=cfg.get("max_position_embeddings"),
                hybrid=HybridFacts(attention_layers=is_attn, expert_layers=is_moe, block_params=blocks,
                                   mamba_inner=inner,
                                   ssm=SsmFacts(state_size=state, conv_kernel=kernel, time_step_rank=rank)))

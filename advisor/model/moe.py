"""Exact parameter counts of mixture-of-experts decoders from a ``config.json`` dict, without torch.

What belongs here: the module trees of the MoE families whose layers are not all alike or whose
attention is not Llama's: Qwen2-MoE / Qwen3-MoE (``modeling_qwen2_moe.py``, ``modeling_qwen3_moe.py``:
a dense MLP in ``mlp_only_layers`` and off the ``decoder_sparse_step``; Qwen2-MoE adds a shared
expert with a sigmoid gate) and DeepSeek-V2/V3 (``modeling_deepseek_v3.py``: multi-head latent
attention, ``first_k_dense_replace`` dense layers, ``n_shared_experts`` always-on experts).
Mixtral, whose every layer is alike, stays with the decoder formula in ``advisor.model.architectures``.
Each formula mirrors transformers 5.x's modules and is checked against ``sum(p.numel())`` of the
model built on the meta device (``tests/model/test_moe_counts.py``).

A model whose layers differ reports its MoE layer as ``layer_params`` (the largest block, the one
FSDP's buffers are sized for) and its dense layers in ``MoeFacts`` (``num_dense_layers`` x
``dense_layer_params``). ``MoeFacts`` and ``MlaFacts`` carry what the activation model
(``advisor.estimate.activations_moe``) needs beyond a Llama shape.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from advisor.model.bundled import ArchitectureInfo
from advisor.model.config_keys import config_flag, config_value as _get


class MoeFacts(BaseModel):
    """What an MoE decoder has beyond ``num_experts`` / ``num_experts_per_token`` / one expert's width."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_dense_layers: int = Field(default=0, ge=0, description="Layers with a dense MLP instead of experts.")
    dense_layer_params: int = Field(default=0, ge=0, description="One dense layer (0 when there are none).")
    dense_intermediate_size: int = Field(default=0, ge=0, description="Dense layers' MLP width.")
    shared_intermediate_size: int = Field(default=0, ge=0, description="Always-on shared expert width (0: none).")
    shared_gate: bool = Field(default=False, description="Qwen2-MoE's sigmoid gate on the shared expert.")
    router: Literal["softmax", "sigmoid"] = Field(description="Softmax over experts (Mixtral, Qwen) or "
                                                  "DeepSeek-V3's sigmoid scores with group-limited top-k.")
    normalized_top_k: bool = Field(default=True, description="Top-k weights renormalised (norm_topk_prob).")
    weights_in_compute_dtype: bool = Field(default=False, description="Routing weights cast to the "
                                           "activations' dtype (Qwen-MoE) rather than kept in fp32.")
    num_groups: int = Field(default=1, ge=1, description="DeepSeek-V3 expert groups (n_group).")
    topk_groups: int = Field(default=1, ge=1, description="Groups a token may route to (topk_group).")


class MlaFacts(BaseModel):
    """Multi-head latent attention widths (DeepSeek-V2/V3 config keys)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    q_lora_rank: int | None = Field(default=None, ge=1, description="Query bottleneck; None: one q_proj.")
    kv_lora_rank: int = Field(ge=1)
    qk_rope_head_dim: int = Field(ge=1)
    qk_nope_head_dim: int = Field(ge=1)
    v_head_dim: int = Field(ge=1)


def _gated_mlp(h: int, inter: int) -> int:
    return 3 * h * inter  # gate, up, down without biases (every family here)


def _qwen_attention(cfg: dict, info: ArchitectureInfo, h: int, n_heads: int) -> int:
    n_kv = _get(cfg, "num_kv_heads", default=n_heads)
    head_dim = _get(cfg, "head_dim", default=h // n_heads)
    q_out, kv_out = n_heads * head_dim, n_kv * head_dim
    if info.bias_key == "qkv_bias":  # Qwen2-MoE: q, k, v biases, none on o_proj
        qkv_bias, o_bias = config_flag(cfg, "qkv_bias", True), False
    else:  # Qwen3-MoE: attention_bias on all four
        qkv_bias = o_bias = config_flag(cfg, "attention_bias", False)
    params = h * (q_out + 2 * kv_out) + q_out * h + (q_out + 2 * kv_out) * qkv_bias + h * o_bias
    return params + 2 * head_dim * info.qk_norm


def _qwen_moe_layers(cfg: dict, n_layers: int) -> list[bool]:
    """Which layers are sparse (modeling_qwen3_moe.Qwen3MoeDecoderLayer.__init__)."""
    dense = set(cfg.get("mlp_only_layers") or [])
    step = cfg.get("decoder_sparse_step", 1) or 1
    experts = _get(cfg, "num_experts", default=0)
    return [i not in dense and experts > 0 and (i + 1) % step == 0 for i in range(n_layers)]


def qwen_moe_parts(cfg: dict, info: ArchitectureInfo) -> dict | None:
    """Qwen2-MoE / Qwen3-MoE: router (E x h), E experts of ``moe_intermediate_size``; Qwen2-MoE's
    shared expert (``shared_expert_intermediate_size``) and its 1-output gate."""
    required = ("hidden_size", "num_layers", "num_attention_heads", "vocab_size", "num_experts",
                "num_experts_per_token")
    if any(_get(cfg, f) is None for f in required) or "moe_intermediate_size" not in cfg:
        return None
    h, n_layers, n_heads = _get(cfg, "hidden_size"), _get(cfg, "num_layers"), _get(cfg, "num_attention_heads")
    experts, active, moe_inter = _get(cfg, "num_experts"), _get(cfg, "num_experts_per_token"), cfg["moe_intermediate_size"]
    inter = _get(cfg, "intermediate_size")
    attention = _qwen_attention(cfg, info, h, n_heads) + 2 * h  # + input / post-attention norms
    expert = _gated_mlp(h, moe_inter)
    shared = 0
    if info.shared_expert_key:
        shared = _gated_mlp(h, cfg.get(info.shared_expert_key) or 0) + h  # shared expert + its gate
    sparse = _qwen_moe_layers(cfg, n_layers)
    if not any(sparse):
        return None
    num_dense = sparse.count(False)
    if num_dense and inter is None:
        return None
    return _parts(cfg, info, h=h, n_layers=n_layers, vocab=_get(cfg, "vocab_size"),
                  moe_layer=attention + h * experts + experts * expert + shared,
                  expert=expert, experts=experts, active=active, expert_inter=moe_inter,
                  heads=n_heads, head_dim=_get(cfg, "head_dim", default=h // n_heads),
                  kv_heads=_get(cfg, "num_kv_heads", default=n_heads),
                  moe=MoeFacts(num_dense_layers=num_dense, dense_layer_params=(attention + _gated_mlp(h, inter))
                               if num_dense else 0, dense_intermediate_size=inter if num_dense else 0,
                               shared_intermediate_size=cfg.get(info.shared_expert_key) or 0 if info.shared_expert_key else 0,
                               shared_gate=bool(info.shared_expert_key), router="softmax",
                               normalized_top_k=config_flag(cfg, "norm_topk_prob", False),
                               weights_in_compute_dtype=True))


def _mla_attention(cfg: dict, h: int, n_heads: int) -> int:
    """Multi-head latent attention (DeepSeek-V2/V3 ``DeepseekV3Attention``): q through a
    ``q_lora_rank`` bottleneck with its RMSNorm (or one q_proj when the rank is null), a joint
    kv down-projection to ``kv_lora_rank + qk_rope_head_dim`` with an RMSNorm on the latent, the
    kv up-projection to nope-keys and values for every head, and o_proj."""
    q_rank, kv_rank = cfg.get("q_lora_rank"), cfg["kv_lora_rank"]
    rope, nope, v_dim = cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    bias = config_flag(cfg, "attention_bias", False)
    qk = n_heads * (nope + rope)
    q = h * qk if q_rank is None else h * q_rank + q_rank * bias + q_rank + q_rank * qk
    kv = h * (kv_rank + rope) + (kv_rank + rope) * bias + kv_rank + kv_rank * n_heads * (nope + v_dim)
    return q + kv + n_heads * v_dim * h + h * bias


def deepseek_parts(cfg: dict, info: ArchitectureInfo) -> dict | None:
    """DeepSeek-V2/V3: MLA, ``first_k_dense_replace`` dense layers of ``intermediate_size``, then
    MoE layers of a router (E x h; V3's ``e_score_correction_bias`` is a buffer, not a parameter),
    E routed experts and ``n_shared_experts`` fused into one MLP of ``n_shared x moe_intermediate``."""
    keys = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "moe_intermediate_size",
            "n_shared_experts", "first_k_dense_replace", "intermediate_size")
    required = ("hidden_size", "num_layers", "num_attention_heads", "vocab_size", "num_experts",
                "num_experts_per_token")
    if any(k not in cfg for k in keys) or any(_get(cfg, f) is None for f in required) or cfg.get("mlp_bias"):
        return None
    h, n_layers, n_heads = _get(cfg, "hidden_size"), _get(cfg, "num_layers"), _get(cfg, "num_attention_heads")
    experts, active, moe_inter = _get(cfg, "num_experts"), _get(cfg, "num_experts_per_token"), cfg["moe_intermediate_size"]
    attention = _mla_attention(cfg, h, n_heads) + 2 * h
    expert = _gated_mlp(h, moe_inter)
    shared = _gated_mlp(h, moe_inter * (cfg["n_shared_experts"] or 0))
    num_dense = min(n_layers, cfg["first_k_dense_replace"] or 0)
    if num_dense == n_layers:
        return None
    return _parts(cfg, info, h=h, n_layers=n_layers, vocab=_get(cfg, "vocab_size"),
                  moe_layer=attention + h * experts + experts * expert + shared,
                  expert=expert, experts=experts, active=active, expert_inter=moe_inter, heads=n_heads,
                  head_dim=cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"], kv_heads=n_heads,
                  moe=MoeFacts(num_dense_layers=num_dense,
                               dense_layer_params=attention + _gated_mlp(h, cfg["intermediate_size"]) if num_dense else 0,
                               dense_intermediate_size=cfg["intermediate_size"] if num_dense else 0,
                               shared_intermediate_size=moe_inter * (cfg["n_shared_experts"] or 0),
                               router="sigmoid" if cfg.get("model_type") == "deepseek_v3" else "softmax",
                               normalized_top_k=config_flag(cfg, "norm_topk_prob", False),
                               num_groups=cfg.get("n_group") or 1, topk_groups=cfg.get("topk_group") or 1),
                  mla=MlaFacts(**{k: cfg.get(k) for k in MlaFacts.model_fields}))


def _parts(cfg: dict, info: ArchitectureInfo, *, h: int, n_layers: int, vocab: int, moe_layer: int,
           expert: int, experts: int, active: int, expert_inter: int, heads: int, head_dim: int, kv_heads: int,
           moe: MoeFacts, mla: MlaFacts | None = None) -> dict:
    tied = config_flag(cfg, "tie_word_embeddings", info.tie_word_embeddings)
    return dict(
        embedding_params=vocab * h,
        layer_params=moe_layer,
        moe=moe,
        mla=mla,
        head_params=0 if tied else vocab * h,
        other_params=h,  # final norm
        tied_embeddings=tied,
        num_layers=n_layers,
        hidden_size=h,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=expert_inter,
        vocab_size=vocab,
        gated_mlp=True,
        num_experts=experts,
        num_experts_per_token=active,
        expert_params=expert,
        max_position_embeddings=cfg.get("max_position_embeddings"),
    )

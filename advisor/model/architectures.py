"""Exact parameter counts from a ``config.json`` dict, without torch or transformers.

Three formulas here cover the dense bundled families (which model_type uses which is data, in
``profiles/architectures.json``): a pre-norm decoder (Llama, Mistral, Qwen2/3, Gemma/Gemma 2,
Phi-3, Mixtral), GPT-2 and BERT. Each mirrors the module tree of the transformers modeling file
(``modeling_llama.py``, ``modeling_gpt2.py``, ``modeling_bert.py``) and is checked against
``sum(p.numel())`` of a model built on the meta device in ``tests/test_architectures.py``.
Mixture-of-experts families whose layers differ (Qwen-MoE, DeepSeek) are counted in
``advisor.model.moe``. A config this module cannot count returns ``None``; the caller falls back to the meta device.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError

from advisor.frozen import validated_copy
from advisor.model.bundled import ArchitectureInfo, load_architectures
from advisor.model.config_keys import CONFIG_KEYS, PER_LAYER_FACTS, config_flag, config_value as _get
from advisor.model.kinds import (bart_parts, mamba_parts, qwen2_vl_vision_facts, qwen2_vl_vision_params,
                                 qwen_vl_vision_facts, qwen_vl_vision_params, t5_parts)
from advisor.model.hybrid import jamba_parts
from advisor.model.llava import clip_tower, llava_text_config
from advisor.model.moe import deepseek_parts, qwen_moe_parts
from advisor.model.spec import ModelSpec, Source, validation_problem


def _dtype(cfg: dict) -> str | None:
    value = _get(cfg, "dtype")
    return str(value) if value is not None else None


def _tied(cfg: dict, info: ArchitectureInfo) -> bool:
    return config_flag(cfg, "tie_word_embeddings", info.tie_word_embeddings)


def _decoder(cfg: dict, info: ArchitectureInfo) -> dict | None:
    """Pre-norm decoder: embeddings, N x (attention + MLP + norms), final norm, head."""
    required = ("hidden_size", "num_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    if any(_get(cfg, fact) is None for fact in required):
        return None
    h, n_layers, n_heads = _get(cfg, "hidden_size"), _get(cfg, "num_layers"), _get(cfg, "num_attention_heads")
    inter, vocab = _get(cfg, "intermediate_size"), _get(cfg, "vocab_size")
    n_kv = _get(cfg, "num_kv_heads", default=n_heads)
    head_dim = _get(cfg, "head_dim", default=h // n_heads)
    qkv_bias, o_bias = info.qkv_bias, info.o_bias
    if info.bias_key and info.bias_key in cfg:
        qkv_bias = o_bias = config_flag(cfg, info.bias_key, False)
    mlp_bias = config_flag(cfg, info.mlp_bias_key, False) if info.mlp_bias_key else False
    q_out, kv_out = n_heads * head_dim, n_kv * head_dim
    attention = h * (q_out + 2 * kv_out) + q_out * h
    attention += (q_out + 2 * kv_out) * qkv_bias + h * o_bias
    attention += 2 * head_dim * info.qk_norm
    expert = 3 * h * inter + (2 * inter + h) * mlp_bias
    num_experts = num_active = None
    if info.moe:
        num_experts = _get(cfg, "num_experts")
        num_active = _get(cfg, "num_experts_per_token")
        if num_experts is None or num_active is None:
            return None
        mlp = h * num_experts + num_experts * expert  # router + experts
    else:
        mlp = expert
    layer = attention + mlp + info.norms_per_layer * h
    tied = _tied(cfg, info)
    return dict(
        embedding_params=vocab * h,
        layer_params=layer,
        head_params=0 if tied else vocab * h,
        other_params=h,  # final norm
        tied_embeddings=tied,
        num_layers=n_layers,
        hidden_size=h,
        num_attention_heads=n_heads,
        num_kv_heads=n_kv,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        gated_mlp=True,
        num_experts=num_experts,
        num_experts_per_token=num_active,
        expert_params=expert if info.moe else None,
        max_position_embeddings=cfg.get("max_position_embeddings"),
        sliding_window=(cfg.get("sliding_window") or None) if info.window_every_layer else None,
        attn_softcap=bool(cfg.get("attn_logit_softcapping", info.softcapping)),
        logit_softcap=bool(cfg.get("final_logit_softcapping", info.softcapping)),
    )


ONE_OP_ACTIVATIONS = ("gelu", "gelu_pytorch_tanh", "relu")


def _gpt2(cfg: dict, info: ArchitectureInfo) -> dict | None:
    """GPT-2: learned positions, Conv1D projections with biases, LayerNorm with biases."""
    h = _get(cfg, "hidden_size", default=768)
    n_layers = _get(cfg, "num_layers", default=12)
    n_heads = _get(cfg, "num_attention_heads", default=12)
    positions = _get(cfg, "max_position_embeddings", default=1024)
    vocab = _get(cfg, "vocab_size", default=50257)
    inter = _get(cfg, "intermediate_size", default=4 * h)
    layer = 2 * (2 * h) + (h * 3 * h + 3 * h) + (h * h + h) + (h * inter + inter) + (inter * h + h)
    tied = _tied(cfg, info)
    return dict(
        embedding_params=vocab * h,
        layer_params=layer,
        head_params=0 if tied else vocab * h,
        other_params=positions * h + 2 * h,  # wpe + ln_f
        tied_embeddings=tied,
        num_layers=n_layers,
        hidden_size=h,
        num_attention_heads=n_heads,
        num_kv_heads=n_heads,
        head_dim=h // n_heads,
        intermediate_size=inter,
        vocab_size=vocab,
        gated_mlp=False,
        max_position_embeddings=positions,
        learned_positions=True,
        # transformers' ACT2FN: 'gelu' is F.gelu, 'gelu_pytorch_tanh' F.gelu(approximate='tanh'), 'relu'
        # nn.ReLU: one op each; the default 'gelu_new' is NewGELUActivation, a chain of Python ops.
        one_op_mlp_act=cfg.get("activation_function", "gelu_new") in ONE_OP_ACTIVATIONS,
        # GPT2Config's dropouts default to 0.1; at 0 torch's dropout returns its input (aten Dropout.cpp:
        # the fused kernel only for 0 < p < 1, ``_dropout`` returns the input for p == 0): no mask saved.
        no_residual_dropout=cfg.get("resid_pdrop", 0.1) == 0,
        no_embedding_dropout=cfg.get("embd_pdrop", 0.1) == 0,
    )


def _bert(cfg: dict, info: ArchitectureInfo, architecture: str | None) -> dict | None:
    """BERT encoder; the head depends on the class (masked-LM head or pooler)."""
    h = _get(cfg, "hidden_size", default=768)
    n_layers = _get(cfg, "num_layers", default=12)
    n_heads = _get(cfg, "num_attention_heads", default=12)
    inter = _get(cfg, "intermediate_size", default=3072)
    vocab = _get(cfg, "vocab_size", default=30522)
    positions = _get(cfg, "max_position_embeddings", default=512)
    types = _get(cfg, "type_vocab_size", default=2)
    layer = 4 * (h * h + h) + 2 * h + (h * inter + inter) + (inter * h + h) + 2 * h
    tied = _tied(cfg, info)
    if architecture in (None, "BertForMaskedLM"):
        head = (h * h + h) + 2 * h + vocab + (0 if tied else vocab * h)  # transform, LN, decoder bias
    elif architecture == "BertModel":
        head = h * h + h  # pooler
    else:
        return None
    return dict(
        embedding_params=vocab * h,
        layer_params=layer,
        head_params=head,
        other_params=positions * h + types * h + 2 * h,  # positions, token types, embedding LN
        tied_embeddings=tied,
        num_layers=n_layers,
        hidden_size=h,
        num_attention_heads=n_heads,
        num_kv_heads=n_heads,
        head_dim=h // n_heads,
        intermediate_size=inter,
        vocab_size=vocab,
        gated_mlp=False,
        max_position_embeddings=positions,
        learned_positions=True,
    )


def architecture_of(cfg: dict) -> str | None:
    archs = cfg.get("architectures") or []
    return archs[0] if archs else None


def count_from_config(cfg: dict, *, name: str, source: Source,
                      behaviours: Mapping[str, str] | None = None) -> ModelSpec | None:
    """Exact counts for a known family, or ``None`` (unknown family or unusual config). ``behaviours``:
    the library release behaviours in force (``advisor.model.releases``; the resolver passes the installed ones)."""
    info = load_architectures().get(cfg.get("model_type", ""))
    if info is None:
        return None
    for sub in (cfg, cfg.get("text_config") or {}):
        listed = [key for fact in PER_LAYER_FACTS for key in CONFIG_KEYS[fact] if isinstance(sub.get(key), list)]
        if listed:  # Gemma 3n's per-layer widths: families counted on the meta device, not these formulas
            raise ValueError(f"config for '{name}': \"{listed[0]}\" is a per-layer list; {cfg['model_type']} "
                             "takes one value for every layer")
    try:
        return _count(cfg, info, name=name, source=source, behaviours=behaviours or {})
    except (TypeError, ZeroDivisionError) as err:  # pure arithmetic on config values: one is missing or wrong
        raise ValueError(f"config for '{name}': cannot count a {cfg['model_type']} from it ({err})") from None
    except ValidationError as err:  # e.g. 64 wide with 10^10 heads: a head 0 wide (transformers refuses it too)
        raise ValueError(f"config for '{name}': its sizes give no valid {cfg['model_type']}: "
                         f"{validation_problem(err)}") from None


def _count(cfg: dict, info: ArchitectureInfo, *, name: str, source: Source,
           behaviours: Mapping[str, str]) -> ModelSpec | None:
    architecture = architecture_of(cfg)
    if info.formula in ("t5", "bart", "mamba", "jamba"):  # advisor.model.kinds, advisor.model.hybrid
        parts = {"t5": t5_parts, "bart": bart_parts, "mamba": mamba_parts, "jamba": jamba_parts}[info.formula](cfg, architecture)
        return None if parts is None else _spec(cfg, parts, info, name=name, source=source, architecture=architecture)
    generative = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
    if architecture is not None and not architecture.endswith(generative) and info.formula != "bert":
        return None  # classification heads and the like: let the meta device count them
    if info.formula == "decoder":
        parts = _decoder(cfg, info)
    elif info.formula == "qwen_vl":  # the language model is a Qwen2 decoder; the vision tower is 'other'
        parts = _decoder({**cfg, **(cfg.get("text_config") or {})}, info)
        if parts is not None:
            vision = cfg.get("vision_config") or {}
            qwen2 = cfg.get("model_type") == "qwen2_vl"  # Qwen2-VL's tower: LayerNorms and an fc1 / fc2 MLP
            parts["other_params"] += (qwen2_vl_vision_params if qwen2 else qwen_vl_vision_params)(vision)
            parts["image_token_pixels"] = vision.get("patch_size", 14) * vision.get("spatial_merge_size", 2)
            parts["vision"] = (qwen2_vl_vision_facts if qwen2 else qwen_vl_vision_facts)(vision)
    elif info.formula == "llava":  # advisor.model.llava: the language model's own formula, the tower 'other'
        return _llava(cfg, name=name, source=source, architecture=architecture, behaviours=behaviours)
    elif info.formula == "qwen_moe":
        parts = qwen_moe_parts(cfg, info)
    elif info.formula == "deepseek":
        parts = deepseek_parts(cfg, info)
    elif info.formula == "gpt2":
        parts = _gpt2(cfg, info)
    else:
        parts = _bert(cfg, info, architecture)
    if parts is None:
        return None
    return _spec(cfg, parts, info, name=name, source=source, architecture=architecture)


def _llava(cfg: dict, *, name: str, source: Source, architecture: str | None,
           behaviours: Mapping[str, str]) -> ModelSpec | None:
    """Llava: a decoder language model (block class and formula of its text_config's model_type)
    plus the CLIP tower and projector; ``None`` (the meta device counts it) for any other pair.
    ``behaviours``: the release behaviours in force (``advisor.model.releases``)."""
    text, kind = llava_text_config(cfg)
    tower = clip_tower(cfg, output_keeps_tower=behaviours.get("llava_output_keeps_vision_tower"))
    text_info = load_architectures().get(kind)
    if text_info is None or text_info.formula != "decoder" or tower is None:
        return None
    parts = _decoder(text, text_info)
    if parts is None:
        return None
    parts["other_params"] += tower[0]
    parts.update(vision=tower[1], tokens_per_image=tower[1].image_tokens)
    spec = _spec(cfg, parts, text_info, name=name, source=source, architecture=architecture)
    # FSDP units: the language model's blocks, then the tower's (CLIPEncoderLayer)
    return validated_copy(spec, {"block_classes": (*spec.block_classes, tower[1].block_class)})


def _spec(cfg: dict, parts: dict, info: ArchitectureInfo, *, name: str, source: Source,
          architecture: str | None) -> ModelSpec:
    total = parts["embedding_params"] + parts["num_layers"] * (parts.get("layer_params") or 0)
    total += parts["head_params"] + parts["other_params"]
    moe, hybrid = parts.get("moe"), parts.get("hybrid")
    if hybrid is not None:  # Jamba: each block as it is, not the largest
        total -= len(hybrid.block_params) * parts["layer_params"] - sum(hybrid.block_params)
    elif moe is not None and moe.num_dense_layers:  # dense layers hold less than the MoE layer counted above
        total -= moe.num_dense_layers * (parts["layer_params"] - moe.dense_layer_params)
    return ModelSpec(
        name=name,
        source=source,
        count_method="formula",
        architecture=architecture,
        model_type=cfg.get("model_type"),
        total_params=total,
        trainable_params=total,
        block_classes=info.block_classes,
        dtype=_dtype(cfg),
        **parts,
    )

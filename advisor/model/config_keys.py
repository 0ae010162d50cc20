"""The one table of ``config.json`` key aliases, and the one check of config values.

Families spell the same fact differently (GPT-2's ``n_embd`` is everyone else's ``hidden_size``;
Mixtral's ``num_local_experts`` is Qwen-MoE's ``num_experts``). Every reader of a config (the
counting formulas, the meta-device path, the simulator) looks a fact up here, so an alias is
added once. Sources: the ``attribute_map`` of each transformers ``configuration_<model>.py``
(gpt2: ``hidden_size -> n_embd``, ``num_hidden_layers -> n_layer``, ...).

``check_config`` validates the values once, where configs are read (``advisor.model.sources``):
a bad value becomes one ``ValueError`` naming the key, the value and what is expected, instead of
a ``TypeError`` deep inside a formula or a screenful of pydantic errors.
"""

from __future__ import annotations

from typing import Any

# fact -> config keys that carry it, in the order they are tried.
CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd"),
    "num_layers": ("num_hidden_layers", "n_layer"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_kv_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "intermediate_size": ("intermediate_size", "n_inner"),
    "vocab_size": ("vocab_size",),
    "max_position_embeddings": ("max_position_embeddings", "n_positions"),
    "type_vocab_size": ("type_vocab_size",),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "num_experts_per_token": ("num_experts_per_tok",),
    "dtype": ("dtype", "torch_dtype"),
    # Attention dropout (gpt2, llama-likes, bert): the simulator sets every spelling to 0.
    "attention_dropout": ("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob"),
}

# Facts that must be whole numbers, and the least each may be: 0 where a config uses 0 for "none"
# (no token types, a dense model's num_experts). Only the facts in PER_LAYER_FACTS may be lists
# (per-layer widths, as in Gemma 3n's intermediate_size), checked element by element.
_INTEGER_FACTS: dict[str, int] = {
    "hidden_size": 1, "num_layers": 1, "num_attention_heads": 1, "num_kv_heads": 1, "head_dim": 1,
    "intermediate_size": 1, "vocab_size": 1, "max_position_embeddings": 1, "type_vocab_size": 0,
    "num_experts": 0, "num_experts_per_token": 0,
}
PER_LAYER_FACTS = ("intermediate_size", "num_attention_heads", "num_kv_heads")

# Other keys the counting formulas and the simulator read, typed as transformers 5's strict config
# dataclasses type them (``LlamaConfig.tie_word_embeddings: bool``, ``DeepseekV3Config.qk_rope_head_dim:
# int``, ``Qwen2_5_VLVisionConfig.out_hidden_size: int``): a string "false" is not a flag, ``true`` is not
# a width. Checked here because the formula path never builds a transformers config.
_FLAG_KEYS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "qkv_bias", "use_bias", "use_conv_bias",
              "norm_topk_prob", "mamba_proj_bias", "mamba_conv_bias", "multimodal_projector_bias",
              "add_final_layer_norm", "is_encoder_decoder", "tie_encoder_decoder")
_WIDTH_KEYS: dict[str, int] = {  # key -> least value
    "qk_rope_head_dim": 0, "qk_nope_head_dim": 0, "v_head_dim": 1, "kv_lora_rank": 1, "q_lora_rank": 1,
    "out_hidden_size": 1, "patch_size": 1, "spatial_merge_size": 1, "temporal_patch_size": 1, "in_chans": 1,
    "in_channels": 1, "depth": 1, "embed_dim": 1, "d_model": 1, "n_group": 1, "topk_group": 1, "state_size": 1,
    "relative_attention_num_buckets": 1, "num_decoder_layers": 1, "num_channels": 1, "mamba_expand": 1,
    "mamba_d_state": 1, "mamba_d_conv": 1, "expand": 1, "conv_kernel": 1, "encoder_layers": 0, "decoder_layers": 1,
    "encoder_ffn_dim": 1, "decoder_ffn_dim": 1, "encoder_attention_heads": 1, "decoder_attention_heads": 1,
    "d_kv": 1, "d_ff": 1, "decoder_sparse_step": 1, "moe_intermediate_size": 1, "n_shared_experts": 0,
    "shared_expert_intermediate_size": 0, "first_k_dense_replace": 0, "image_size": 1, "moe_layer_freq": 1,
    "attn_layer_offset": 0, "attn_layer_period": 1, "expert_layer_offset": 0, "expert_layer_period": 1,
    "projection_dim": 1, "num_nextn_predict_layers": 0, "num_layers": 1,
}
_LISTABLE_WIDTHS = ("image_size", "conv_kernel")  # (height, width); one kernel per conv layer (Wav2Vec2)
_NULLABLE = ("q_lora_rank",)  # DeepSeek-V2-Lite: no query compression
_INDEX_LIST_KEYS = ("mlp_only_layers", "fullatt_block_indexes")
_SUB_CONFIGS = ("text_config", "vision_config", "encoder_config", "decoder_config", "audio_config")
_AUTO_KEYS = ("time_step_rank", "mamba_dt_rank")  # a positive integer or "auto" (Mamba, Jamba)
_TEXT_KEYS = ("model_type", "hidden_act", "activation_function", "feed_forward_proj", "dtype", "torch_dtype",
              "vision_feature_select_strategy", "scoring_func", "topk_method")
_FRACTION_KEYS = ("activation_dropout", "attention_dropout", "attn_pdrop", "attention_probs_dropout_prob",
                  "hidden_dropout_prob", "resid_pdrop", "embd_pdrop", "dropout", "dropout_rate")
# Per-layer loops (the meta device builds every block; the hybrid pattern lists them) are bounded: the
# deepest published models have a few hundred blocks and a few hundred experts.
MAX_LAYERS = 10_000
MAX_WIDTH = 2**24  # widths, heads, vocabularies: the largest published are near 2**18
MAX_LENGTH = 2**40  # max_position_embeddings
_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "n_ctx")
_INTEGER_KEYS = tuple(key for fact in _INTEGER_FACTS for key in CONFIG_KEYS[fact])
MAX_EXPERTS = 65_536
MAX_NUM_LABELS = 10**7  # a classification head, not a vocabulary (--num-labels has the same bound)
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers",
               "num_decoder_layers", "depth")


def _lookup(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def config_value(config: Any, fact: str, default: Any = None) -> Any:
    """The first non-null value of ``fact`` under any of its keys, in a config dict or object."""
    for key in CONFIG_KEYS[fact]:
        value = _lookup(config, key)
        if value is not None:
            return value
    return default


def _check_values(cfg: dict, name: str, prefix: str = "") -> None:
    def fail(key: str, value: Any, expected: str) -> None:
        raise ValueError(f"config for '{name}': \"{prefix}{key}\" is {_show(value)}; expected {expected}")

    for fact, minimum in _INTEGER_FACTS.items():
        for key in CONFIG_KEYS[fact]:
            value = cfg.get(key)
            if value is None:
                continue
            listed = isinstance(value, list) and value and fact in PER_LAYER_FACTS
            if any(_bad(v, minimum) for v in (value if listed else [value])):
                fail(key, value, "a positive integer" if minimum else "a whole number, 0 or more")
    for key, value in cfg.items():
        if value is None:
            if key in _WIDTH_KEYS and key not in _NULLABLE:
                fail(key, value, "a number (the counting formulas have no default for it)")
            continue
        if key in _FLAG_KEYS and not isinstance(value, bool):
            fail(key, value, "true or false")
        elif key in _WIDTH_KEYS and _bad(value, _WIDTH_KEYS[key]) and not (
                key in _LISTABLE_WIDTHS and isinstance(value, list) and value and not any(_bad(v, 1) for v in value)):
            fail(key, value, "a positive integer" if _WIDTH_KEYS[key] else "a whole number, 0 or more")
        elif key in _AUTO_KEYS and value != "auto" and _bad(value, 1):
            fail(key, value, 'a positive integer or "auto"')
        elif key in _TEXT_KEYS and not isinstance(value, str):
            fail(key, value, "a string")
        elif key in _FRACTION_KEYS and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                            and 0 <= value <= 1):
            fail(key, value, "a probability between 0 and 1")
        elif key == "architectures" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            fail(key, value, "a list of class names")
        elif key in _INDEX_LIST_KEYS and not (isinstance(value, list) and not any(_bad(v, 0) for v in value)):
            fail(key, value, "a list of layer indices")
        elif key.endswith("_config") and key in _SUB_CONFIGS and not isinstance(value, dict):
            fail(key, value, "an object (a nested config)")
    _check_bounds(cfg, fail)
    _check_rotary_width(cfg, fail)


def _check_rotary_width(cfg: dict, fail: Any) -> None:
    """A partial rotary share must rotate an even number of each head's dimensions. transformers rotates
    ``int(head_dim x factor)`` of them (modeling_phi.py ``PhiAttention.rotary_ndims``, the same in GPT-NeoX,
    StableLM, Persimmon) but builds ``2 x len(arange(0, width, 2))`` cos/sin dimensions
    (``compute_default_rope_parameters``): one more when the width is odd, and every forward fails in
    ``apply_rotary_pos_emb`` with a broadcast error (Phi, head_dim 128 x 0.4 = 51 against 52), on one CPU as
    under FSDP2 or checkpointing. transformers' limitation, not a memory question: refused here in one line."""
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    key = next((k for k in ("partial_rotary_factor", "rotary_pct") if cfg.get(k) is not None), None)
    factor = cfg[key] if key else rope.get("partial_rotary_factor")
    hidden, heads = config_value(cfg, "hidden_size"), config_value(cfg, "num_attention_heads")
    head_dim = config_value(cfg, "head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int)
                                                 and not isinstance(heads, bool) and heads > 0 else None)
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not isinstance(head_dim, int) \
            or not 0 < factor <= 1:
        return
    width = int(head_dim * factor)
    if width % 2:
        fail(key or "rope_parameters.partial_rotary_factor", factor,
             f"a share of head_dim {head_dim} that rotates an even width (int({head_dim} x {factor}) = {width}: "
             f"transformers builds {width + 1} cos/sin dimensions against the {width} it rotates, and the model's "
             f"forward fails)")


def _check_bounds(cfg: dict, fail: Any) -> None:
    _check_groups(cfg, fail)
    for key in _LAYER_KEYS:
        value = cfg.get(key)
        if isinstance(value, int) and value > MAX_LAYERS:
            fail(key, value, f"at most {MAX_LAYERS:,} blocks (the deepest published models have a few hundred)")
    for key in CONFIG_KEYS["num_experts"]:
        value = cfg.get(key)
        if isinstance(value, int) and value > MAX_EXPERTS:
            fail(key, value, f"at most {MAX_EXPERTS:,} experts")
    labels = cfg.get("num_labels")
    if isinstance(labels, int) and labels > MAX_NUM_LABELS:  # transformers builds an id2label entry for each label
        fail("num_labels", labels, f"at most {MAX_NUM_LABELS:,} (a classification head, not a vocabulary)")
    if isinstance(cfg.get("id2label"), dict) and len(cfg["id2label"]) > MAX_NUM_LABELS:
        fail("id2label", f"{len(cfg['id2label']):,} labels", f"at most {MAX_NUM_LABELS:,} labels")
    for key, value in cfg.items():
        limit = MAX_LENGTH if key in _LENGTH_KEYS else MAX_WIDTH
        if (key in _WIDTH_KEYS or key in _INTEGER_KEYS) and any(
                isinstance(v, int) and v > limit for v in (value if isinstance(value, list) else [value])):
            fail(key, value, f"at most {limit:,}")


def _check_groups(cfg: dict, fail: Any) -> None:
    """Counts that only make sense against another: a token's experts among the experts there are, and key-value
    heads that each serve a whole group of query heads (transformers' repeat_kv splits the queries evenly).
    Without these the counts and the step's FLOPs come out of a model that cannot be built or run."""
    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value > 0

    per, experts = config_value(cfg, "num_experts_per_token"), config_value(cfg, "num_experts")
    if whole(per) and whole(experts) and per > experts:
        fail(next(k for k in CONFIG_KEYS["num_experts_per_token"] if cfg.get(k) is not None), per,
             f"at most the {experts} experts there are")
    heads, kv = config_value(cfg, "num_attention_heads"), config_value(cfg, "num_kv_heads")
    if whole(heads) and whole(kv) and (kv > heads or heads % kv):
        fail(next(k for k in CONFIG_KEYS["num_kv_heads"] if cfg.get(k) is not None), kv,
             f"a divisor of the {heads} attention heads (each key-value head serves a whole group of queries)")


def _bad(value: Any, minimum: int) -> bool:
    return isinstance(value, bool) or not isinstance(value, int) or value < minimum


def _show(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else f'"{value}"'
    return text if len(text) <= 40 else text[:37] + "..."


def config_flag(cfg: dict, key: str, default: bool) -> bool:
    """A true/false config key (``check_config`` has rejected any other type); ``default`` when absent or null."""
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f'config: "{key}" is {_show(value)}; expected true or false')
    return value


def check_config(cfg: Any, *, name: str) -> dict:
    """``cfg`` itself when it is a config dict with a model_type and sane shape values; else one
    ``ValueError``. Sub-configs (``text_config``, ``vision_config``: Llava, CLIP) are checked too."""
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ValueError(f"config for '{name}' has no model_type; is it a transformers config.json?")
    _check_values(cfg, name)
    for key, sub in cfg.items():
        if key.endswith("_config") and isinstance(sub, dict):
            _check_values(sub, name, prefix=f"{key}.")
    return cfg

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
# (no token types, a dense model's num_experts). A list (per-layer widths, as in Gemma 3n's
# intermediate_size) is checked element by element.
_INTEGER_FACTS: dict[str, int] = {
    "hidden_size": 1, "num_layers": 1, "num_attention_heads": 1, "num_kv_heads": 1, "head_dim": 1,
    "intermediate_size": 1, "vocab_size": 1, "max_position_embeddings": 1, "type_vocab_size": 0,
    "num_experts": 0, "num_experts_per_token": 0,
}


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
    for fact, minimum in _INTEGER_FACTS.items():
        for key in CONFIG_KEYS[fact]:
            value = cfg.get(key)
            if value is None:
                continue
            if any(_bad(v, minimum) for v in (value if isinstance(value, list) and value else [value])):
                expected = "a positive integer" if minimum else "a whole number, 0 or more"
                raise ValueError(f"config for '{name}': \"{prefix}{key}\" is {_show(value)}; expected {expected}")


def _bad(value: Any, minimum: int) -> bool:
    return isinstance(value, bool) or not isinstance(value, int) or value < minimum


def _show(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else f'"{value}"'
    return text if len(text) <= 40 else text[:37] + "..."


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

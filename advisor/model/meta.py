"""Counts from real ``torch.nn.Module`` objects: a live model, or one built on the meta device.

This is the slow, always-right path (it imports torch and transformers): for architectures with no
formula in ``advisor.model.architectures``, for live models handed to the library, and as the reference
the formulas are tested against. Building on the meta device allocates no memory and loads no
weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from advisor.model.spec import ModelSpec, Source

if TYPE_CHECKING:  # pragma: no cover
    import torch


def _config_dict(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if not k.startswith("_advisor")}


def build_meta_model(cfg: dict, *, trust_remote_code: bool = False, local_dir: str | None = None) -> "torch.nn.Module":
    """Instantiate the model class named by the config on the meta device (no weights, no memory)."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    model_type = cfg.get("model_type")
    if local_dir is not None and trust_remote_code:
        config = AutoConfig.from_pretrained(local_dir, trust_remote_code=True)
    else:
        if cfg.get("auto_map") and not trust_remote_code and model_type not in transformers.CONFIG_MAPPING:
            raise ValueError(
                f"model_type '{model_type}' needs the model's own code; pass --trust-remote-code to run it"
            )
        try:
            config = AutoConfig.for_model(model_type, **{k: v for k, v in _config_dict(cfg).items() if k != "model_type"})
        except (KeyError, ValueError) as err:
            raise ValueError(f"transformers does not know model_type '{model_type}': {err}") from None
    archs = getattr(config, "architectures", None) or []
    model_cls = getattr(transformers, archs[0], None) if archs else None
    with torch.device("meta"):
        if model_cls is not None:
            return model_cls(config)
        try:
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        except ValueError:
            return AutoModel.from_config(config, trust_remote_code=trust_remote_code)


def _shape_fields(config: Any) -> dict:
    """Shape fields from a transformers config object (attribute maps resolve gpt2's n_embd etc.)."""
    if config is None:
        return {}
    get = lambda name: getattr(config, name, None)  # noqa: E731
    hidden, heads = get("hidden_size"), get("num_attention_heads")
    head_dim = get("head_dim") or (hidden // heads if hidden and heads else None)
    experts = get("num_local_experts") or get("num_experts")
    active = get("num_experts_per_tok") if experts else None
    archs = get("architectures") or []
    dtype = get("dtype") if get("dtype") is not None else get("torch_dtype")
    return dict(
        architecture=archs[0] if archs else None,
        model_type=get("model_type"),
        num_layers=get("num_hidden_layers"),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=get("num_key_value_heads") or heads,
        head_dim=head_dim,
        intermediate_size=get("intermediate_size") or get("n_inner") or (4 * hidden if hidden else None),
        vocab_size=get("vocab_size"),
        num_experts=experts if experts and active else None,
        num_experts_per_token=active if experts and active else None,
        max_position_embeddings=get("max_position_embeddings"),
        dtype=str(dtype).replace("torch.", "") if dtype is not None else None,
    )


def _components(module: "torch.nn.Module", total: int) -> dict:
    """Embeddings, one block, head and the rest, when the blocks are identical; else nothing."""
    import torch

    no_split = list(getattr(module, "_no_split_modules", None) or [])
    by_class: dict[str, list] = {}
    for m in module.modules():
        if type(m).__name__ in no_split:
            by_class.setdefault(type(m).__name__, []).append(m)
    blocks = max(by_class.values(), key=len, default=[])  # the repeated block, not e.g. BertEmbeddings
    get_in = getattr(module, "get_input_embeddings", None)
    get_out = getattr(module, "get_output_embeddings", None)
    embedding = get_in() if callable(get_in) else None
    if not blocks or not isinstance(embedding, torch.nn.Module):
        return {}
    sizes = {sum(p.numel() for p in b.parameters()) for b in blocks}
    if len(sizes) != 1:
        return {}
    emb = embedding.weight.numel()
    head_module = get_out() if callable(get_out) else None
    tied = head_module is not None and head_module.weight is embedding.weight
    head = 0 if head_module is None or tied else head_module.weight.numel()
    layer = sizes.pop()
    other = total - emb - len(blocks) * layer - head
    if other < 0:
        return {}
    return dict(
        embedding_params=emb,
        layer_params=layer,
        head_params=head,
        other_params=other,
        tied_embeddings=tied,
        num_layers=len(blocks),
        block_class=type(blocks[0]).__name__,
    )


def spec_from_module(
    module: "torch.nn.Module", *, name: str | None = None, source: Source = "module"
) -> ModelSpec:
    """Exact counts of a live module: shared parameters once, ``requires_grad`` ones trainable."""
    params = list(module.parameters())  # nn.Module.parameters() already yields a shared tensor once
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    config = getattr(module, "config", None)
    fields = {k: v for k, v in _shape_fields(config).items() if v is not None}
    fields.update(_components(module, total))
    if fields.get("architecture") is None:
        fields["architecture"] = type(module).__name__
    return ModelSpec(
        name=name or fields["architecture"],
        source=source,
        count_method="module" if source == "module" else "meta_device",
        total_params=total,
        trainable_params=trainable,
        **fields,
    )

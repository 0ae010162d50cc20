"""Counts from real ``torch.nn.Module`` objects: a live model, or one built on the meta device.

This is the slow, always-right path (it imports torch and transformers): for architectures with no
formula in ``advisor.model.architectures``, for live models handed to the library, and as the reference
the formulas are tested against. Building on the meta device allocates no memory and loads no
weights. Any ``nn.Module`` is accepted: shape fields come from its config when it has one (the
language model's, for a composite config such as Llava's), ``vocab_size`` only when it has token
embeddings, components only when it has identical repeated blocks.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from advisor.model.config_keys import config_value
from advisor.model.spec import ModelSpec, Source, validation_problem

if TYPE_CHECKING:  # pragma: no cover
    import torch


def _config_dict(cfg: dict) -> dict:
    """A deep copy of the config's own fields: transformers edits nested dicts in place (it adds
    ``rope_theta`` to ``rope_scaling`` while validating), and the caller's dict keys the caches
    (``advisor.model.spec_cache.config_digest``), so transformers never sees it."""
    return copy.deepcopy({k: v for k, v in cfg.items() if not k.startswith("_advisor")})


def _one_line(err: BaseException) -> str:
    """An exception and its cause as one short line (transformers 5 wraps config validation
    errors in huggingface_hub's StrictDataclass*ValidationError, with the reason in the cause)."""
    text = " ".join(str(err).split())
    cause = " ".join(str(err.__cause__ or "").split())
    if cause and cause not in text:
        text = f"{text} {cause}"
    return text if len(text) <= 300 else text[:297] + "..."


def _build_config(cfg: dict, *, trust_remote_code: bool, local_dir: str | None) -> Any:
    import transformers
    from transformers import AutoConfig

    model_type = cfg.get("model_type")
    if local_dir is not None and trust_remote_code:
        if model_type not in transformers.CONFIG_MAPPING and not cfg.get("auto_map"):  # no code of its own to run
            raise ValueError(f"transformers {transformers.__version__} does not know model_type '{model_type}'")
        try:
            return AutoConfig.from_pretrained(local_dir, trust_remote_code=True)
        except Exception as err:  # transformers' validation, or the model's own config code: the user's files
            raise ValueError(f"transformers rejects this {model_type} config: {_one_line(err)}") from None
    if model_type not in transformers.CONFIG_MAPPING:
        if cfg.get("auto_map") and not trust_remote_code:
            raise ValueError(f"building model_type '{model_type}' on the meta device needs the model's own code "
                             "(its config's auto_map); pass --trust-remote-code to run it, or --params SIZE")
        raise ValueError(f"transformers {transformers.__version__} does not know model_type '{model_type}': give its "
                         "size instead (--params 7B; a Llama-like shape), or a directory whose config names its own "
                         "code (auto_map) with --trust-remote-code")
    try:
        return AutoConfig.for_model(model_type, **{k: v for k, v in _config_dict(cfg).items() if k != "model_type"})
    except Exception as err:  # transformers' own validation of the values: the user's config is at fault
        raise ValueError(f"transformers rejects this {model_type} config: {_one_line(err)}") from None


def build_meta_model(cfg: dict, *, trust_remote_code: bool = False, local_dir: str | None = None) -> "torch.nn.Module":
    """Instantiate the model class named by the config on the meta device (no weights, no memory)."""
    import torch
    import transformers
    from transformers import AutoModel, AutoModelForCausalLM

    config = _build_config(cfg, trust_remote_code=trust_remote_code, local_dir=local_dir)
    archs = getattr(config, "architectures", None) or []
    model_cls = getattr(transformers, archs[0], None) if archs and isinstance(archs[0], str) else None
    is_model = isinstance(model_cls, type) and issubclass(model_cls, transformers.PreTrainedModel)
    if model_cls is not None and not is_model:
        raise ValueError(f"config's \"architectures\" names {archs[0]}, which is not a transformers model class")
    try:
        with torch.device("meta"):
            if model_cls is not None:
                return untie_stored_head(model_cls(config), cfg)
            try:
                model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
            except ValueError:
                model = AutoModel.from_config(config, trust_remote_code=trust_remote_code)
            return untie_stored_head(model, cfg)
    except (ValueError, TypeError, KeyError, IndexError, AssertionError, ZeroDivisionError, AttributeError) as err:
        # A config transformers accepted but its model cannot be built from (inconsistent sizes).
        name = model_cls.__name__ if model_cls is not None else config.model_type
        raise ValueError(f"transformers cannot build {name} from this config: {_one_line(err)}") from None


def untie_stored_head(model: "torch.nn.Module", cfg: dict) -> "torch.nn.Module":
    """``model`` with an output embedding of its own where the config file says ``tie_word_embeddings: false``
    but the config class ties anyway (transformers 5's T5Config, MT5Config: the flag only chooses the decoder
    output's scaling there). Such checkpoints (T5 v1.1, Flan-T5, T0, mT5) store ``lm_head.weight`` apart, and
    ``from_pretrained`` does not tie a stored head that differs from the embedding (modeling_utils.tie_weights):
    the model a user trains holds both matrices, so the one built here does too."""
    import torch

    if cfg.get("tie_word_embeddings") is not False:
        return model
    get_out, get_in = getattr(model, "get_output_embeddings", None), getattr(model, "get_input_embeddings", None)
    head = get_out() if callable(get_out) else None
    embed = get_in() if callable(get_in) else None
    if head is None or embed is None or head.weight is not embed.weight:
        return model
    head.weight = torch.nn.Parameter(torch.empty_like(head.weight), requires_grad=head.weight.requires_grad)
    names = {name for name, param in model.named_parameters() if param is head.weight}
    tied = getattr(model, "all_tied_weights_keys", None)
    if isinstance(tied, dict):  # so a later tie_weights() from this mapping leaves the head apart
        for target in [k for k, v in tied.items() if k in names or v in names]:
            tied.pop(target)
    return model


def _text_config(config: Any) -> Any:
    """The language model's config of a composite model (Llava's ``text_config``); else ``config``."""
    get_text = getattr(config, "get_text_config", None)
    if callable(get_text):
        try:
            return get_text(decoder=True) or config
        except (TypeError, ValueError):  # no unique text sub-config (an encoder-decoder, say)
            return config
    return config


def _attr(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def _shape_fields(config: Any) -> dict:
    """Shape fields from a transformers config object, the language model's for a composite one
    (facts looked up through the one alias table, ``advisor.model.config_keys``)."""
    if config is None:
        return {}
    text = _text_config(config)
    get = lambda fact: config_value(text, fact)  # noqa: E731
    hidden, heads = get("hidden_size"), get("num_attention_heads")
    ints = lambda v: v if isinstance(v, int) and not isinstance(v, bool) else None  # noqa: E731
    hidden, heads = ints(hidden), ints(heads)
    head_dim = ints(get("head_dim")) or (hidden // heads if hidden and heads else None)
    experts, active = ints(get("num_experts")), ints(get("num_experts_per_token"))
    archs = _attr(config, "architectures") or []
    model_type = _attr(config, "model_type")
    # transformers 5 configs carry ``dtype``; reading the ``torch_dtype`` alias off one prints a
    # deprecation warning, so the alias is only for dict configs.
    dtype = _attr(config, "dtype") if hasattr(config, "dtype") else config_value(config, "dtype")
    return dict(
        architecture=archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None,
        model_type=model_type if isinstance(model_type, str) and model_type else None,
        num_layers=ints(get("num_layers")),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=ints(get("num_kv_heads")) or heads,
        head_dim=head_dim,
        intermediate_size=ints(get("intermediate_size")) or (4 * hidden if hidden else None),
        vocab_size=ints(get("vocab_size")),
        num_experts=experts if experts and active else None,
        num_experts_per_token=active if experts and active else None,
        max_position_embeddings=ints(get("max_position_embeddings")),
        dtype=str(dtype).replace("torch.", "") if dtype is not None else None,
    )


def _embedding_modules(module: "torch.nn.Module") -> tuple[Any, Any]:
    """(input token embedding, output head), each ``None`` when the model has none. Models without
    token embeddings (ViT's patch embeddings, ResNet, Wav2Vec2, CLIP) raise NotImplementedError
    from transformers' ``get_input_embeddings`` or return a module with no ``weight``."""
    import torch

    found = []
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        get = getattr(module, getter, None)
        try:
            found.append(get() if callable(get) else None)
        except (NotImplementedError, AttributeError):
            found.append(None)
    # A token embedding is a (vocabulary x width) lookup table; duck-typed on ``weight`` so that
    # wrappers (PEFT's LoRA embedding) still count.
    embedding, head = (m if isinstance(getattr(m, "weight", None), torch.Tensor) else None for m in found)
    if embedding is not None and embedding.weight.dim() != 2:
        embedding = None
    return embedding, head


def _blocks(module: "torch.nn.Module", embedding: Any) -> list:
    """The repeated block: among the classes in ``_no_split_modules``, the one holding the most
    parameters (Llava: the language model's decoder layers, not the vision tower's), never the
    one holding the token embedding (BertEmbeddings)."""
    no_split = set(getattr(module, "_no_split_modules", None) or [])
    by_class: dict[type, list] = {}
    for m in module.modules():
        if type(m).__name__ in no_split and not (embedding is not None and any(c is embedding for c in m.modules())):
            by_class.setdefault(type(m), []).append(m)
    weight = lambda blocks: sum(p.numel() for b in blocks for p in b.parameters())  # noqa: E731
    return max(by_class.values(), key=lambda blocks: (len(blocks) > 1, weight(blocks)), default=[])


def _components(module: "torch.nn.Module", total: int) -> dict:
    """Embeddings, one block, head and the rest, when the blocks are identical; else nothing.
    A model without token embeddings has 0 of them (its patch or feature encoder is 'other')."""
    embedding, head_module = _embedding_modules(module)
    blocks = _blocks(module, embedding)
    if not blocks:
        return {}
    sizes = {sum(p.numel() for p in b.parameters()) for b in blocks}
    if len(sizes) != 1:
        return {}
    emb = embedding.weight.numel() if embedding is not None else 0
    tied = embedding is not None and head_module is not None and head_module.weight is embedding.weight
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
        tied_embeddings=tied if embedding is not None else None,
        num_layers=len(blocks),
        block_classes=(type(blocks[0]).__name__,),
    )


def spec_from_module(
    module: "torch.nn.Module", *, name: str | None = None, source: Source = "module"
) -> ModelSpec:
    """Exact counts of a live module: shared parameters once, ``requires_grad`` ones trainable."""
    params = list(module.parameters())  # nn.Module.parameters() already yields a shared tensor once
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    if total == 0:
        raise ValueError(f"{type(module).__name__} has no parameters: there is nothing to train or place")
    config = getattr(module, "config", None)
    fields = {k: v for k, v in _shape_fields(config).items() if v is not None}
    if _embedding_modules(module)[0] is None:
        # No token embeddings: a config's vocab_size (Wav2Vec2's CTC labels, CLIP's text tower)
        # does not make it a language model; the activation model keys on vocab_size.
        fields.pop("vocab_size", None)
    fields.update(_components(module, total))
    if fields.get("architecture") is None:
        fields["architecture"] = type(module).__name__
    try:
        return ModelSpec(
            name=name or fields["architecture"],
            source=source,
            count_method="module" if source == "module" else "meta_device",
            total_params=total,
            trainable_params=trainable,
            **fields,
        )
    except ValidationError as err:  # the module's own config says so (0 layers, a head 0 wide): its input, not ours
        raise ValueError(f"{fields['architecture']}: its config gives no valid model: {validation_problem(err)}") from None

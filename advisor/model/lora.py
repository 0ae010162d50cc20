"""LoRA / DoRA adapters on a model: which linear layers they target and their exact parameter count,
from the model's shape alone (no torch, no PEFT).

A LoRA adapter of rank ``r`` on a linear layer ``in -> out`` adds ``A`` (``r x in``) and ``B``
(``out x r``): ``r * (in + out)`` parameters; DoRA adds a magnitude vector of ``out`` (PEFT's
``lora_magnitude_vector``). Targets follow PEFT's matching rule: a name matches a module whose
qualified name ends with ``.NAME``; ``all-linear`` is every linear layer except the output head.
The default targets per ``model_type`` are PEFT's
(``peft.utils.constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``, peft 0.21), stored
with the architecture in ``profiles/architectures.json``. The linear layers of one block are read
from the same shape fields the parameter-count formulas use (``advisor.model.architectures``); the
counts are checked against PEFT's own trainable count on the model built on the meta device in
``tests/model/test_lora.py``.

For a family no formula lists (phi, OPT, Falcon, StarCoder2, ...), the model's linear layers are
recorded on the meta device (``ModelSpec.linears``, ``advisor.simulate.linears``) and the targets
resolved against their qualified names as PEFT resolves them (``peft.tuners.tuners_utils.
check_target_module_exists``: a name equal to the target or ending in ``.TARGET``; ``all-linear``:
every ``nn.Linear`` / ``Conv1D`` but the module ``get_output_embeddings()`` returns,
``_maybe_include_all_linear_layers``); PEFT's default targets for those families come from
``profiles/peft_lora_targets.json``. The bundled families whose blocks are not Llama-like (T5, BART, Mamba,
Jamba, DeepSeek, Qwen-VL) take the same path with their layers listed from the shape fields instead
(``advisor.model.kind_linears``); targets PEFT maps onto stacked expert weights or refuses outright (the
same profile) are a ValueError.

The adapters are added to the block's parameters, so the spec's total grows by the adapters and
only they are trainable: the base weights are frozen (no gradients, no optimizer state).
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator

from advisor.frozen import validated_copy
from advisor.model.block_kinds import kind_of
from advisor.model.bundled import (load_architectures, load_peft_expert_targets, load_peft_incompatible_targets,
                                   load_peft_lora_targets)
from advisor.model.kind_linears import formula_layout
from advisor.model.linear_layout import LinearLayer, LinearLayout
from advisor.model.saved_modules import saved_module_params, saved_modules
from advisor.model.spec import ModelSpec

ALL_LINEAR = "all-linear"


MAX_LORA_RANK = 65536  # --lora's bound: far above any rank in use, below ranks that overflow the counts


class LoraConfig(BaseModel):
    """What ``--lora RANK --lora-targets ... --dora`` ask for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(gt=0, le=MAX_LORA_RANK, description="LoRA rank r.")
    targets: tuple[str, ...] | Literal["all-linear"] | None = Field(
        default=None, description="Module names (PEFT's matching), 'all-linear', or None for PEFT's default.")
    dora: bool = Field(default=False, description="Weight-decomposed LoRA: a magnitude vector per target.")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the adapters' input (PEFT's lora_dropout).")
    modules_to_save: tuple[str, ...] | None = Field(
        default=None, exclude_if=lambda names: names is None,
        description="Modules PEFT keeps a trainable full copy of (PEFT's modules_to_save; advisor.model.saved_modules).")

    @field_validator("targets")
    @classmethod
    def _some_targets(cls, targets: Any) -> Any:
        if isinstance(targets, tuple) and not targets:  # PEFT's default was taken silently
            raise ValueError("no module names: give some, 'all-linear', or leave targets out for PEFT's default")
        if isinstance(targets, tuple) and ALL_LINEAR in targets:  # PEFT takes the string alone, not in a list
            raise ValueError("all-linear stands alone (every linear layer but the head): give it by itself, or name "
                             "the layers")
        return targets

    def peft_kwargs(self, default: tuple[str, ...]) -> dict:
        """``peft.LoraConfig`` keyword arguments for this adapter (``default``: the model's default targets)."""
        targets = self.targets if self.targets == ALL_LINEAR else list(self.targets or default)
        saved = dict(modules_to_save=list(self.modules_to_save)) if self.modules_to_save else {}
        return dict(r=self.rank, target_modules=targets, use_dora=self.dora, lora_dropout=self.dropout, **saved)


def model_linears(spec: ModelSpec) -> LinearLayout | None:
    """Every linear layer of the model by qualified name: recorded on the meta device (``spec.linears``),
    or listed from the shape fields for a family whose blocks are not Llama-like
    (``advisor.model.kind_linears``); None where ``block_linears``' per-block formula describes the model."""
    return spec.linears if spec.linears is not None else formula_layout(spec)


def block_linears(spec: ModelSpec) -> dict[str, list[tuple[int, int]]]:
    """The linear layers of one block by their last name: ``{name: [(in, out), ...]}`` (a name can
    repeat, as GPT-2's two ``c_proj``). ValueError when the family's layers are not known here."""
    layout = model_linears(spec)
    if layout is not None:  # recorded on the meta device, or listed by kind: block 0's layers
        recorded: dict[str, list[tuple[int, int]]] = {}
        for layer in layout.first_block():
            recorded.setdefault(layer.short_name, []).append((layer.in_features, layer.out_features))
        return recorded
    info = load_architectures().get(spec.model_type or "")
    needed = (spec.hidden_size, spec.num_attention_heads, spec.intermediate_size, spec.num_layers)
    if info is None or None in needed:
        raise ValueError(f"LoRA counting needs a known architecture; {spec.name} ({spec.model_type or 'size only'}) "
                         f"is not one of: {', '.join(sorted(load_architectures()))}")
    h, inter = spec.hidden_size, spec.intermediate_size
    heads = spec.num_attention_heads
    head_dim = spec.head_dim or h // heads
    q_out, kv_out = heads * head_dim, (spec.num_kv_heads or heads) * head_dim
    if info.formula == "gpt2":
        return {"c_attn": [(h, 3 * h)], "c_proj": [(h, h), (inter, h)], "c_fc": [(h, inter)]}
    if info.formula == "bert":
        # BERT's other linears share the name "dense" with the pooler and the MLM head, which are
        # not per block: only the attention projections are modelled.
        return {"query": [(h, h)], "key": [(h, h)], "value": [(h, h)]}
    if info.fused_projections:  # Phi-3: one qkv_proj and one gate_up_proj
        attention = {"qkv_proj": [(h, q_out + 2 * kv_out)], "o_proj": [(q_out, h)]}
        mlp = {"gate_up_proj": [(h, 2 * inter)], "down_proj": [(inter, h)]}
    else:
        attention = {"q_proj": [(h, q_out)], "k_proj": [(h, kv_out)], "v_proj": [(h, kv_out)], "o_proj": [(q_out, h)]}
        mlp = {"gate_proj": [(h, inter)], "up_proj": [(h, inter)], "down_proj": [(inter, h)]}
    # A mixture-of-experts block keeps its experts in stacked parameters, not linear layers
    # (transformers 5 MixtralExperts), and its router is not a Linear either: attention only.
    return attention if info.moe else {**attention, **mlp}


# Where each linear layer of a Llama-like block reads its input from. Targets sharing a source read
# the same tensor (q, k and v all read the attention norm's output).
INPUT_SOURCE = {"q_proj": "attn_norm", "k_proj": "attn_norm", "v_proj": "attn_norm", "qkv_proj": "attn_norm",
                "o_proj": "attention", "gate_proj": "mlp_norm", "up_proj": "mlp_norm", "gate_up_proj": "mlp_norm",
                "down_proj": "mlp_act"}


class AdapterInput(NamedTuple):
    in_features: int
    source: str


def target_names(spec: ModelSpec, lora: LoraConfig) -> tuple[str, ...]:
    """The block's linear layers ``lora`` adapts (its targets, PEFT's default, or every one)."""
    if model_linears(spec) is not None:
        return tuple(dict.fromkeys(layer.short_name for layer in matched_linears(spec, lora) if layer.block))
    linears = block_linears(spec)
    if lora.targets == ALL_LINEAR:
        info = load_architectures()[spec.model_type]
        if info.moe or info.formula in ("bert", "qwen_moe"):
            # PEFT's all-linear also takes the MoE router and the stacked expert weights (as parameter
            # adapters), or BERT's pooler and head "dense" layers: not modelled here.
            experts = load_peft_expert_targets().get(spec.model_type, ())
            raise ValueError(f"--lora-targets all-linear is not modelled for {spec.model_type} yet; name the "
                             f"targets (some of: {', '.join(name for name in linears if name not in experts)})")
        return tuple(linears)
    names = lora.targets or default_targets(spec)
    _refuse_expert_targets(spec, names)
    every = linear_names(spec)
    unknown = [name for name in names if name not in every]
    if unknown:
        raise ValueError(f"no linear layer named {', '.join(unknown)} in {spec.name}; its linear layers are: "
                         f"{', '.join(every)} (or all-linear)")
    outside = [name for name in names if name not in linears]
    if outside:
        raise ValueError(f"adapters on {', '.join(outside)} (outside the blocks) are not modelled yet; target "
                         f"some of: {', '.join(linears)} (or all-linear)")
    return tuple(names)


# Linear layers outside the blocks, by the last name PEFT matches: the output head of a causal LM
# (transformers' LlamaForCausalLM / GPT2LMHeadModel / Qwen3MoeForCausalLM ``lm_head``); BERT's pooler and MLM head
# (``pooler.dense``, ``cls.predictions.transform.dense``, ``cls.predictions.decoder``) and the
# output projections of its blocks (``attention.output.dense``, ``intermediate.dense``,
# ``output.dense``), all named ``dense`` but the decoder.
_OUTSIDE_LINEARS = {"decoder": ("lm_head",), "gpt2": ("lm_head",), "bert": ("dense", "decoder"), "qwen_moe": ("lm_head",)}


def _refuse_expert_targets(spec: ModelSpec, names: tuple[str, ...]) -> None:
    """ValueError for targets PEFT maps onto the stacked expert weights or the router of a mixture-of-experts
    model (``load_peft_expert_targets``): parameter adapters, not counted here."""
    experts = [name for name in names if name in load_peft_expert_targets().get(spec.model_type or "", ())]
    if experts:
        attention = [name for name in block_linears(spec) if name not in load_peft_expert_targets()[spec.model_type]]
        raise ValueError(f"adapters on {', '.join(experts)} are not modelled for {spec.model_type} yet (PEFT puts them "
                         f"on its stacked expert weights or router too); target the attention (some of: "
                         f"{', '.join(attention)})")


def _peft_match(name: str, target: str) -> bool:
    return name == target or name.endswith(f".{target}")


def matched_linears(spec: ModelSpec, lora: LoraConfig) -> tuple[LinearLayer, ...]:
    """The recorded linear layers (``spec.linears``) PEFT puts an adapter on, by PEFT's rules (module
    docstring). ValueError naming a target no linear layer matches, with the model's linear layers."""
    layout = model_linears(spec)
    assert layout is not None, "matched_linears needs the model's linear layers"
    refused = load_peft_incompatible_targets().get(spec.model_type or "", frozenset())
    allowed = ", ".join(name for name in layout.short_names if name not in refused)
    if lora.targets == ALL_LINEAR:
        if layout.stacked_experts:  # PEFT adds parameter adapters on them (target_parameters): not counted here
            raise ValueError(f"--lora-targets all-linear is not modelled for {spec.model_type} yet (PEFT also adapts its "
                             f"stacked expert weights); name the targets (some of: {allowed})")
        matched = tuple(layer for layer in layout.layers if layer.name != layout.output)
    else:
        names = lora.targets or default_targets(spec)
        _refuse_expert_targets(spec, names)
        unknown = [name for name in names if not any(_peft_match(layer.name, name) for layer in layout.layers)]
        if unknown:
            raise ValueError(f"no linear layer named {', '.join(unknown)} in {spec.name}; its linear layers are: "
                             f"{', '.join(layout.short_names)} (or all-linear)")
        matched = tuple(layer for layer in layout.layers if any(_peft_match(layer.name, name) for name in names))
    bad = sorted({layer.short_name for layer in matched} & refused)
    if bad:  # get_peft_model raises (peft/tuners/tuners_utils.py _check_lora_target_modules_mamba)
        raise ValueError(f"PEFT refuses LoRA on {', '.join(bad)} of a {spec.model_type} model; name the targets "
                         f"(some of: {allowed})")
    return matched


def adapts_output_head(spec: ModelSpec, lora: LoraConfig) -> bool:
    """Whether ``lora`` puts an adapter on the model's output head (``lm_head``): an explicit target that PEFT
    matches to it (``all-linear`` leaves it out: ``_maybe_include_all_linear_layers``). With the recorded linear
    layers (``spec.linears``), by PEFT's matching against the head's qualified name; otherwise by the head's names
    in ``_OUTSIDE_LINEARS`` and GPT-NeoX's ``embed_out``. Never raises (an unknown target is reported elsewhere)."""
    if lora.targets == ALL_LINEAR:
        return False
    try:
        names = lora.targets or default_targets(spec)
    except ValueError:
        return False
    layout = spec.linears
    if layout is not None:
        return layout.output is not None and any(_peft_match(layout.output, name) for name in names)
    return any(name in _OUTPUT_HEADS for name in names)


# The output head's names among the linears outside the blocks (``_OUTSIDE_LINEARS``), and GPT-NeoX's
_OUTPUT_HEADS = ("lm_head", "embed_out")


def linear_names(spec: ModelSpec) -> tuple[str, ...]:
    """Every linear layer's PEFT-matchable name in the model, blocks first, without repeats."""
    layout = model_linears(spec)
    if layout is not None:
        return layout.short_names
    info = load_architectures()[spec.model_type]
    tower = (*tower_linears(spec), "linear_1", "linear_2", "lm_head") if tower_linears(spec) else ()  # Llava
    return tuple(dict.fromkeys([*block_linears(spec), *_OUTSIDE_LINEARS.get(info.formula, ()), *tower]))


def adapter_inputs(spec: ModelSpec, lora: LoraConfig) -> tuple[AdapterInput, ...] | None:
    """Each adapted linear's input width and source in one block, for the activation model; None
    where the block's sources are not modelled (GPT-2, mixture-of-experts blocks, DoRA on BERT, a family with
    no formula: its activations are traced with the adapters instead). BERT's adapted linears (query, key, value)
    all read the block's input."""
    info = load_architectures().get(spec.model_type or "")
    if info is not None and info.formula in ("t5", "bart") and formula_layout(spec) is not None:
        return _encdec_adapter_inputs(spec, lora)
    if info is not None and info.formula == "bert" and not lora.dora:  # the query, key and value read the block input
        return tuple(AdapterInput(fan_in, "block_input") for name in target_names(spec, lora)
                     for fan_in, _ in block_linears(spec)[name])
    if info is None or info.formula != "decoder" or info.moe:
        return None
    linears = block_linears(spec)
    return tuple(AdapterInput(fan_in, INPUT_SOURCE[name]) for name in target_names(spec, lora)
                 for fan_in, _ in linears[name])


def _encdec_adapter_inputs(spec: ModelSpec, lora: LoraConfig) -> tuple[AdapterInput, ...] | None:
    """T5 / BART: the adapted linears of each stack's first block, their source named ``stack:module.leaf``
    (``encoder:SelfAttention.q``, ``decoder:encoder_attn.k_proj``, ``decoder:fc2``;
    ``advisor.estimate.activations_encdec``); None for DoRA (the planner refuses it: ``encdec_lora_not_modelled``)."""
    if lora.dora:
        return None
    inputs = []
    for layer in matched_linears(spec, lora):
        parts = layer.name.split(".")
        stack = "encoder" if "encoder" in parts[:2] else "decoder"
        if layer.block and parts[parts.index(stack) + 2] == "0":
            inputs.append(AdapterInput(layer.in_features, f"{stack}:{parts[-2]}.{parts[-1]}"))
    return tuple(inputs)


def adapted_block_linears(spec: ModelSpec, lora: LoraConfig) -> tuple[tuple[int, int], ...] | None:
    """``(in, out)`` of every adapted linear inside the blocks of the whole model, for a family listed by
    kind (``advisor.model.kind_linears``: its blocks differ, as T5's encoder and decoder or Jamba's
    attention and Mamba layers); None elsewhere (every block is block 0: ``block_linears`` x layers)."""
    if spec.linears is not None or formula_layout(spec) is None:
        return None
    return tuple((layer.in_features, layer.out_features) for layer in matched_linears(spec, lora) if layer.block)


def adapted_fans(spec: ModelSpec, lora: LoraConfig) -> tuple[int, ...]:
    """``max(in, out)`` of each linear inside the blocks ``lora`` adapts (every block where they differ, as
    Jamba's attention and Mamba layers; block 0 elsewhere)."""
    if model_linears(spec) is not None:
        return tuple(max(layer.in_features, layer.out_features) for layer in matched_linears(spec, lora) if layer.block)
    linears = block_linears(spec)
    return tuple(max(fan_in, fan_out) for name in target_names(spec, lora) for fan_in, fan_out in linears.get(name, ()))


def dora_outputs(spec: ModelSpec, lora: LoraConfig) -> tuple[int, ...]:
    """Each DoRA-adapted linear's out_features in one block, in ``adapter_inputs``' order (empty for LoRA
    or where ``adapter_inputs`` is None)."""
    if not lora.dora or adapter_inputs(spec, lora) is None:
        return ()
    linears = block_linears(spec)
    return tuple(fan_out for name in target_names(spec, lora) for _, fan_out in linears[name])


def default_targets(spec: ModelSpec) -> tuple[str, ...]:
    info = load_architectures().get(spec.model_type or "")
    targets = info.lora_targets if info is not None else load_peft_lora_targets().get(spec.model_type or "")
    if not targets:
        layout = model_linears(spec)
        names = linear_names(spec) if layout is not None else tuple(block_linears(spec)) if info else ()
        some = f"some of: {', '.join(names)}" if names else ""
        if layout is not None and layout.stacked_experts:  # all-linear is refused there (matched_linears)
            raise ValueError(f"PEFT has no default LoRA targets for {spec.model_type or spec.name}: "
                             f"pass --lora-targets ({some})")
        raise ValueError(f"PEFT has no default LoRA targets for {spec.model_type or spec.name}: "
                         f"pass --lora-targets (e.g. all-linear{', or ' + some if some else ''})")
    return tuple(targets)


def _adapter_size(lora: LoraConfig, fan_in: int, fan_out: int) -> int:
    return lora.rank * (fan_in + fan_out) + (fan_out if lora.dora else 0)


def _adapters(lora: LoraConfig, linears: dict[str, list[tuple[int, int]]], names: tuple[str, ...]) -> int:
    return sum(_adapter_size(lora, fan_in, fan_out) for name in names for fan_in, fan_out in linears.get(name, ()))


def tower_linears(spec: ModelSpec) -> dict[str, list[tuple[int, int]]]:
    """The linear layers of one layer of the model's vision tower PEFT's names can match (a Llava's CLIP
    encoder layer: ``advisor.model.block_kinds``, the kind's ``tower_linears``); empty for other models."""
    kind = kind_of(spec)
    return {} if kind.tower_linears is None else kind.tower_linears(spec)


def tower_adapter_params(spec: ModelSpec, lora: LoraConfig) -> int:
    """Adapters PEFT puts on a vision tower (a Llava's CLIP tower: its names match the tower's q_proj,
    v_proj, ... too) and, for all-linear, on the kind's projector (Llava's linear_1 and linear_2); 0 for
    other models."""
    linears = tower_linears(spec)
    if not linears:
        return 0
    kind = kind_of(spec)
    if lora.targets == ALL_LINEAR:
        projector = kind.projector_linears(spec)
        return _adapters(lora, linears, tuple(linears)) * kind.tower_layers(spec) + _adapters(
            lora, projector, tuple(projector))
    return _adapters(lora, linears, target_names(spec, lora)) * kind.tower_layers(spec)


def adapter_params(spec: ModelSpec, lora: LoraConfig) -> int:
    """Adapter parameters over the whole model (every block, and a Llava's vision tower)."""
    if model_linears(spec) is not None:
        return sum(_adapter_size(lora, layer.in_features, layer.out_features) for layer in matched_linears(spec, lora))
    per_block = _adapters(lora, block_linears(spec), target_names(spec, lora))
    return per_block * spec.num_layers + tower_adapter_params(spec, lora)


def with_lora(spec: ModelSpec, lora: LoraConfig) -> ModelSpec:
    """``spec`` with the adapters added to every block (a Llava tower's to ``other_params``) and only
    the adapters trainable; PEFT's ``modules_to_save`` copies (``saved_module_params``) are added to
    ``other_params`` and train too."""
    saved = saved_module_params(spec, lora)
    head_saved = spec.head is not None and any(name.endswith(spec.head.module) for name in saved_modules(
        spec, lora.modules_to_save or ()))
    spec = _with_adapters(spec, lora)
    if not saved:
        return spec
    return validated_copy(spec, {"total_params": spec.total_params + saved,
                                 "trainable_params": spec.trainable_params + saved,
                                 "other_params": None if spec.other_params is None else spec.other_params + saved,
                                 **({"head": validated_copy(spec.head, {"saved_copy": True})} if head_saved else {})})


def _with_adapters(spec: ModelSpec, lora: LoraConfig) -> ModelSpec:
    if model_linears(spec) is not None:
        return _with_recorded_lora(spec, lora)
    added, tower = adapter_params(spec, lora), tower_adapter_params(spec, lora)
    update = {"total_params": spec.total_params + added, "trainable_params": added}
    if spec.layer_params is not None:
        update["layer_params"] = spec.layer_params + (added - tower) // spec.num_layers
    if tower and spec.other_params is not None:
        update["other_params"] = spec.other_params + tower
    return validated_copy(spec, update)


def _with_recorded_lora(spec: ModelSpec, lora: LoraConfig) -> ModelSpec:
    """``with_lora`` from the model's linear layers (``model_linears``): the blocks' adapters spread over
    the blocks, any outside them (an adapted output head) or left over by unequal blocks to
    ``other_params``. Jamba's blocks each get their own (``HybridFacts.block_params``), DeepSeek's dense
    first layers theirs (``MoeFacts.dense_layer_params``), so the components still sum to the total; an
    encoder-decoder, which reports no ``layer_params``, holds its blocks and so the adapters in
    ``other_params``."""
    matched = matched_linears(spec, lora)
    added = sum(_adapter_size(lora, layer.in_features, layer.out_features) for layer in matched)
    update = {"total_params": spec.total_params + added, "trainable_params": added}
    if spec.layer_params is None and spec.other_params is not None and spec.linears is None:
        update["other_params"] = spec.other_params + added  # listed by kind (T5, BART): blocks in other_params
    elif spec.layer_params is not None and spec.other_params is not None and spec.num_layers:
        grown = _spread_unequal(spec, lora, matched, added) if kind_of(spec).grow_blocks else {}
        if grown:
            update.update(grown)
        else:
            in_blocks = sum(_adapter_size(lora, layer.in_features, layer.out_features) for layer in matched if layer.block)
            per_block = in_blocks // spec.num_layers
            update.update(layer_params=spec.layer_params + per_block,
                          other_params=spec.other_params + added - per_block * spec.num_layers)
    return validated_copy(spec, update)


def _spread_unequal(spec: ModelSpec, lora: LoraConfig, matched: tuple[LinearLayer, ...], added: int) -> dict:
    """The adapters of each block of the first block list (``model.layers``) added to that block's count,
    by the kind's ``grow_blocks`` (``advisor.model.block_kinds``: Jamba's ``HybridFacts.block_params``,
    DeepSeek's dense layers); {} where its blocks are alike after all (a MoE without dense layers)."""
    first = model_linears(spec).first_block()
    stack = first[0].block[0] if first else None
    per_block = [0] * spec.num_layers
    for layer in matched:
        if layer.block is not None and layer.block[0] == stack and layer.block[1] < spec.num_layers:
            per_block[layer.block[1]] += _adapter_size(lora, layer.in_features, layer.out_features)
    return kind_of(spec).grow_blocks(spec, per_block, added)


def lora_of(model: object) -> LoraConfig | None:
    """The active LoRA adapter of a live PEFT model (``PeftModel`` or ``LoraModel``: duck-typed on
    ``peft_config``, no import), or None. Target names are the matched module names PEFT recorded."""
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, dict) or not configs:
        return None
    active = getattr(model, "active_adapter", None)
    config = configs.get(active if isinstance(active, str) else "default") or next(iter(configs.values()))
    rank = getattr(config, "r", None)
    if not isinstance(rank, int):
        return None  # another PEFT method (prefix tuning, IA3, ...): counted by requires_grad only
    targets = getattr(config, "target_modules", None)
    names = targets if targets == ALL_LINEAR else tuple(sorted(targets)) if targets else None
    saved = getattr(config, "modules_to_save", None)
    return LoraConfig(rank=rank, targets=names, dora=bool(getattr(config, "use_dora", False)),
                      dropout=float(getattr(config, "lora_dropout", 0.0) or 0.0),
                      modules_to_save=tuple(saved) if saved else None)

"""The torchtune YAML reader (``advisor plan --from 8B_lora.yaml``).

Which keys it reads, and what they mean, from the framework's own recipes (torchtune at bd2a0fc7,
recipes/full_finetune_distributed.py, lora_finetune_distributed.py, and their single-device twins, which read
the same keys): ``model._component_`` (a builder, planned as the bundled model ``profiles/torchtune_models.json``
maps it to; a ``lora_`` builder is LoRA with ``lora_rank``, ``lora_attn_modules``, ``apply_lora_to_mlp``,
``apply_lora_to_output``, ``lora_dropout``, ``use_dora``, and a ``qlora_`` one also quantises the base),
``batch_size``, ``gradient_accumulation_steps``, ``tokenizer.max_seq_len``, ``dataset.packed``, ``dtype``,
``enable_activation_checkpointing``, ``ac_mode``, ``enable_activation_offloading``, ``compile``, ``optimizer``
(``_component_`` and ``fused``), ``optimizer_in_bwd``, ``loss._component_``, and the distributed recipes'
``fsdp_cpu_offload``, ``fsdp_reshard_after_forward`` and mesh sizes (``tensor_parallel_dim``,
``context_parallel_dim``, ``data_parallel_replicate_dim``, ``data_parallel_shard_dim``, ``custom_sharded_layers``).

A YAML file is torchtune's when one of its sections names a torchtune ``_component_``
(``advisor.planning.config_formats``); any other YAML is read as an accelerate config.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from advisor.planning.config_file import FILE_FORMAT, Reader, fsdp_strategy, take_batch

# torchtune's LoRA module names (torchtune/modules/peft/lora.py: LORA_ATTN_MODULES; the MLP's w1, w2, w3 and the
# output projection) -> the Hugging Face names PEFT targets on the models the builders map to.
_ATTENTION = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
_MLP = ("gate_proj", "up_proj", "down_proj")
# optimizer._component_ -> --optimizer; torch.optim's AdamW / Adam / SGD step foreach on CUDA unless fused=True
# (torch/optim/optimizer.py _default_to_fused_or_foreach: fused is never the default).
_OPTIMIZERS = {"torch.optim.AdamW": "adamw", "torch.optim.Adam": "adam", "torch.optim.SGD": "sgd",
               "bitsandbytes.optim.AdamW8bit": "adamw-8bit", "bitsandbytes.optim.PagedAdamW8bit": "adamw-8bit-paged",
               "bitsandbytes.optim.PagedAdamW": None}
_TORCH_OPTIMIZERS = ("torch.optim.AdamW", "torch.optim.Adam", "torch.optim.SGD")
# loss._component_ -> (--loss, the note when the plan models it only approximately)
_LOSSES: dict[str, tuple[str, str | None]] = {
    "torchtune.modules.loss.LinearCrossEntropyLoss": ("chunked", None),
    "torchtune.modules.loss.CEWithChunkedOutputLoss": (
        "chunked", "CEWithChunkedOutputLoss (torchtune before 2025-04-30) takes every chunk's logits from the model: "
        "planned as LinearCrossEntropyLoss, which makes each chunk's logits inside the loss (the older loss holds "
        "every chunk's bf16 logits until it returns)"),
    "torch.nn.CrossEntropyLoss": ("hf", "torch.nn.CrossEntropyLoss over the whole logits: planned as the Hugging Face "
                                  "loss (an fp32 copy of the logits), which holds more than a bf16 cross-entropy"),
}
_DISTRIBUTED_KEYS = ("fsdp_cpu_offload", "fsdp_reshard_after_forward", "data_parallel_shard_dim",
                     "data_parallel_replicate_dim", "tensor_parallel_dim", "context_parallel_dim",
                     "custom_sharded_layers")


@cache
def torchtune_models() -> dict[str, Any]:
    """The builder table (``profiles/torchtune_models.json``)."""
    from profiles import PROFILES_DIR

    return json.loads((PROFILES_DIR / "torchtune_models.json").read_text())


def is_torchtune(doc: dict[str, Any]) -> bool:
    """A torchtune config names its model, tokenizer, loss, ... as ``_component_: torchtune.…``."""
    return any(isinstance(section, dict) and str(section.get("_component_", "")).startswith("torchtune.")
               for section in doc.values())


def read_torchtune(r: Reader) -> None:
    _model(r)
    take_batch(r, micro="batch_size", accumulation="gradient_accumulation_steps")
    length = r.integer("tokenizer.max_seq_len", low=1)
    packed = r.flag("dataset.packed")
    if length is not None:
        r.take("tokenizer.max_seq_len", length, "seq_len", length)
        if not packed:
            r.notes.append(f"dataset.packed is not true: samples are padded to each batch's longest, planned at "
                           f"max_seq_len {length} (the longest a sample can be)")
    elif "tokenizer" in r.doc:
        r.notes.append("tokenizer.max_seq_len is null: samples are as long as the dataset's; give --seq-len "
                       "(default 2048)")
    dtype = r.choice("dtype", {"bf16": "bf16", "fp32": "fp32"})
    if dtype is not None:  # torchtune builds the whole model in this dtype and runs no autocast
        r.take("dtype", dtype, "precision", dtype)
    checkpointing = r.flag("enable_activation_checkpointing")
    if checkpointing is not None:
        r.take("enable_activation_checkpointing", checkpointing, "activation_checkpointing",
               "on" if checkpointing else "off")
    mode = r.text("ac_mode")
    if checkpointing and mode is not None and mode.lower() == "selective":
        r.raw("ac_option")
        r.notes.append("ac_mode selective (every ac_option-th layer checkpointed) is not modelled: planned with "
                       "every layer checkpointed")
    for key, option in (("enable_activation_offloading", "activation_offload"), ("compile", "compile"),
                        ("optimizer_in_bwd", "optimizer_in_backward")):
        if r.flag(key):
            r.take(key, True, option, 1)
    _optimizer(r)
    loss = r.text("loss._component_")
    if loss is not None:
        if loss in _LOSSES:
            kernel, note = _LOSSES[loss]
            r.take("loss._component_", loss, "loss", kernel)
            if note:
                r.notes.append(note)
        else:
            r.notes.append(f"loss {loss} is not modelled: planned with the recipe's chunked cross-entropy")
    _distributed(r)
    r.take(FILE_FORMAT, "torchtune", "recipe", "torchtune")
    r.take(FILE_FORMAT, "torchtune", "engine", "torch")


def _model(r: Reader) -> None:
    component = r.text("model._component_")
    if component is None:
        return
    builder = component.rsplit(".", 1)[-1]
    kind = next((prefix for prefix in ("qlora_", "lora_") if builder.startswith(prefix)), "")
    row = torchtune_models()["builders"].get(builder.removeprefix(kind))
    if row is None:
        r.notes.append(f"model {component} is not mapped to a bundled model: give it with --model")
    else:
        r.take("model._component_", component, "model", row["model"])
    if not kind:
        return
    rank = r.integer("model.lora_rank", low=1)
    if rank is None:
        raise r.fail("model.lora_rank", f"is missing: {builder} is a LoRA builder")
    r.take("model.lora_rank", rank, "lora_rank", rank)
    r.take("model.lora_attn_modules + apply_lora_to_mlp + apply_lora_to_output", _targets_shown(r), "lora_targets",
           ",".join(_targets(r)))
    dropout = r.raw("model.lora_dropout")
    if isinstance(dropout, (int, float)) and not isinstance(dropout, bool) and dropout > 0:
        r.take("model.lora_dropout", dropout, "lora_dropout", str(dropout))
    if r.flag("model.use_dora"):
        r.take("model.use_dora", True, "dora", 1)
    r.raw("model.lora_alpha")  # a scale: no memory or time
    if kind == "qlora_":
        r.take("model._component_", component, "quantize", "nf4")
        r.notes.append("qlora_: torchao's NF4 base weights, planned as bitsandbytes nf4 with double quantisation "
                       "(the same bytes a weight)")


def _targets(r: Reader) -> list[str]:
    modules = r.raw("model.lora_attn_modules")
    if not isinstance(modules, list) or not modules:
        raise r.fail("model.lora_attn_modules", f"must be a list of {', '.join(_ATTENTION)}, got {modules!r}"[:160])
    unknown = [m for m in modules if m not in _ATTENTION]
    if unknown:
        raise r.fail("model.lora_attn_modules", f"names {unknown[0]!r}: torchtune's are {', '.join(_ATTENTION)}")
    names = [_ATTENTION[m] for m in modules]
    if r.flag("model.apply_lora_to_mlp"):
        names += _MLP
    if r.flag("model.apply_lora_to_output"):
        names.append("lm_head")
    return names


def _targets_shown(r: Reader) -> str:
    doc = r.doc.get("model", {})
    return (f"{doc.get('lora_attn_modules')}, mlp {bool(doc.get('apply_lora_to_mlp'))}, "
            f"output {bool(doc.get('apply_lora_to_output'))}")


def _optimizer(r: Reader) -> None:
    component = r.text("optimizer._component_")
    if component is None:
        return
    if component not in _OPTIMIZERS or _OPTIMIZERS[component] is None:
        r.notes.append(f"optimizer {component} is not modelled: planned with --optimizer's default")
        return
    r.take("optimizer._component_", component, "optimizer", _OPTIMIZERS[component])
    if component in _TORCH_OPTIMIZERS:
        fused = r.flag("optimizer.fused")
        r.take("optimizer.fused" if fused is not None else "optimizer._component_", fused if fused is not None else
               component, "optimizer_impl", "fused" if fused else "foreach")


def _distributed(r: Reader) -> None:
    """The distributed recipes shard with FSDP2 over ``data_parallel_shard_dim`` GPUs (-1: the rest). A file
    without these keys may be a single-device config: the strategy is then left to the plan."""
    if not any(key in r.doc for key in _DISTRIBUTED_KEYS):
        r.notes.append("no FSDP key: torchtune's distributed recipes shard with FSDP2 (--strategy zero3), its "
                       "single-device recipes run the plain model; the strategy is left to the plan")
        return
    offload = bool(r.flag("fsdp_cpu_offload"))
    reshard = r.flag("fsdp_reshard_after_forward")
    key = "fsdp_cpu_offload" if offload else "fsdp_reshard_after_forward" if reshard is not None else \
        next(k for k in _DISTRIBUTED_KEYS if k in r.doc)
    fsdp_strategy(r, key, reshard=reshard is not False, offload=offload, value=str(r.doc.get(key)))
    for field, option in (("tensor_parallel_dim", "tp"), ("context_parallel_dim", "cp"),
                          ("data_parallel_replicate_dim", "hybrid")):
        number = r.integer(field, low=1)
        if number is not None and number > 1:
            r.take(field, number, option, number)
    r.integer("data_parallel_shard_dim", low=-1)
    layers = r.raw("custom_sharded_layers")
    if layers:
        r.notes.append(f"custom_sharded_layers {layers}: FSDP units of their own are not modelled; planned with them "
                       "in the root's unit (gathered together)")

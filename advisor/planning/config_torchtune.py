"""The torchtune YAML reader (``advisor plan --from 8B_lora.yaml``).

Which keys it reads, and what they mean, from the framework's own recipes (torchtune at bd2a0fc7,
recipes/full_finetune_distributed.py, lora_finetune_distributed.py, and their single-device twins):
``model._component_`` (a builder, planned as the bundled model ``profiles/torchtune_models.json`` maps it to; a
``lora_`` builder is LoRA with ``lora_rank``, ``lora_attn_modules``, ``apply_lora_to_mlp``, ``lora_dropout``,
``use_dora``, ``quantize_base`` (``apply_lora_to_output`` refused on a tied head, as torchtune does, else left out
with a note), and a ``qlora_`` one quantises the base), ``batch_size``, ``gradient_accumulation_steps``,
``tokenizer.max_seq_len``, ``dataset.packed``, ``dtype`` (null: fp32, ``training.get_dtype``),
``enable_activation_checkpointing`` and, for a full fine-tune only, ``ac_mode`` / ``ac_option`` under
full_finetune_distributed's conditions, ``enable_activation_offloading``, ``compile`` (or its ``model`` key),
``optimizer`` (``_component_`` and ``fused``), ``optimizer_in_bwd`` (full fine-tunes: the LoRA recipes ignore it),
``loss._component_``, and the distributed recipes' ``fsdp_cpu_offload``, ``fsdp_reshard_after_forward`` and mesh
sizes (``tensor_parallel_dim``, ``context_parallel_dim``, ``data_parallel_replicate_dim``,
``data_parallel_shard_dim``, ``custom_sharded_layers``).

A YAML file is torchtune's when one of its sections names a torchtune ``_component_``
(``advisor.planning.config_formats``); any other YAML is read as an accelerate config.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from advisor.training import MAX_SEQ_LEN
from advisor.model.lora import MAX_LORA_RANK
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
    row, lora = _model(r)
    take_batch(r, micro="batch_size", accumulation="gradient_accumulation_steps")
    length = r.integer("tokenizer.max_seq_len", low=1, high=MAX_SEQ_LEN)
    packed = r.flag("dataset.packed")
    if length is not None:
        r.take("tokenizer.max_seq_len", length, "seq_len", length)
        if not packed:
            r.notes.append(f"dataset.packed is not true: samples are padded to each batch's longest, planned at "
                           f"max_seq_len {length} (the longest a sample can be)")
    elif "tokenizer" in r.doc:
        r.notes.append("tokenizer.max_seq_len is null: samples are as long as the dataset's; give --seq-len "
                       "(default 2048)")
    if "dtype" in r.doc and r.doc["dtype"] is None:  # training.get_dtype(None) is float32
        r.raw("dtype")
        r.take("dtype", "null", "precision", "fp32")
    else:
        dtype = r.choice("dtype", {"bf16": "bf16", "fp32": "fp32"})
        if dtype is not None:  # torchtune builds the whole model in this dtype and runs no autocast
            r.take("dtype", dtype, "precision", dtype)
    _checkpointing(r, lora)
    if r.flag("enable_activation_offloading"):
        r.take("enable_activation_offloading", True, "activation_offload", 1)
    _compile(r)
    in_backward = r.flag("optimizer_in_bwd")
    if in_backward and lora:
        r.notes.append("optimizer_in_bwd is read by the full fine-tune recipes only: the LoRA recipes ignore it")
    elif in_backward:
        r.take("optimizer_in_bwd", True, "optimizer_in_backward", 1)
    _optimizer(r)
    _loss(r, row)
    _distributed(r)
    r.take(FILE_FORMAT, "torchtune", "recipe", "torchtune")
    r.take(FILE_FORMAT, "torchtune", "engine", "torch")


def _checkpointing(r: Reader, lora: bool) -> None:
    """full_finetune_distributed checkpoints every layer when enable_activation_checkpointing is true and ac_mode
    unset, and applies ac_mode (full, or selective: every ac_option-th layer, or 'op') only when
    enable_activation_checkpointing is false; with both set it checkpoints nothing. The other recipes read
    enable_activation_checkpointing alone."""
    enabled = r.flag("enable_activation_checkpointing")
    mode = None if lora else r.text("ac_mode")
    option = None if lora else r.raw("ac_option")
    if lora and r.raw("ac_mode") is not None:
        r.notes.append("ac_mode is read by full_finetune_distributed only: the LoRA recipes ignore it")
    if mode is None:
        if enabled is not None:
            r.take("enable_activation_checkpointing", enabled, "activation_checkpointing", "on" if enabled else "off")
        return
    if enabled:
        r.take("enable_activation_checkpointing + ac_mode", f"true, {mode}", "activation_checkpointing", "off")
        r.notes.append("enable_activation_checkpointing true with ac_mode set: full_finetune_distributed applies "
                       "neither (the selective path runs only when enable_activation_checkpointing is false)")
    elif mode.lower() == "full":
        r.take("ac_mode", mode, "activation_checkpointing", "on")
    elif mode.lower() == "selective" and str(option).lower() == "op":
        r.take("ac_mode + ac_option", f"{mode}, op", "activation_checkpointing", "selective")
        r.notes.append("ac_option op: torchtune's per-op selective checkpointing, planned as torchtitan's op list")
    elif mode.lower() == "selective":
        r.notes.append(f"ac_mode selective with ac_option {option}: one layer in {option} checkpointed is not "
                       "modelled; the plan chooses checkpointing (every layer holds less than the run, none more)")
    elif mode.lower() == "none":
        r.take("ac_mode", mode, "activation_checkpointing", "off")
    else:
        raise r.fail("ac_mode", f"must be one of none, full, selective, got {mode!r}")


def _compile(r: Reader) -> None:
    """``compile: true``, or the distributed full recipe's ``compile: {model: .., loss: ..}``."""
    if isinstance(r.doc.get("compile"), dict):
        if r.flag("compile.model"):
            r.take("compile.model", True, "compile", 1)
            if r.flag("compile.loss") is False:
                r.notes.append("compile.loss false: the loss runs eager, planned compiled with the model (the "
                               "recipe's compile_loss)")
        return
    if r.flag("compile"):
        r.take("compile", True, "compile", 1)


def _loss(r: Reader, row: dict[str, Any] | None) -> None:
    loss = r.text("loss._component_")
    if loss is None:
        return
    if loss not in _LOSSES:
        r.notes.append(f"loss {loss} is not modelled: planned with the recipe's chunked cross-entropy")
        return
    kernel, note = _LOSSES[loss]
    if kernel == "chunked" and row is not None and row.get("softcapped_logits"):
        r.take("loss._component_", loss, "loss", "hf")
        r.notes.append(f"{row['model']} transforms its logits before the loss (soft-capping), which the planner's "
                       "chunked loss does not: planned with the full-logits loss, which holds more than the chunks")
        return
    r.take("loss._component_", loss, "loss", kernel)
    if note:
        r.notes.append(note)


# What the note on a builder with no bundled model says (advisor.cli.from_file turns it into the error when no
# --model is given)
UNMAPPED_MODEL = "is not mapped to a bundled model"


def _model(r: Reader) -> tuple[dict[str, Any] | None, bool]:
    """The builder's model and LoRA settings; returns (the builder's table row or None, whether it is LoRA)."""
    component = r.text("model._component_")
    if component is None:
        return None, False
    builder = component.rsplit(".", 1)[-1]
    kind = next((prefix for prefix in ("qlora_", "lora_") if builder.startswith(prefix)), "")
    base = builder.removeprefix(kind)
    row = torchtune_models()["builders"].get(base)
    if row is None:
        r.notes.append(f"model {component} {UNMAPPED_MODEL}: give it with --model")
    else:
        if kind == "qlora_" and not row["qlora"]:
            raise r.fail("model._component_", f"names {builder}: torchtune has no QLoRA builder for {base} (use "
                         f"lora_{base})")
        r.take("model._component_", component, "model", row["model"])
    if not kind:
        return row, False
    rank = r.integer("model.lora_rank", low=1)
    if rank is None:
        raise r.fail("model.lora_rank", f"is missing: {builder} is a LoRA builder")
    if rank > MAX_LORA_RANK:  # --lora's own bound
        raise r.fail("model.lora_rank", f"must be at most {MAX_LORA_RANK}, got {rank}")
    r.take("model.lora_rank", rank, "lora_rank", rank)
    r.take("model.lora_attn_modules + apply_lora_to_mlp", _targets_shown(r), "lora_targets", ",".join(_targets(r)))
    _output_adapter(r, row)
    dropout = r.fraction("model.lora_dropout")
    if dropout:
        r.take("model.lora_dropout", dropout, "lora_dropout", str(dropout))
    if r.flag("model.use_dora"):
        r.take("model.use_dora", True, "dora", 1)
    r.raw("model.lora_alpha")  # a scale: no memory or time
    quantize_base = r.flag("model.quantize_base")
    if kind == "qlora_" or quantize_base:
        key = "model.quantize_base" if quantize_base else "model._component_"
        r.take(key, True if quantize_base else component, "quantize", "nf4")
        r.notes.append("NF4 base (torchao): planned as bitsandbytes nf4 with double quantisation (the same bytes a "
                       "weight)")
    return row, True


def _targets(r: Reader) -> list[str]:
    modules = r.raw("model.lora_attn_modules")
    if not isinstance(modules, list) or not modules:
        raise r.fail("model.lora_attn_modules", f"must be a list of {', '.join(_ATTENTION)}, got {modules!r}"[:160])
    unknown = [m for m in modules if not isinstance(m, str) or m not in _ATTENTION]
    if unknown:
        raise r.fail("model.lora_attn_modules", f"names {unknown[0]!r}: torchtune's are {', '.join(_ATTENTION)}"[:160])
    names = list(dict.fromkeys(_ATTENTION[m] for m in modules))  # one adapter a module, as torchtune builds it
    if r.flag("model.apply_lora_to_mlp"):
        names += _MLP
    return names


def _output_adapter(r: Reader, row: dict[str, Any] | None) -> None:
    """``apply_lora_to_output``: torchtune refuses it where the head is tied to the embedding; elsewhere the plan
    leaves that adapter out (not modelled), which the note says."""
    if not r.flag("model.apply_lora_to_output"):
        return
    if row is not None and row["shapes"].get("tie_word_embeddings"):
        raise r.fail("model.apply_lora_to_output", "is true, which torchtune refuses for a head tied to the "
                     "embedding (its component builder raises)")
    r.notes.append("apply_lora_to_output: an adapter on the output projection is not modelled: planned without it, "
                   "which leaves out its logits-sized output (tokens x vocabulary x 2 bytes)")


def _targets_shown(r: Reader) -> str:
    doc = r.doc.get("model")
    doc = doc if isinstance(doc, dict) else {}
    return f"{doc.get('lora_attn_modules')}, mlp {bool(doc.get('apply_lora_to_mlp'))}"


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
    if r.integer("data_parallel_shard_dim", low=-1) == 0:  # as the torchtitan reader: -1 or a degree
        raise r.fail("data_parallel_shard_dim", "must be -1 (the remaining GPUs) or at least 1")
    layers = r.raw("custom_sharded_layers")
    if layers:
        again = (" (torchtune gathers the head again in backward when 'output' reshards as the layers do; the "
                 "root is not)") if isinstance(layers, list) and "output" in layers and reshard is not False else ""
        r.notes.append(f"custom_sharded_layers {layers}: FSDP units of their own are not modelled; planned with them "
                       f"in the root's unit, kept unsharded from forward to backward{again}")

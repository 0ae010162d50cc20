"""The axolotl config reader (``advisor plan --from config.yml``: axolotl's own YAML, run by ``axolotl train``).

axolotl trains through Hugging Face's Trainer (the trainer recipe); its keys and defaults are read from its schema
(axolotl-ai-cloud/axolotl@067b021, src/axolotl/utils/schemas/): ``base_model``, ``micro_batch_size`` (default 1),
``gradient_accumulation_steps`` (1), ``sequence_len`` (512), ``adapter`` (lora, or qlora with ``load_in_4bit``: nf4
with double quantisation, src/axolotl/loaders/model.py) with ``lora_r``, ``lora_target_modules`` /
``lora_target_linear`` (every linear layer), ``lora_dropout`` (0.0), ``lora_modules_to_save``, ``peft_use_dora``,
``load_in_8bit``; ``bf16`` (default "auto": bf16 where the GPU has it, the model loaded in bf16,
utils/config/__init__.py) / ``fp16``, ``gradient_checkpointing`` (default false) with ``activation_offloading``
(``_offloading``), ``optimizer`` (TrainingArguments' names, default adamw_torch_fused), the attention switches
(``attn_implementation``, or the older ``flash_attention`` / ``sdp_attention`` / ``flex_attention`` /
``eager_attention``), ``deepspeed`` (a path or a mapping, as the Trainer reads it), ``fsdp`` / ``fsdp_config`` /
``fsdp_version`` (``_fsdp``), and Liger's ``liger_fused_linear_cross_entropy`` or the Cut Cross-Entropy plugin
(``_cut_cross_entropy``). A file with neither FSDP nor DeepSpeed runs DDP (one process per GPU: axolotl shards only
through them), so the strategy is ddp. A full fine-tune in bf16 keeps the model's bf16 weights and a bf16 AdamW state
on one GPU or DDP (pure bf16); DeepSpeed keeps fp32 master weights and accelerate's FSDP upcasts the trained ones, so
there and for adapters the plan is bf16-mixed.
"""

from __future__ import annotations

from pathlib import Path

from advisor.model.lora import MAX_LORA_RANK
from advisor.planning.config_file import (FILE_FORMAT, SHARDING, Reader, ddp_strategy, fsdp_strategy,
                                          fsdp_sub_reader, take_batch)
from advisor.planning.config_trainer import (TRAINER_OPTIM, take_activation_offload, take_attention, take_peft_keys,
                                             trainer_deepspeed, trainer_fsdp)
from advisor.training import MAX_SEQ_LEN

# axolotl's schema defaults (training.py, config.py, peft.py at 067b021)
AXOLOTL_MICRO_BATCH, AXOLOTL_SEQ_LEN, AXOLOTL_OPTIM = 1, 512, "adamw_torch_fused"
_OLD_ATTENTION = {"flash_attention": "flash_attention_2", "sdp_attention": "sdpa", "flex_attention": "flex_attention",
                  "eager_attention": "eager", "xformers_attention": "xformers"}


def is_axolotl(doc: dict) -> bool:
    """Two or more keys only axolotl's YAML has (its batch, length, model and adapter names)."""
    return sum(key in doc for key in ("base_model", "sequence_len", "micro_batch_size", "adapter",
                                      "lora_target_linear")) >= 2


def read_axolotl(r: Reader, base: Path) -> None:
    model = r.text("base_model")
    if model:
        r.take("base_model", model, "model", model)
    _attention_switches(r)
    adapter = _adapter(r)
    if r.raw("micro_batch_size") is None:
        r.take("micro_batch_size", f"not set: axolotl's default {AXOLOTL_MICRO_BATCH}", "micro_batch",
               AXOLOTL_MICRO_BATCH)
    take_batch(r, micro="micro_batch_size", accumulation="gradient_accumulation_steps")
    length = r.integer("sequence_len", low=1, high=MAX_SEQ_LEN)
    r.take("sequence_len", length if length is not None else f"not set: axolotl's default {AXOLOTL_SEQ_LEN}",
           "seq_len", length or AXOLOTL_SEQ_LEN)
    trainer_deepspeed(r, base)
    _precision(r, adapter=adapter)
    optim = (r.text("optimizer") or "").lower()
    if optim in TRAINER_OPTIM or not optim:
        optimizer, impl = TRAINER_OPTIM[optim or AXOLOTL_OPTIM]
        shown = optim or f"not set: axolotl's default {AXOLOTL_OPTIM}"
        r.take("optimizer", shown, "optimizer", optimizer)
        if impl is not None:
            r.take("optimizer", shown, "optimizer_impl", impl)
    else:
        r.notes.append(f"optimizer {optim} is not modelled: planned with --optimizer's default")
    fsdp_checkpointing = _fsdp(r)
    checkpointing = r.raw("gradient_checkpointing")
    if fsdp_checkpointing:  # FSDP's own, per block (accelerate applies it)
        r.take("fsdp_config.activation_checkpointing", True, "activation_checkpointing", "on")
    elif checkpointing in ("offload", "offload_disk"):
        r.take("gradient_checkpointing", checkpointing, "activation_checkpointing", "on")
    else:
        on = r.flag("gradient_checkpointing")
        r.take("gradient_checkpointing", on if on is not None else "not set: axolotl's default false",
               "activation_checkpointing", "on" if on else "off")
    _offloading(r, checkpointing, adapter=adapter)
    if r.flag("liger_fused_linear_cross_entropy"):
        r.take("liger_fused_linear_cross_entropy", True, "loss", "fused")
    _cut_cross_entropy(r)
    if not any(v.option == "strategy" for v in r.values):  # axolotl shards only through fsdp_config or deepspeed
        ddp_strategy(r, FILE_FORMAT, "axolotl, no fsdp_config or deepspeed")
    r.take(FILE_FORMAT, "axolotl", "recipe", "trainer")


def _cut_cross_entropy(r: Reader) -> None:
    """``plugins`` naming axolotl's CutCrossEntropyPlugin, whose ``cut_cross_entropy`` defaults to true
    (integrations/cut_cross_entropy/args.py): Apple's Cut Cross-Entropy computes the head and the loss block by block
    without keeping the logits, planned as --loss fused (Liger's fused linear cross-entropy, the kernel the trainer
    recipe counts, which keeps no full logits either). axolotl refuses it without bf16 or fp16, and beside its own
    chunked_cross_entropy."""
    plugins = r.raw("plugins")
    if plugins is None:
        return
    if not isinstance(plugins, list) or not all(isinstance(name, str) for name in plugins):
        raise r.fail("plugins", "must be a list of plugin class names")
    if not any(name.strip().endswith("CutCrossEntropyPlugin") for name in plugins):
        return
    if r.flag("cut_cross_entropy") is False:
        return
    if not (r.doc.get("bf16") or r.doc.get("fp16")):
        raise r.fail("plugins", "CutCrossEntropyPlugin needs bf16 or fp16 set (axolotl: 'Cut Cross Entropy requires "
                                "fp16/bf16 training')")
    if r.flag("chunked_cross_entropy"):
        raise r.fail("chunked_cross_entropy", "and CutCrossEntropyPlugin are both on: axolotl refuses the pair")
    r.take("plugins", "CutCrossEntropyPlugin", "loss", "fused")
    r.notes.append("Cut Cross-Entropy planned as --loss fused (Liger's fused linear cross-entropy: neither keeps the "
                   "logits; CCE keeps no logit chunk in GPU memory either, so the plan may hold a little more)")


def _offloading(r: Reader, checkpointing: object, *, adapter: str | None) -> None:
    """``activation_offloading`` (true, legacy, disk, hidden_states), or ``gradient_checkpointing`` offload /
    offload_disk, which axolotl's schema turns into checkpointing plus ``activation_offloading`` true / disk whatever
    the file says of it (schemas/validation.py ``check_gradient_checkpointing_w_offload``). TRL's offloader moves the
    checkpointed blocks' inputs to CPU memory (--activation-offload) for a full fine-tune (loaders/model.py
    ``_apply_activation_checkpointing`` keeps the recomputation) and under hidden_states; with adapters it replaces
    the recomputation, every saved tensor offloaded (planned as the checkpointed form, said). disk runs the same CPU
    offloader at axolotl@067b021: the disk patch (loaders/patch_manager.py) waits for "offload_disk", which the schema
    has already turned into "disk", and the trainer's offloading mixin has no disk branch."""
    key = "activation_offloading"
    if checkpointing in ("offload", "offload_disk"):
        r.raw(key)  # set by the schema whatever the file says
        key, mode = "gradient_checkpointing", True if checkpointing == "offload" else "disk"
    elif r.raw(key) is not None:
        mode = r.raw(key) if isinstance(r.raw(key), bool) else r.choice(key, {
            "true": True, "false": False, "legacy": "legacy", "disk": "disk", "hidden_states": "hidden_states"})
    else:
        return
    if mode is False:
        return
    if checkpointing not in ("offload", "offload_disk") and not r.flag("gradient_checkpointing"):
        raise r.fail(key, "needs gradient_checkpointing (axolotl: 'activation_offloading requires "
                          "gradient_checkpointing'; FSDP's own activation_checkpointing does not count)")
    shown = r.text(key) if isinstance(r.raw(key), str) else True
    if mode == "disk":
        r.notes.append(f"{key} {shown}: axolotl@067b021 runs TRL's CPU offloader for it, as for true (its disk patch "
                       "waits for 'offload_disk', which the schema has turned into 'disk')")
    if take_activation_offload(r, key, shown) and adapter and mode != "hidden_states":
        r.notes.append(f"{key} {shown} with adapters: axolotl's TRL offloader replaces the recomputation, every saved "
                       "tensor moved to CPU memory and none recomputed (loaders/model.py); planned as checkpointed "
                       "blocks with their inputs offloaded: near what the GPU holds (one block's saved tensors back at "
                       "a time), not the step's time")


def _fsdp(r: Reader) -> bool | None:
    """FSDP from the Trainer's ``fsdp`` words with ``fsdp_config`` (axolotl hands both to TrainingArguments), or from
    ``fsdp_config`` alone (axolotl's own schema, schemas/fsdp.py: full sharding unless ``reshard_after_forward`` is
    false, ``offload_params``); the version from ``fsdp_version`` (top level or in ``fsdp_config``), axolotl's
    default 1 (schemas/validation.py ``_resolve_fsdp_version``). Returns fsdp_config's activation_checkpointing."""
    config = r.raw("fsdp_config")
    words = r.raw("fsdp")
    if not config and not words:
        return None
    if config is not None and not isinstance(config, dict):
        raise r.fail("fsdp_config", "must be a mapping of keys")
    sub = fsdp_sub_reader(r, config)
    top = r.raw("fsdp_version")
    version = r.choice("fsdp_version", {"1": 1, "2": 2}) if top is not None else sub.choice("version", {"1": 1, "2": 2})
    key = "fsdp_version" if top is not None else "fsdp_config.fsdp_version"
    r.take(key if version else "fsdp_version", version or "not set: axolotl's default 1", "fsdp_version",
           version or 1)
    if words:
        return trainer_fsdp(r)
    r.read.add("fsdp_config")
    sharding = sub.choice("sharding_strategy", SHARDING) if sub.raw("sharding_strategy") is not None else (True, False)
    if sharding is None:  # NO_SHARD
        ddp_strategy(r, "fsdp_config.sharding_strategy", "NO_SHARD")
        return sub.flag("activation_checkpointing")
    reshard = sub.flag("reshard_after_forward")
    fsdp_strategy(r, "fsdp_config", reshard=sharding[0] if reshard is None else reshard,
                  offload=bool(sub.flag("offload_params")), value="fsdp_config")
    checkpointing = sub.flag("activation_checkpointing")
    r.nested.extend(sub.unread())
    return checkpointing


def _attention_switches(r: Reader) -> None:
    if r.raw("attn_implementation") is not None:
        take_attention(r)
        return
    for key, kernel in _OLD_ATTENTION.items():
        if r.flag(key):  # axolotl maps each switch to its attn_implementation (schemas/config.py, deprecated)
            take_attention(r, key, kernel)
            return


def _adapter(r: Reader) -> str | None:
    """LoRA or QLoRA from ``adapter``; the base's quantisation with it."""
    adapter = r.text("adapter")
    four, eight = r.flag("load_in_4bit"), r.flag("load_in_8bit")
    if adapter is None:
        if four or eight:
            raise r.fail("load_in_4bit" if four else "load_in_8bit", "needs adapter: lora or qlora (a quantised base "
                         "trains only through adapters)")
        return None
    adapter = adapter.lower()
    if adapter not in ("lora", "qlora"):
        raise r.fail("adapter", f"{adapter!r} is not modelled (lora, qlora)")
    if adapter == "qlora" and not four:
        raise r.fail("adapter", "qlora needs load_in_4bit: true (axolotl's QLoRA is its 4-bit base)")
    rank = r.integer("lora_r", low=1, high=MAX_LORA_RANK)
    if rank is None:
        raise r.fail("lora_r", f"is missing: adapter {adapter} needs a rank")
    r.take("lora_r", rank, "lora_rank", rank)
    linear = r.flag("lora_target_linear")
    if linear:
        r.take("lora_target_linear", True, "lora_targets", "all-linear")
    take_peft_keys(r, dora_key="peft_use_dora", targets_key=None if linear else "lora_target_modules")
    if four:  # src/axolotl/loaders/model.py: nf4, bnb_4bit_use_double_quant True
        r.take("load_in_4bit", True, "quantize", "nf4")
        r.take("adapter", "qlora: axolotl's nested quantisation", "double_quant", 1)
    elif eight:
        r.take("load_in_8bit", True, "quantize", "int8")
    return adapter


def _precision(r: Reader, *, adapter: str | None) -> None:
    """bf16 (true, or axolotl's default "auto") loads the model in bf16: pure bf16 for a full fine-tune on one GPU or
    DDP, bf16-mixed for adapters and where DeepSpeed or accelerate's FSDP keep or make fp32 weights."""
    said = r.doc.get("bf16")
    if said is None or (isinstance(said, str) and said.strip().lower() == "auto"):  # bf16 where the GPU has it
        r.read.add("bf16")
        bf16_on = None if r.flag("fp16") else True
        shown = "auto" if said is not None else "not set: axolotl's default auto"
    else:
        bf16_on, shown = r.flag("bf16"), None
    fp16 = r.flag("fp16")
    if bf16_on and fp16 and shown is None:
        raise r.fail("bf16", "and fp16 are both true")
    if fp16:
        r.take("fp16", True, "precision", "fp16-mixed")
    elif bf16_on:
        kept_fp32 = adapter is not None or any(v.option == "engine" for v in r.values) or r.raw("fsdp_config") \
            is not None or r.raw("fsdp") is not None
        r.take("bf16", shown or True, "precision", "bf16-mixed" if kept_fp32 else "bf16")
        if not kept_fp32:
            r.notes.append("bf16 full fine-tune: axolotl loads the model in bf16 and the Trainer keeps its weights and "
                           "AdamW state in bf16 on one GPU or DDP (pure bf16); under FSDP or DeepSpeed they are fp32")
    else:
        r.take("bf16", False, "precision", "fp32")

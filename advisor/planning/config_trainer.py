"""The Hugging Face TrainingArguments reader (``advisor plan --from training_args.json``, or a TRL CLI / alignment-
handbook YAML: TrainingArguments, TRL's config and its ModelConfig in one file, ``_model_arguments``).

Which keys it reads, and what they mean, from the framework's own definitions: TrainingArguments JSON
(transformers/training_args.py): ``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``bf16`` /
``fp16``, ``optim`` (transformers/trainer_optimizer.py maps ``adamw_torch`` to torch.optim.AdamW's default,
foreach on CUDA, and ``adamw_torch_fused`` to fused=True), ``gradient_checkpointing``
(``activation_checkpointing`` in transformers 5), ``accelerator_config.gradient_accumulation_kwargs.sync_each_batch``
(FSDP reduce-scatters every micro-batch instead of accelerate's no_sync), ``fsdp`` / ``fsdp_config``, ``deepspeed`` (a DeepSpeed
config inline or a path), ``use_liger_kernel``, ``parallelism_config``, ``ddp_bucket_cap_mb`` (DDP's own key: the file chose DDP),
and TRL's SFTConfig keys ``activation_offloading`` (trl/trainer/sft_config.py: its copy of torchtune's offloading hooks)
and ``max_length``. A key left out runs at the framework's default, TrainingArguments' (per_device_train_batch_size 8,
no checkpointing, DeepSpeed config or not) or, for a file with a key only SFTConfig has, TRL's (checkpointing on, bf16,
max_length 1024; other TRL configs the first two).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from advisor.model.lora import MAX_LORA_RANK
from advisor.training import MAX_SEQ_LEN
from advisor.planning.config_deepspeed import read_nested_deepspeed
from advisor.planning.config_file import (FILE_FORMAT, SHARDING, Reader, ddp_strategy, fsdp_strategy,
                                          fsdp_sub_reader, named_deepspeed, precision_for, take_batch, take_degrees,
                                          take_precision)

TRAINER_OPTIM: dict[str, tuple[str, str | None]] = {
    "adamw_torch_fused": ("adamw", "fused"), "adamw_torch": ("adamw", "foreach"), "adamw_apex_fused": ("adamw", "fused"),
    "adamw_bnb_8bit": ("adamw-8bit", None), "adamw_8bit": ("adamw-8bit", None),
    "paged_adamw_8bit": ("adamw-8bit-paged", None),
    # bitsandbytes' PagedAdamW32bit: torch AdamW's fp32 state, stepped in place per parameter (no step temporary);
    # its paging to CPU under memory pressure is not modelled
    "paged_adamw_32bit": ("adamw", "fused"),
    "adafactor": ("adafactor", None), "sgd": ("sgd", None)}


# Keys of TRL's configs (trl/trainer/*_config.py): a file with one is a TRL config, whose shared base
# (trl/trainer/base_config.py _BaseConfig) defaults gradient_checkpointing to True and bf16 to True when fp16 is not
# set. Those only SFTConfig has make it an SFTConfig (max_length, default 1024; loss_type); those of the preference and
# RL trainers (DPO's beta, GRPO's num_generations, completion lengths) make it another trainer's, whose sequence is
# not max_length.
TRL_KEYS = ("dataset_text_field", "dataset_kwargs", "dataset_num_proc", "packing", "packing_strategy", "padding_free",
            "completion_only_loss", "assistant_only_loss", "activation_offloading", "eval_packing",
            "chat_template_path", "shuffle_dataset", "truncation_mode")
SFT_ONLY_KEYS = ("dataset_text_field", "dataset_kwargs", "packing", "packing_strategy", "completion_only_loss",
                 "assistant_only_loss", "eval_packing", "max_seq_length")
OTHER_TRAINER_KEYS = ("beta", "num_generations", "max_completion_length", "max_prompt_length", "loss_type_dpo")
SFT_MAX_LENGTH = 1024  # SFTConfig.max_length's default


def _trl(r: Reader) -> bool:
    return any(r.raw(key) is not None for key in TRL_KEYS)


def _sft(r: Reader) -> bool:
    return (any(r.raw(key) is not None for key in SFT_ONLY_KEYS)
            and not any(r.raw(key) is not None for key in OTHER_TRAINER_KEYS))


def _momentum(args: str | None) -> float:
    """The momentum in ``optim_args`` ("momentum=0.9,nesterov=True": transformers' trainer_optimizer._parse_optim_args
    splits it on commas and equals signs, _get_sgd hands momentum to torch.optim.SGD), 0 where absent or not a number."""
    for part in (args or "").split(","):
        key, _, value = part.partition("=")
        if key.strip() == "momentum":
            try:
                return float(value)
            except ValueError:
                return 0.0
    return 0.0


# TrainingArguments' defaults for what a file leaves out (transformers/training_args.py, 5.23): the Trainer runs them.
TRAINER_MICRO_BATCH = 8  # per_device_train_batch_size


def read_trainer(r: Reader, base: Path) -> None:
    # A TRL CLI file (model_name_or_path beside the trainer's keys) names its trainer on the command line (trl sft,
    # trl dpo, ...): without another trainer's keys, read as SFTConfig
    cli = "model_name_or_path" in r.doc and not any(key in r.doc for key in OTHER_TRAINER_KEYS) and not _sft(r)
    sft = _sft(r) or cli
    if cli:
        r.notes.append("a TRL CLI config does not name its trainer (trl sft, trl dpo, ... on the command line): read "
                       "as trl sft's, SFTConfig's defaults for what it leaves out")
    # max_seq_length without max_length: an SFTConfig of TRL 0.9-0.19, older than TRL's own defaults (checkpointing
    # and bf16 on since 0.22, trl#3510): the Trainer's run
    trl = (_trl(r) or sft) and not (r.raw("max_seq_length") is not None and "max_length" not in r.doc)
    _model_arguments(r, trl=trl)
    take_batch(r, micro="per_device_train_batch_size", accumulation="gradient_accumulation_steps")
    if r.raw("per_device_train_batch_size") is None:
        # the Trainer's default, DeepSpeed config or not: it fills a DeepSpeed "auto" micro-batch with it and refuses
        # another number (HfTrainerDeepSpeedConfig.trainer_config_process; here the two keys disagree, one line)
        r.take("per_device_train_batch_size", f"not set: the Trainer's default {TRAINER_MICRO_BATCH}", "micro_batch",
               TRAINER_MICRO_BATCH)
    if trl and r.raw("bf16") is None and not r.flag("fp16"):
        r.take("bf16", "not set: TRL's default true", "precision", precision_for("trainer", "bf16"))
    take_precision(r, "trainer", "bf16", "fp16")
    if sft:
        _sft_length_and_loss(r)
    elif trl and any(r.raw(key) is not None for key in OTHER_TRAINER_KEYS):
        r.notes.append("a TRL config of a preference or RL trainer (DPO, GRPO, ...): its prompt and completion "
                       "lengths are not read (--seq-len), nor its reference model or generations")
    optim = r.text("optim")
    optim = optim.lower() if optim is not None else None
    if optim in TRAINER_OPTIM:
        optimizer, impl = TRAINER_OPTIM[optim]
        if optimizer == "sgd" and _momentum(r.text("optim_args")):  # torch.optim.SGD(momentum=...): a buffer a parameter
            r.take("optim_args", r.text("optim_args"), "optimizer", "sgd-momentum")
            r.notes.append("optim_args reach torch.optim.SGD since huggingface/transformers#44203 (February 2026); "
                           "earlier releases build SGD from the learning rate alone, with no momentum buffer: for them "
                           "plan --optimizer sgd")
        else:
            r.take("optim", optim, "optimizer", optimizer)
        if impl is not None:
            r.take("optim", optim, "optimizer_impl", impl)
    elif optim is not None:
        r.notes.append(f"optim {optim} is not modelled: planned with --optimizer's default")
    accelerator = r.raw("accelerator_config")
    if isinstance(accelerator, str):  # a path TrainingArguments reads (AcceleratorConfig.from_json_file): not followed
        r.notes.append("accelerator_config names a file: not read (its gradient_accumulation_kwargs.sync_each_batch, "
                       "if any, is not planned: --accumulation-sync)")
    elif isinstance(accelerator, dict):  # accelerate's GradientAccumulationPlugin kwargs; other keys listed unread
        r.read.discard("accelerator_config")
        sync = r.flag("accelerator_config.gradient_accumulation_kwargs.sync_each_batch")
        if sync is not None:
            r.take("accelerator_config.gradient_accumulation_kwargs.sync_each_batch", sync, "accumulation_sync",
                   "every_micro_batch" if sync else "last_micro_batch")
    if r.flag("use_liger_kernel"):
        r.take("use_liger_kernel", True, "loss", "fused")
    fsdp_checkpointing = trainer_fsdp(r)
    # Checkpointing is on when any of its keys says so: with FSDP, fsdp_config's own flag is the one that
    # counts and the top-level one is false (transformers issue 30404; advisor export writes it that way).
    said = {key: r.flag(key) for key in ("gradient_checkpointing", "activation_checkpointing")}
    said["fsdp_config.activation_checkpointing"] = fsdp_checkpointing
    given = {key: on for key, on in said.items() if on is not None}
    if given:
        key = next((k for k, on in given.items() if on), next(iter(given)))
        r.take(key, given[key], "activation_checkpointing", "on" if given[key] else "off")
    elif trl:  # TRL's _BaseConfig.gradient_checkpointing defaults to True
        r.take("gradient_checkpointing", "not set: TRL's default true", "activation_checkpointing", "on")
    else:  # TrainingArguments.gradient_checkpointing defaults to False: the Trainer runs none (a DeepSpeed config's
        # activation_checkpointing section is not read by Hugging Face models: gradient_checkpointing turns it on)
        r.take("gradient_checkpointing", "not set: the Trainer's default false", "activation_checkpointing", "off")
    trainer_deepspeed(r, base)
    _trl_offloading(r)
    if r.section("parallelism_config") is not None:
        take_degrees(r, "parallelism_config.", {"dp_replicate_size": "hybrid", "tp_size": "tp", "cp_size": "cp"},
                 implied="dp_shard_size")
    elif r.raw("ddp_bucket_cap_mb") is not None and not any(v.option in ("strategy", "engine") for v in r.values):
        # DDP's own key with neither fsdp nor deepspeed: the file chose DDP (the Trainer hands it to accelerate's
        # DistributedDataParallelKwargs as bucket_cap_mb, transformers trainer.py create_accelerator_and_postprocess). Without it the file does not fix the
        # strategy: the Trainer also runs FSDP when accelerate launch's own config says so (is_fsdp_enabled reads
        # the accelerator's state), which no key here shows.
        raw = r.raw("ddp_bucket_cap_mb")
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 < raw < float("inf"):  # NaN too
            raise r.fail("ddp_bucket_cap_mb", "must be a positive number of MiB")
        ddp_strategy(r, "ddp_bucket_cap_mb", raw)
    r.take(FILE_FORMAT, "TrainingArguments", "recipe", "trainer")


# TRL's ModelConfig (trl/trainer/model_config.py, huggingface/trl@f2cd577; alignment-handbook's ModelArguments before
# it, the same names and defaults): a TRL CLI or alignment-handbook YAML holds its keys beside the SFTConfig ones
# (TrlParser reads one file into both). Its LoRA defaults: rank 16, dropout 0.05, PEFT's targets for the model;
# load_in_4bit's nf4 without nested (double) quantisation.
TRL_LORA_RANK, TRL_LORA_DROPOUT = 16, 0.05
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "auto": "auto"}


def _model_arguments(r: Reader, *, trl: bool) -> None:
    """The model, its adapters and its quantised base from ModelConfig's keys (``model_name_or_path``,
    ``use_peft``, ``lora_*``, ``use_dora``, ``load_in_4bit`` / ``load_in_8bit``, ``bnb_4bit_quant_type``,
    ``use_bnb_nested_quant``); ``dtype`` (``torch_dtype`` before): a LoRA base's dtype (``frozen_base``; TRL's default
    float32 where left out), a note for a quantised base or a 16-bit full fine-tune. ``lora_alpha`` and ``use_rslora``
    scale the adapters' output: no memory or time."""
    name = r.text("model_name_or_path")
    if name:
        r.take("model_name_or_path", name, "model", name)
    take_attention(r)
    peft = r.flag("use_peft")
    four, eight = r.flag("load_in_4bit"), r.flag("load_in_8bit")
    if (four or eight) and not peft:  # transformers' Trainer refuses to train a purely quantised model
        raise r.fail("load_in_4bit" if four else "load_in_8bit", "needs use_peft: true (a quantised base trains only "
                     "through adapters)")
    if four and eight:
        raise r.fail("load_in_4bit", "and load_in_8bit are both true: transformers loads one or the other")
    dtype_key, dtype = _load_dtype(r)
    if not peft:
        if dtype in ("bf16", "fp16"):
            r.notes.append(f"{dtype_key} {r.text(dtype_key)}: a full fine-tune keeps 16-bit weights and AdamW state "
                           "on DDP or one GPU (plan --precision bf16 for it); accelerate's FSDP upcasts the trained "
                           "weights to fp32 under mixed precision and DeepSpeed keeps fp32 master weights, as planned")
        return
    rank = r.integer("lora_r", low=1, high=MAX_LORA_RANK)
    r.take("lora_r", rank if rank is not None else f"not set: TRL's default {TRL_LORA_RANK}", "lora_rank",
           rank or TRL_LORA_RANK)
    take_peft_keys(r, dora_key="use_dora", dropout_default=(TRL_LORA_DROPOUT, "TRL's"))
    r.raw("use_rslora")  # a scale: no memory or time
    if four:
        kind = r.choice("bnb_4bit_quant_type", {"nf4": "nf4", "fp4": "fp4"}) or "nf4"
        r.take("load_in_4bit", True, "quantize", kind)
        nested = r.flag("use_bnb_nested_quant")
        r.take("use_bnb_nested_quant", nested if nested is not None else "not set: TRL's default false",
               "double_quant", int(bool(nested)))
    elif eight:
        r.take("load_in_8bit", True, "quantize", "int8")
    if dtype in ("auto", "null") and not (four or eight):
        r.take(dtype_key, f"{dtype} (the checkpoint's dtype, planned as the compute dtype)", "frozen_base", "compute")
    elif dtype in ("bf16", "fp16") and not (four or eight):
        r.take(dtype_key, r.text(dtype_key), "frozen_base", "compute")
    elif dtype == "fp32" or (dtype is None and trl):
        said = f"{dtype_key} float32" if dtype == "fp32" else "dtype not set: TRL ModelConfig's default float32"
        if four or eight:  # the quantised linears have their own bytes; the rest is upcast as the preparation does
            r.notes.append(f"{said}: the modules left unquantised (embeddings, norms, head) load in fp32; planned "
                           "as the k-bit preparation holds them (--trl-release)")
        else:  # the base rests in fp32 beside the adapters (TRL's sft script passes dtype to from_pretrained)
            r.take(dtype_key, r.text(dtype_key) if dtype == "fp32" else "not set: TRL's default float32",
                   "frozen_base", "param")


def _load_dtype(r: Reader) -> tuple[str, str | None]:
    """The key that says the dtype TRL loads the model in, and its value (bf16, fp16, fp32, auto, null; None: not
    said):
    ModelConfig's ``dtype`` (``torch_dtype`` before), else an SFTConfig's ``model_init_kwargs`` ones (TRL loads a
    model named by a string with them, float32 unless they say: trl/trainer/utils.py create_model_from_path). A file
    with ModelConfig's keys is a ``trl sft`` config, whose script replaces model_init_kwargs with ModelConfig's dtype
    (trl/scripts/sft.py): its model_init_kwargs dtype is said to be ignored. "auto" and null load the checkpoint's
    dtype (transformers 5 reads a None dtype as "auto")."""
    inits = r.doc.get("model_init_kwargs") if isinstance(r.doc.get("model_init_kwargs"), dict) else {}
    init_key = next((f"model_init_kwargs.{key}" for key in ("dtype", "torch_dtype") if key in inits), None)
    key = next((key for key in ("dtype", "torch_dtype") if key in r.doc), None)
    if init_key is not None and any(name in r.doc for name in ("model_name_or_path", "use_peft")):
        r.raw(init_key)
        instead = f"the file's {key}" if key else "float32, as dtype is not set"
        r.notes.append(f"{init_key}: trl sft replaces model_init_kwargs with ModelConfig's dtype ({instead}; "
                       "trl/scripts/sft.py)")
        init_key = None
    key = key or init_key
    if key is None:
        return "dtype", None
    if r.raw(key) is None:  # "auto" (Reader.raw's None, listed as auto) or null: the checkpoint's dtype
        if f"{r.prefix}{key}" in r.auto:
            r.auto.remove(f"{r.prefix}{key}")
            return key, "auto"
        return key, "null"
    return key, r.choice(key, _DTYPES)


def take_peft_keys(r: Reader, *, dora_key: str, targets_key: str | None = "lora_target_modules",
                   dropout_default: tuple[float, str] | None = None) -> None:
    """The LoRA keys TRL's ModelConfig and axolotl name alike: ``targets_key`` (None: already taken),
    ``lora_modules_to_save``, ``lora_dropout`` (``dropout_default``: the framework's value and whose, taken when left
    out; without one a dropout of 0 is left to the plan's default 0), DoRA at ``dora_key``; ``lora_alpha`` scales the
    adapters' output: no memory or time."""
    for key, option in ((targets_key, "lora_targets"), ("lora_modules_to_save", "lora_modules_to_save")):
        names = _module_names(r, key) if key else None  # None: PEFT's targets for the model; no full copy
        if names:
            r.take(key, names, option, names)
    dropout = r.fraction("lora_dropout")
    if dropout is None and dropout_default is not None:
        value, whose = dropout_default
        r.take("lora_dropout", f"not set: {whose} default {value}", "lora_dropout", str(value))
    elif dropout or (dropout is not None and dropout_default is not None):
        r.take("lora_dropout", dropout, "lora_dropout", str(dropout))
    if r.flag(dora_key):
        r.take(dora_key, True, "dora", 1)
    r.raw("lora_alpha")


def _module_names(r: Reader, key: str) -> str | None:
    """A module name or a list of them (PEFT's target_modules, modules_to_save; "all-linear" too), comma-joined."""
    names = r.raw(key)
    if isinstance(names, str):
        names = [names]
    if names is not None and (not isinstance(names, list)
                              or not all(isinstance(name, str) and name.strip() for name in names)):
        raise r.fail(key, f"must be a module name or a list of them, got {names!r}"[:160])
    return ",".join(name.strip() for name in names) if names else None


# attn_implementation (transformers' attention interface): eager keeps the b x heads x s x s scores; the others keep
# none, planned as SDPA (--attention sdpa)
_SCORELESS = ("sdpa", "flash_attention_2", "flash_attention_3", "flex_attention", "xformers")  # xformers: axolotl's


def take_attention(r: Reader, key: str = "attn_implementation", kernel: str | None = None) -> None:
    """The attention ``key`` names (``kernel``: what a switch at ``key`` stands for) as --attention."""
    kernel = kernel or r.text(key)
    if kernel is None:
        return
    shown = kernel if key == "attn_implementation" else True
    if kernel.lower() == "eager":
        r.take(key, shown, "attention", "eager")
    elif kernel.lower() in _SCORELESS:
        r.take(key, shown, "attention", "sdpa")
    else:
        r.notes.append(f"{key} {kernel} is not modelled: planned with --attention's default (sdpa)")


def _sft_length_and_loss(r: Reader) -> None:
    """An SFTConfig's ``max_length`` is the longest sample (every sample with ``packing``): the plan's sequence length
    (1024 where not set; a null truncates nothing and is left to --seq-len). Its ``loss_type``: "chunked_nll" (the
    default since TRL 1.4.0, trl#5846, unless ``use_liger_kernel``) is --loss chunked, which the trainer recipe plans
    as TRL's kernel (``Recipe.chunked_logits`` "checkpointed"); "nll" the full logits (--loss hf); "dft" is not
    modelled (planned as nll, the same tensors with a per-token weight)."""
    if "max_length" not in r.doc and r.raw("max_seq_length") is not None:  # its name in TRL 0.9-0.19 (trl#2895)
        length = r.integer("max_seq_length", low=1, high=MAX_SEQ_LEN)
        r.take("max_seq_length", length, "seq_len", length)
        if r.raw("loss_type") is None:  # before chunked_nll existed (TRL 1.4.0): the full logits
            r.take("loss_type", "not set: nll (TRL before 0.20 has no other)", "loss", "hf")
            return
    elif "max_length" not in r.doc:
        r.take("max_length", f"not set: TRL SFTConfig's default {SFT_MAX_LENGTH}", "seq_len", SFT_MAX_LENGTH)
    else:
        length = r.integer("max_length", low=1, high=MAX_SEQ_LEN)
        if length is not None:
            r.take("max_length", length, "seq_len", length)
        else:  # null: TRL truncates nothing, so the longest sample in the data sets the peak
            r.notes.append("max_length null: TRL truncates nothing; planned at --seq-len (the longest sample in the "
                           "data decides the peak: give it as --seq-len)")
    loss = r.text("loss_type")
    if loss is None and r.flag("use_liger_kernel"):  # SFTConfig.__post_init__: nll under Liger (planned as fused)
        return
    loss = loss.lower() if loss is not None else None
    if loss is None:
        r.take("loss_type", "not set: TRL's default chunked_nll (since TRL 1.4.0)", "loss", "chunked")
        r.notes.append("loss_type not set: TRL before 1.4.0 runs nll, the full logits: for it plan --loss hf")
    elif loss == "chunked_nll":
        if r.flag("use_liger_kernel"):
            raise r.fail("loss_type", "chunked_nll with use_liger_kernel: TRL refuses the pair (SFTTrainer: 'not "
                         "compatible with use_liger_kernel=True')")
        r.take("loss_type", loss, "loss", "chunked")
    elif loss == "nll" and not r.flag("use_liger_kernel"):
        r.take("loss_type", loss, "loss", "hf")
    elif loss == "dft":
        r.notes.append("loss_type dft is not modelled: planned as nll, the full logits (DFT weights each token's "
                       "loss by its probability)")
    elif loss != "nll":  # SFTTrainer raises ValueError("Invalid `loss_type` ...") for any other
        raise r.fail("loss_type", f"{loss!r} is not one TRL's SFTTrainer accepts (nll, dft, chunked_nll)")


def _trl_offloading(r: Reader) -> None:
    """TRL's SFTConfig ``activation_offloading`` (a TrainingArguments with its own keys): planned where it is
    modelled, under checkpointing on the torch engine (advisor.estimate.activation_offload); elsewhere planned
    without it, said so (the plan then holds more on the GPU than the run does)."""
    offload = r.flag("activation_offloading")
    if offload:
        take_activation_offload(r, "activation_offloading", offload)


def take_activation_offload(r: Reader, key: str, value: Any) -> bool:
    """``key`` (saying ``value``) offloads the checkpointed blocks' inputs: taken as --activation-offload where that is
    modelled, under checkpointing on the torch engine (advisor.estimate.activation_offload); elsewhere a note, the plan
    made without it (it then holds more on the GPU than the run does). True when taken."""
    taken = {v.option: v.setting for v in r.values}
    if taken.get("activation_checkpointing") == "on" and taken.get("engine", "torch") == "torch":
        r.take(key, value, "activation_offload", True)
        return True
    where = "on the DeepSpeed engine" if taken.get("engine") == "deepspeed" else "without gradient checkpointing"
    what = key if key == "activation_offloading" else f"{key} {value} (activation offloading)"
    r.notes.append(f"{what} is planned under gradient checkpointing on the torch engine only; {where} the plan is made "
                   "without it (it holds more on the GPU than the run does)")
    return False


# transformers.trainer_utils.FSDPOption (5.23): the words of the legacy fsdp string or list
_FSDP_OPTIONS = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2", "offload", "auto_wrap")


def trainer_fsdp(r: Reader) -> bool | None:
    """FSDP from ``fsdp`` / ``fsdp_config``; returns fsdp_config's activation_checkpointing (None: not given)."""
    raw = r.raw("fsdp")
    if raw is None or raw is False or raw == "" or raw == []:
        return None
    if not isinstance(raw, (bool, str, list)):
        raise r.fail("fsdp", "must be true, a string such as 'full_shard auto_wrap', or a list of such words")
    words = _words(raw).lower().split()
    unknown = [word for word in words if word not in _FSDP_OPTIONS] if raw is not True else []
    if unknown:  # TrainingArguments refuses it: "Unknown `fsdp` option" (training_args.py, transformers 5.23)
        raise r.fail("fsdp", f"has the unknown option '{unknown[0][:40]}' (one of {', '.join(_FSDP_OPTIONS)})")
    if "no_shard" in words:
        ddp_strategy(r, "fsdp", raw)
        return None
    config = r.raw("fsdp_config")
    if isinstance(config, str):
        r.notes.append(f"fsdp_config {config[:40]} is a file: not read (its keys may change the plan)")
        config = None
    elif config is not None and not isinstance(config, dict):
        raise r.fail("fsdp_config", "must be a mapping of keys or a file path")
    # TrainingArguments strips the fsdp_ prefix of fsdp_config keys (training_args.py _process_fsdp_args).
    sub = fsdp_sub_reader(r, config)
    key, value = "fsdp", _words(raw)
    reshard = not any(w in ("shard_grad_op", "hybrid_shard_zero2") for w in words)
    written = sub.raw("reshard_after_forward")
    if written is not None:
        key, value = "fsdp_config.reshard_after_forward", str(written).lower()
        if isinstance(written, bool) or str(written).lower() in ("true", "false"):
            reshard = bool(sub.flag("reshard_after_forward"))
        else:  # FSDP1 spelt a sharding strategy here
            reshard = (sub.choice("reshard_after_forward", SHARDING) or (False, False))[0]
    offload = bool(sub.flag("cpu_offload")) or bool(sub.flag("offload_params")) or "offload" in words
    version = sub.choice("version", {"1": 1, "2": 2})  # TrainingArguments' default is 2 (training_args.py)
    if version == 1:
        r.take("fsdp_config.version", 1, "fsdp_version", 1)
    fsdp_strategy(r, key, reshard=reshard, offload=offload, value=value)
    checkpointing = sub.flag("activation_checkpointing")
    if any(w.startswith("hybrid_shard") for w in words):
        r.notes.append("fsdp hybrid_shard: replicas across nodes are planned with --hybrid N (the Trainer "
                       "arguments do not say how many nodes)")
    r.nested.extend(sub.unread())
    return checkpointing


def _words(raw: Any) -> str:
    return raw if isinstance(raw, str) else " ".join(map(str, raw)) if isinstance(raw, list) else str(raw).lower()


def trainer_deepspeed(r: Reader, base: Path) -> None:
    raw = r.raw("deepspeed")
    if raw is None or raw == "":
        return
    if isinstance(raw, str):
        doc, prefix = named_deepspeed(r, "deepspeed", raw, base), f"{Path(raw).name}:"
    elif isinstance(raw, dict):
        doc, prefix = raw, "deepspeed."
    else:
        raise r.fail("deepspeed", "must be a DeepSpeed config (a mapping) or the path of one")
    steps = doc.get("gradient_accumulation_steps")
    if (r.raw("gradient_accumulation_steps") is None and isinstance(steps, int) and not isinstance(steps, bool)
            and steps != 1):  # HfTrainerDeepSpeedConfig.trainer_config_process fill_match refuses the mismatch
        raise r.fail("gradient_accumulation_steps", f"is not set (the Trainer's default 1) and {prefix}"
                     f"gradient_accumulation_steps is {steps}: the Trainer refuses the mismatch; set it in the arguments")
    total = doc.get("train_batch_size")
    if r.raw("gradient_accumulation_steps") is None and isinstance(total, int) and not isinstance(total, bool):
        # the Trainer fill_match's train_batch_size against GPUs x micro-batch x its accumulation (1 here): the global
        # batch is checked against that when the plan's GPUs are known (advisor.cli.from_file)
        r.take("gradient_accumulation_steps", "not set: the Trainer's default 1", "gradient_accumulation", 1)
    read_nested_deepspeed(r, doc, prefix)
    r.take("deepspeed", "DeepSpeed config", "engine", "deepspeed")

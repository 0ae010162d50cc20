"""The Hugging Face TrainingArguments JSON reader (``advisor plan --from training_args.json``).

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

from advisor.training import MAX_SEQ_LEN
from advisor.planning.config_deepspeed import read_nested_deepspeed
from advisor.planning.config_file import (FILE_FORMAT, SHARDING, Reader, beside, fsdp_strategy, load_json,
                                          precision_for, take_batch, take_degrees, take_precision)

_TRAINER_OPTIM: dict[str, tuple[str, str | None]] = {
    "adamw_torch_fused": ("adamw", "fused"), "adamw_torch": ("adamw", "foreach"), "adamw_apex_fused": ("adamw", "fused"),
    "adamw_bnb_8bit": ("adamw-8bit", None), "adamw_8bit": ("adamw-8bit", None),
    "paged_adamw_8bit": ("adamw-8bit-paged", None),
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
                 "assistant_only_loss", "eval_packing")
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
    trl, sft = _trl(r) or _sft(r), _sft(r)
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
    if optim in _TRAINER_OPTIM:
        optimizer, impl = _TRAINER_OPTIM[optim]
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
    fsdp_checkpointing = _trainer_fsdp(r)
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
    _trainer_deepspeed(r, base)
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
        r.take("ddp_bucket_cap_mb", raw, "engine", "torch")
        r.take("ddp_bucket_cap_mb", raw, "strategy", "ddp")
    r.take(FILE_FORMAT, "TrainingArguments", "recipe", "trainer")


def _sft_length_and_loss(r: Reader) -> None:
    """An SFTConfig's ``max_length`` is the longest sample (every sample with ``packing``): the plan's sequence length
    (1024 where not set; a null truncates nothing and is left to --seq-len). Its ``loss_type``: "chunked_nll" (the
    default since TRL 1.4.0, trl#5846, unless ``use_liger_kernel``) is --loss chunked, which the trainer recipe plans
    as TRL's kernel (``Recipe.chunked_logits`` "checkpointed"); "nll" the full logits (--loss hf); "dft" is not
    modelled (planned as nll, the same tensors with a per-token weight)."""
    if "max_length" not in r.doc:
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
    if not offload:
        return
    taken = {v.option: v.setting for v in r.values}
    if taken.get("activation_checkpointing") == "on" and taken.get("engine", "torch") == "torch":
        r.take("activation_offloading", offload, "activation_offload", True)
        return
    where = "on the DeepSpeed engine" if taken.get("engine") == "deepspeed" else "without gradient checkpointing"
    r.notes.append(f"activation_offloading is planned under gradient checkpointing on the torch engine only; {where} "
                   "the plan is made without it (it holds more on the GPU than the run does)")


# transformers.trainer_utils.FSDPOption (5.23): the words of the legacy fsdp string or list
_FSDP_OPTIONS = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2", "offload", "auto_wrap")


def _trainer_fsdp(r: Reader) -> bool | None:
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
        r.take("fsdp", raw, "engine", "torch")
        r.take("fsdp", raw, "strategy", "ddp")
        return None
    config = r.raw("fsdp_config")
    if isinstance(config, str):
        r.notes.append(f"fsdp_config {config[:40]} is a file: not read (its keys may change the plan)")
        config = None
    elif config is not None and not isinstance(config, dict):
        raise r.fail("fsdp_config", "must be a mapping of keys or a file path")
    # TrainingArguments strips the fsdp_ prefix of fsdp_config keys (training_args.py _process_fsdp_args).
    sub = Reader({k.removeprefix("fsdp_"): v for k, v in (config or {}).items()}, where=r.where, prefix="fsdp_config.")
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


def _trainer_deepspeed(r: Reader, base: Path) -> None:
    raw = r.raw("deepspeed")
    if raw is None or raw == "":
        return
    if isinstance(raw, str):
        doc, prefix = load_json(beside(raw, base, r), deepspeed=True), f"{Path(raw).name}:"
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

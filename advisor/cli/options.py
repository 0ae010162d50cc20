"""The plan options shared by ``advisor plan``, ``simulate``, ``compare``, ``export`` and ``launch``: one
definition, so every command spells every setting the same way, and one function that turns the
parsed values into ``advisor.plan`` arguments (only options the user gave, so the rest are reported
as assumptions). Every option that changes the plan belongs here (``--policy`` included), so an
export is always the plan ``advisor plan`` showed for the same options. Choices come from the
tables and Literals that define them: ``advisor.strategies.STRATEGIES``, ``advisor.precision.PRECISIONS``
and the Literals of ``advisor.training``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, get_args

import click

from advisor.mesh import PP_SCHEDULES
from advisor.model.heads import CAUSAL_LM, task_names
from advisor.model.lora import MAX_LORA_RANK
from advisor.precision import PRECISIONS
from advisor.recipes import AccumulationSync, FrozenBase, OptimizerImpl, RecipeName
from advisor.strategies import STRATEGIES
from advisor.calibration import Margin
from advisor.training import (MAX_GLOBAL_BATCH, MAX_MICRO_BATCH, MAX_SEQ_LEN, Attention, Checkpointing, Engine,
                               LossKernel, Optimizer, Policy, Quantization)
from advisor.simulate.profile_cache import default_cache_dir


def _choice(names) -> click.Choice:
    """Choices from the table or Literal that defines them (never a hand-copied list)."""
    return click.Choice(tuple(names), case_sensitive=False)


class FiniteRange(click.FloatRange):
    """``click.FloatRange`` that also refuses ``nan`` and ``inf`` (a NaN compares false with both bounds,
    so FloatRange lets it through; ``inf`` then overflows ``int(gib * GIB)`` in the planner)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if number != number or number in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


EXIT_NOTHING_FITS = 3  # plan and compare: nothing fits (the output says how many GPUs would)


def _micro_batch(value: str | None) -> int | None:
    if value is None or value.strip().lower() == "auto":
        return None
    try:
        number = int(value)
    except ValueError:
        raise click.BadParameter(f"expected a positive integer or 'auto', got '{value[:20]}'", param_hint="--micro-batch") from None
    if not 1 <= number <= MAX_MICRO_BATCH:
        raise click.BadParameter(f"must be 1 to {MAX_MICRO_BATCH:,}, got {number}"[:80], param_hint="--micro-batch")
    return number


CHART_SUFFIXES = (".svg", ".html", ".htm")


def chart_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A chart file's name: the charts are SVG (or SVG in an HTML page), so another suffix such as .png is
    refused before any work rather than written as SVG under a name that says otherwise."""
    if value is not None and value.rstrip().endswith(("/", "\\")):  # a folder's name: its .svg is not a file's
        raise click.BadParameter(f"'{value[:60]}' ends in a path separator, a folder: name the chart file itself "
                                 "(.svg or .html)", param_hint=f"--{param.name.split('_')[0]}")
    if value is not None and not value.lower().endswith(CHART_SUFFIXES):
        raise click.BadParameter(f"the chart is written as SVG or HTML: name the file .svg or .html, "
                                 f"not '{Path(value).name[:40]}'", param_hint=f"--{param.name.split('_')[0]}")
    return value


GPUS_OPTION = click.option("--gpus", "-g", help="e.g. 2xA100, 8xH100, 2x8xH100 (see `advisor gpus`); default: this "
                           "machine's GPUs.")
PLAN_OPTIONS: list[Callable] = [
    click.option("--model", "-m", "model", help="Bundled id, Hub id, local dir / config.json."),
    click.option("--params", "params", help="Model size only, e.g. 7.5B (no architecture)."),
    GPUS_OPTION,
    click.option("--nodes", type=click.IntRange(1, 16384), help="Nodes (then --gpus counts per node)."),
    click.option("--interconnect", help="Inter-node link, e.g. ib-ndr, eth-100g."),
    click.option("--optimizer", type=_choice(get_args(Optimizer)), help="Default adamw."),
    click.option("--precision", type=_choice(PRECISIONS), help="Default bf16-mixed."),
    click.option("--seq-len", callback=lambda ctx, param, value: _seq_len(value),
                 help="Tokens per sample (default 2048, or the model's context where shorter), or 'max': the longest that fits at micro-batch 1."),
    click.option("--target-len", type=click.IntRange(1, MAX_SEQ_LEN),
                 help="Decoder tokens per sample (encoder-decoder models; default: --seq-len)."),
    click.option("--images-per-sample", type=click.IntRange(0, 4096),
                 help="Images per sample (vision-language models): their tokens join --seq-len."),
    click.option("--image-size", type=click.IntRange(1, 16384),
                 help="Assumed image side in pixels (default 448: 256 tokens on Qwen2.5-VL)."),
    click.option("--micro-batch", "micro_batch", help="Per-GPU batch, or 'auto' (default: the largest that fits within --headroom; without --global-batch it "
                      "sets the step's batch)."),
    click.option("--global-batch", type=click.IntRange(1, MAX_GLOBAL_BATCH), help="Samples per optimizer step (grad accumulation)."),
    click.option("--activation-checkpointing", type=_choice(get_args(Checkpointing)),
                 help="auto (default: every mode tried at its largest micro-batch within --headroom; the one "
                      "that recomputes least within 3% of the fastest), on, selective or off."),
    click.option("--trainable-params", help="Only N (or P%) parameters train: frozen backbone."),
    click.option("--lora", "lora_rank", type=click.IntRange(1, MAX_LORA_RANK),
                 help="LoRA rank: adapters on --lora-targets train, the base is frozen."),
    click.option("--lora-targets", help="Comma-separated module names, or all-linear (default: PEFT's for the model)."),
    click.option("--dora", is_flag=True, default=None, help="DoRA: LoRA plus a magnitude vector per target."),
    click.option("--lora-dropout", type=FiniteRange(0, 1, max_open=True), help="Dropout on the adapters' input (default 0)."),
    click.option("--lora-modules-to-save", "lora_modules_to_save",
                 help="Comma-separated modules PEFT trains a full copy of (modules_to_save), e.g. embed_tokens,lm_head "
                      "(default with --task: the head)."),
    click.option("--task", help=f"The model's head: {', '.join(task_names())} (default {CAUSAL_LM}, or the head "
                                "class the config's architectures names)."),
    click.option("--num-labels", "num_labels", type=int, help="Labels of a classification head (default 2, or the "
                                                           "config's)."),
    click.option("--quantize", type=_choice(get_args(Quantization)),
                 help="QLoRA: base weights in bitsandbytes nf4, fp4 or int8 (needs --lora)."),
    click.option("--double-quant/--no-double-quant", "double_quant", default=None,
                 help="4-bit: quantise the absmax too (bnb_4bit_use_double_quant; default on)."),
    click.option("--recipe", type=_choice(get_args(RecipeName)),
                 help="The training stack (profiles/recipes.json): torch (default), trainer, lightning, torchtitan, "
                      "deepspeed or torchtune; sets the optimizer implementation, frozen-base dtype, loss and engine."),
    click.option("--optimizer-impl", type=_choice(get_args(OptimizerImpl)),
                 help="How AdamW steps: fused, foreach or for-loop (default: the recipe's)."),
    click.option("--frozen-base", "frozen_base", type=_choice(get_args(FrozenBase)),
                 help="The dtype a LoRA base is loaded in under mixed precision: compute (bf16 / fp16, as "
                      "from_pretrained's dtype='auto' or bfloat16 loads it) or param (fp32: TRL's trl sft leaves "
                      "dtype at float32 unless told). Default: the recipe's."),
    click.option("--accumulation-sync", type=_choice(get_args(AccumulationSync)),
                 help="How gradients accumulate over micro-batches under FSDP: every_micro_batch (reduce-scatter each; "
                      "the Trainer's sync_each_batch) or last_micro_batch (unsharded until the last, accelerate's "
                      "no_sync). Default: the recipe's (the Trainer: last_micro_batch)."),
    click.option("--optimizer-in-backward", "optimizer_in_backward", is_flag=True, default=None,
                 help="Step each parameter in backward as its gradient is ready and free the gradient (torchtune's "
                      "optimizer_in_bwd): no full gradient buffer. One GPU, no gradient accumulation."),
    click.option("--activation-offload", "activation_offload", is_flag=True, default=None,
                 help="Move saved activations to CPU memory in forward and back in backward (torchtune's "
                      "enable_activation_offloading, TRL's activation_offloading): each checkpointed block's input "
                      "leaves the GPU. Needs activation checkpointing (auto tries selective and full); data "
                      "parallelism on the torch engine only."),
    click.option("--fsdp-version", type=click.IntRange(1, 2), help="FSDP the sharded torch strategies run: 2 "
                 "(fully_shard, default) or 1 (FullyShardedDataParallel, flat parameters: accelerate's default). "
                 "wrap() and the exports apply FSDP2."),
    click.option("--torch-release", "torch_release", metavar="VERSION",
                 help="The torch release the run uses, where a release changes what is allocated "
                      "(profiles/library_releases.json: FSDP2 reshards its root after forward since 2.8.0; zero_grad() "
                      "frees the gradients since 2.0.0, before it they stayed allocated as zeros); "
                      "default: the newest release's behaviour."),
    click.option("--transformers-release", "transformers_release", metavar="VERSION",
                 help="The transformers release the run uses, where a release changes what is allocated "
                      "(profiles/library_releases.json: the Trainer's gradient checkpointing is reentrant before "
                      "5.0.0, which decides what LLM.int8 linears keep); default: the newest release's behaviour."),
    click.option("--trl-release", "trl_release", metavar="VERSION",
                 help="The TRL release the trainer recipe's SFTTrainer uses: 0.26 or later keeps a 4-bit / 8-bit "
                      "base in bf16 and trains bf16 adapters (profiles/library_releases.json; modelled under "
                      "bf16-mixed on the torch engine); default: "
                      "prepare_model_for_kbit_training's fp32 upcast and fp32 adapters, as TRL before 0.26 and "
                      "PEFT's QLoRA examples prepare the model."),
    click.option("--engine", type=_choice(get_args(Engine)), help="torch (default) or deepspeed."),
    click.option("--strategy", type=_choice(STRATEGIES), help="Evaluate only this one."),
    click.option("--policy", type=_choice(get_args(Policy)),
                 help="How to choose among strategies that fit: thresholds (default) or fastest."),
    click.option("--loss", type=_choice(get_args(LossKernel)),
                 help="hf (default: full logits + fp32 copy), chunked, or fused (no logits kept)."),
    click.option("--attention", type=_choice(get_args(Attention)), help="sdpa (default) or eager."),
    click.option("--use-cache", "use_cache", is_flag=True, default=None,
                 help="The model keeps its KV cache in training (config.use_cache left on under torch's "
                      "checkpoint_wrapper, as accelerate's and Lightning's FSDP checkpointing leave it); default "
                      "off, as HF Trainer, gradient_checkpointing_enable() and wrap() set it."),
    click.option("--float8", "float8", is_flag=True, default=None,
                 help="torchao float8 training (tensorwise dynamic scaling) on the blocks' linear layers, as "
                      "torchtitan's float8 converter applies it; needs fp8 tensor cores (Ada, Hopper, Blackwell, MI300)."),
    click.option("--float8-all-gather", "float8_all_gather", is_flag=True, default=None,
                 help="With --float8: FSDP all-gathers the converted weights in fp8 (enable_fsdp_float8_all_gather)."),
    click.option("--compile", "compile", is_flag=True, default=None,
                 help="The blocks run under torch.compile (inductor): fused norms, RoPE, SiLU and residual adds "
                      "save HBM traffic (Llama-like decoders; memory: fewer saved activations in a block without "
                      "checkpointing, else as eager). Default off."),
    click.option("--reserve-gib", type=FiniteRange(0, 1024), help="Fixed runtime overhead per GPU in GiB (default: calibrated, 0.256)."),
    click.option("--context-gib", type=FiniteRange(0, 64), help="CUDA context and NCCL buffers per GPU in GiB, outside the allocator (default 1, 0.5 on one GPU, which has no NCCL communicator: assumptions; on an H100 1.3 and 0.75, measured, NCCL's buffers at world size 1 only)."),
    click.option("--fit-fragmentation", "fit_fragmentation", type=FiniteRange(0, 1),
                 help="The part of the allocator's gap (a share of the peak) that must fit; the allocator frees the "
                      "rest, its cached blocks, before an allocation fails (default: all of it, the calibrated 10.4%; "
                      "0.028 judges every measured run under a cap on reserved memory right: "
                      "profiles/allocator_overhead.json capped_fit_fragmentation)."),
    click.option("--margin", type=_choice(get_args(Margin)),
                 help="Which end of the estimate's measured range decides the fit: low, expected (default) or high."),
    click.option("--headroom", type=FiniteRange(0, 1, max_open=True),
                 help="Share of GPU memory a comfortable plan leaves free (default 0.1): auto checkpointing "
                      "turns on to keep it; preferred among equally fast plans."),
    click.option("--cpu-memory-gib", type=FiniteRange(0, 2**20, min_open=True), help="CPU RAM per node, for offload."),
    click.option("--cpu-step-rate", type=FiniteRange(1e3, 1e13),
                 help="Offload: how many parameters a second the optimizer of one training process steps on your "
                      "CPU (torch AdamW: python benchmarks/cpu_optimizer.py measures it; DeepSpeed's CPU-Adam: time "
                      "its step). Default: a measured EPYC core's torch AdamW rate, or DeepSpeed's CPU-Adam's."),
    click.option("--trust-remote-code", is_flag=True, help="Allow the model's own code to run."),
    click.option("--tp", type=click.IntRange(1, 1024), help="Pin the tensor-parallel degree (Megatron column/row split; no sequence parallelism: norms and block inputs stay whole on every TP rank, except under --recipe torchtitan, which shards them along the sequence and keeps the loss vocabulary-parallel)."),
    click.option("--cp", type=click.IntRange(1, 1024), help="Pin the context-parallel degree (ring attention)."),
    click.option("--pp", type=click.IntRange(1, 1024), help="Pin the pipeline-parallel degree (stages across nodes "
                 "first; it must divide the layers)."),
    click.option("--pp-schedule", type=_choice(PP_SCHEDULES), help="Pin the pipeline schedule: "
                 f"{', '.join(PP_SCHEDULES)} (default: the planner tries 1f1b and interleaved_1f1b with 2 "
                 "chunks a rank and takes the faster that fits)."),
    click.option("--virtual-stages", type=click.IntRange(1, 64), help="Model chunks per pipeline rank "
                 "(interleaved_1f1b; zbv and dualpipev run 2)."),
    click.option("--pp-layers", callback=lambda ctx, param, value: _pp_layers(value),
                 help="Decoder layers per pipeline rank, first to last, e.g. 15,16,15,15 (an uneven split)."),
    click.option("--ep", type=click.IntRange(1, 1024), help="Pin the expert-parallel degree (MoE: routed experts "
                 "split over ep ranks of dp_shard x cp)."),
    click.option("--hybrid", callback=lambda ctx, param, value: _hybrid(value),
                 help="N: pin HSDP replicas (dp_replicate) in the plan. on/off (export): check that the plan is / is not "
                      "hybrid-sharded; the export writes the plan."),
    click.option("--from", "from_file", metavar="FILE",
                 help="Read the run's own config: an accelerate YAML, a DeepSpeed JSON, a torchtitan TOML, a torchtune "
                      "YAML, a TrainingArguments JSON, a TRL (trl sft --config) YAML or an axolotl YAML. It sets the recipe "
                      "and every knob it fixes (strategy, engine, precision, batch, checkpointing, optimizer, degrees; "
                      "torchtune's builder, TRL's and axolotl's model keys also the model and LoRA); options given here "
                      "win over the file. --gpus NAME without a count takes the file's "
                      "process count."),
    click.option("--no-trace", is_flag=True, help="A family with no activation formula: assume a Llama-like decoder "
                 "instead of tracing the model on fake tensors (the default; cached in ~/.cache/dp-advisor)."),
]


def plan_options(func: Callable, *, gpus: Callable = GPUS_OPTION) -> Callable:
    """The plan's options on ``func``; ``gpus``: the --gpus option to use (compare's takes several)."""
    for option in reversed(PLAN_OPTIONS):
        func = (gpus if option is GPUS_OPTION else option)(func)
    return func


_TRAINING_FIELDS = {
    "optimizer": "optimizer",
    "precision": "precision",
    "seq_len": "seq_len",
    "target_len": "target_len",
    "images_per_sample": "images_per_sample",
    "image_size": "image_size",
    "global_batch": "global_batch_size",
    "activation_checkpointing": "activation_checkpointing",
    "recipe": "recipe",
    "optimizer_impl": "optimizer_impl",
    "frozen_base": "frozen_base",
    "accumulation_sync": "accumulation_sync",
    "optimizer_in_backward": "optimizer_in_backward",
    "activation_offload": "activation_offload",
    "torch_release": "torch_release",
    "transformers_release": "transformers_release",
    "trl_release": "trl_release",
    "fsdp_version": "fsdp_version",  # set by --from (accelerate's fsdp_version, the Trainer's fsdp_config version)
    "engine": "engine",
    "policy": "policy",
    "attention": "attention",
    "use_cache": "use_cache",
    "float8": "float8",
    "float8_all_gather": "float8_all_gather",
    "compile": "compile",
    "loss": "loss",
    "quantize": "quantize",
    "double_quant": "double_quant",
    "reserve_gib": "reserve_gib",
    "context_gib": "context_gib",
    "fit_fragmentation": "fit_fragmentation",
    "headroom": "headroom",
    "margin": "margin",
    "cpu_memory_gib": "cpu_memory_gib",
    "cpu_step_rate": "cpu_step_rate",
}


def plan_kwargs(options: dict[str, Any], *, need_gpus: bool = True) -> dict[str, Any]:
    """``advisor.plan`` keyword arguments from parsed CLI values, leaving out what was not given.

    ``need_gpus=False`` (the ``--cpu`` test config, which makes no GPU plan) leaves ``gpus`` as given,
    possibly None, instead of detecting this machine's GPUs."""
    if options.get("from_file") is not None:  # --from FILE: its settings under the options typed (advisor/cli/from_file.py)
        from advisor.cli.from_file import apply_config_file, summary_lines

        options, done = apply_config_file(options["from_file"], options, need_gpus=need_gpus)
        for line in summary_lines(done):  # `advisor plan` prints them in full; the other commands on stderr
            click.echo(f"advisor: note: {line}", err=True)
    model, params = options.get("model"), options.get("params")
    if (model is None) == (params is None):
        raise click.UsageError("give exactly one of --model or --params")
    flag = "--params"
    if model is not None and model.strip()[:1].isdigit() and "/" not in model:
        model, params, flag = None, model, "--model (a size)"  # read as a size, as inspect does
    kwargs: dict[str, Any] = {
        "model": model if model is not None else _size_spec(params, flag),
        "gpus": options.get("gpus") or (require_local_gpus(options.get("gpus")) if need_gpus else None),
        "nodes": options.get("nodes"),
        "interconnect": options.get("interconnect"),
        "trainable_params": options.get("trainable_params"),
        "strategy": options.get("strategy"),
        "trust_remote_code": bool(options.get("trust_remote_code")),
        # Traced activation profiles (families with no formula) are cached in the user's cache directory,
        # the one path read from the environment (advisor.simulate.profile_cache.default_cache_dir).
        "cache_dir": default_cache_dir(),
    }
    if options.get("no_trace"):
        kwargs["trace"] = False
    lora = _lora(options)
    if lora is not None:
        kwargs["lora"] = lora
    micro = _micro_batch(options.get("micro_batch"))
    if micro is not None:
        kwargs["micro_batch_size"] = micro
    for cli_name, field in _TRAINING_FIELDS.items():
        value = options.get(cli_name)
        if value is not None:
            kwargs[field] = value.lower() if isinstance(value, str) else value
    zero = {option.removeprefix("zero."): value for option, value in options.items()
            if option.startswith("zero.") and value is not None}  # DeepSpeed sizes from --from (ZeroSettings)
    if zero:
        kwargs["zero"] = zero
    for head_option in ("task", "num_labels"):  # advisor.model.heads validates them (one-line errors)
        if options.get(head_option) is not None:
            kwargs[head_option] = options[head_option]
    for degree in ("tp", "cp", "pp", "virtual_stages", "ep"):
        if options.get(degree) is not None:
            kwargs[degree] = options[degree]
    if options.get("pp_layers") is not None:
        kwargs["pp_layers"] = options["pp_layers"]
    if options.get("pp_schedule") is not None:
        kwargs["pp_schedule"] = options["pp_schedule"].lower()
    if isinstance(options.get("hybrid"), int):
        kwargs["hybrid"] = options["hybrid"]
    if kwargs["strategy"] is not None:
        kwargs["strategy"] = kwargs["strategy"].lower()
    return kwargs


def _seq_len(value: str | None) -> int | str | None:
    if value is None or value.strip().lower() == "max":
        return None if value is None else "max"
    try:
        length = int(value)
    except ValueError:
        raise click.BadParameter(f"expected a number of tokens or 'max', got '{value[:20]}'", param_hint="--seq-len") from None
    if not 1 <= length <= MAX_SEQ_LEN:
        raise click.BadParameter(f"must be between 1 and {MAX_SEQ_LEN:,}", param_hint="--seq-len")
    return length


def _pp_layers(value: str | None) -> tuple[int, ...] | None:
    """``--pp-layers 15,16,15,15``: decoder layers per pipeline rank."""
    if value is None:
        return None
    try:
        counts = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected layer counts separated by commas, got '{value[:40]}'",
                                 param_hint="--pp-layers") from None
    if not counts or min(counts) < 1:
        raise click.BadParameter("every rank needs at least one layer", param_hint="--pp-layers")
    return counts


def refuse_hybrid_switch(options: dict[str, Any]) -> None:
    """``--hybrid on|off`` checks what an export writes; a command that only plans has nothing to check."""
    if options.get("hybrid") in ("on", "off"):
        raise click.UsageError(f"--hybrid {options['hybrid']} checks the plan an export writes (advisor export); "
                               "to plan replicas give --hybrid N")


def _hybrid(value: str | None) -> int | str | None:
    """``--hybrid N`` pins dp_replicate; ``auto|on|off`` is the export's HSDP switch (``ExportOptions.hybrid``)."""
    if value is None or value.strip().lower() in ("auto", "on", "off"):
        return None if value is None else value.strip().lower()
    try:
        number = int(value)
    except ValueError:
        raise click.BadParameter(f"expected a number of replicas or auto/on/off, got '{value[:20]}'",
                                 param_hint="--hybrid") from None
    if number < 1:
        raise click.BadParameter("must be at least 1", param_hint="--hybrid")
    return number


def _lora(options: dict[str, Any]) -> Any:
    """A ``LoraConfig`` from ``--lora/--lora-targets/--dora``, or None; targets or DoRA need a rank."""
    rank, targets, dora = options.get("lora_rank"), options.get("lora_targets"), options.get("dora")
    dropout, saved = options.get("lora_dropout"), options.get("lora_modules_to_save")
    if rank is None:
        if targets or dora or dropout is not None or saved:
            raise click.UsageError("--lora-targets, --lora-dropout, --lora-modules-to-save and --dora need --lora RANK")
        return None
    from advisor.model.lora import ALL_LINEAR, LoraConfig

    names: Any = None
    if targets is not None:
        names = ALL_LINEAR if targets.strip().lower() == ALL_LINEAR else tuple(
            name.strip() for name in targets.split(",") if name.strip())
        if not names:
            raise click.UsageError("--lora-targets names no module: give comma-separated names or all-linear, or leave "
                                   "it out for PEFT's defaults")
    kept = tuple(name.strip() for name in (saved or "").split(",") if name.strip()) or None
    from pydantic import ValidationError

    try:
        return LoraConfig(rank=rank, targets=names or None, dora=bool(dora), dropout=dropout or 0.0,
                          modules_to_save=kept)
    except ValidationError as err:  # LoraConfig's own checks (all-linear among names): one line naming the option
        problem = err.errors()[0]
        field = {"targets": "--lora-targets", "rank": "--lora", "dropout": "--lora-dropout",
                 "modules_to_save": "--lora-modules-to-save"}.get(str(problem["loc"][0]) if problem["loc"] else "", "--lora")
        raise click.UsageError(f"{field}: {problem['msg'].removeprefix('Value error, ')}") from None


def require_local_gpus(given: str | None = None) -> str:
    """The ``--gpus`` default: this machine's GPUs (said on stderr), or a usage error when it has none; an empty
    ``given`` (``--gpus ''``) is a usage error of its own."""
    from advisor.hardware.local_gpus import detect_local_gpus

    if given is not None:
        raise click.UsageError("--gpus is empty: pass e.g. --gpus 8xH100 (or leave it out for this machine's GPUs)")
    detected = detect_local_gpus()
    if detected is None:
        raise click.UsageError("no --gpus given and no NVIDIA GPU found on this machine; pass e.g. --gpus 8xH100")
    click.echo(f"advisor: note: --gpus not given; using this machine's GPUs: {detected}", err=True)
    return detected


def _size_spec(params: str, flag: str = "--params"):
    from advisor.model.sources import resolve_size

    return resolve_size(params, what=flag)

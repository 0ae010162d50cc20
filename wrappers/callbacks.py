"""A pre-flight memory check where training starts: one line in a Hugging Face ``Trainer`` or a
Lightning ``Trainer``.

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[AdvisorCallback(seq_len=2048)])
    trainer = L.Trainer(..., callbacks=[AdvisorLightningCallback(seq_len=2048, micro_batch_size=4)])

At train begin the callback reads what the trainer will really run (the live model, PEFT adapters
included; the per-device batch, gradient accumulation and world size; the precision flags;
gradient checkpointing; the optimizer and its implementation; FSDP or DeepSpeed settings), plans it
with its own framework's recipe row (``trainer`` or ``lightning``, ``profiles/recipes.json``) with
``advisor.plan`` for the GPUs this process sees (or ``gpus=``), prints the verdict once (rank 0),
and with ``strict=True`` raises ``RuntimeError`` with the planner's advice before the first step
instead of an out-of-memory error an hour later. Without a visible GPU and no ``gpus=`` there is
nothing to check against: it says so and lets training run.
"""

from __future__ import annotations

import json
from typing import Any

from transformers import TrainerCallback

from advisor.frozen import validated_copy
from advisor.planning.api import Plan, plan
from advisor.planning.config_trainer import TRAINER_OPTIM
from advisor.precision import PRECISIONS
from advisor.training import TrainingConfig
from advisor.units import GIB
from wrappers import measured

_HF_OPTIMIZERS = (("paged_adamw_8bit", "adamw-8bit-paged"), ("8bit", "adamw-8bit"), ("adafactor", "adafactor"),
                  ("sgd", "sgd"), ("adam", "adamw"))
_DEFAULT_SEQ_LEN = 2048


class Verdict:
    """What the check found: whether the trainer's own configuration fits, and the lines to print."""

    def __init__(self, fits: bool | None, lines: list[str], plan: Plan | None = None, planned: Any = None) -> None:
        self.fits, self.lines, self.plan = fits, lines, plan
        self.planned = planned  # the MemoryBreakdown of the configuration the trainer runs, when estimated

    def __str__(self) -> str:
        return "\n".join(self.lines)


def visible_gpus() -> tuple[str | None, int]:
    """``COUNTxNAME`` of the GPUs this process sees, and that count (None, 0 without CUDA)."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None, 0
    count = torch.cuda.device_count()
    return f"{count}x{torch.cuda.get_device_name(0)}", count


def check(model: Any, *, strategy: str, training: TrainingConfig, world_size: int, gpus: str | None = None) -> Verdict:
    """Plan ``model`` under ``training`` with ``strategy`` on ``world_size`` GPUs; advise when it does not fit."""
    local = None
    if gpus is None:
        local, per_node = visible_gpus()
        if local is None:
            return Verdict(None, ["advisor: pre-flight: no CUDA GPU visible and no gpus= given: memory not checked"])
        gpus = f"{min(world_size, per_node)}x{local.split('x', 1)[1]}"
        nodes = max(1, world_size // per_node)
    else:
        nodes = None
    exact = plan(model, gpus, nodes=nodes, strategy=strategy, training=training)
    row = exact.candidate(strategy)
    where = f"{strategy} on {gpus}{f' x {nodes} nodes' if nodes and nodes > 1 else ''}"
    what = (f"micro-batch {training.micro_batch_size}, seq {training.seq_len}, {training.precision}, "
            f"checkpointing {training.activation_checkpointing}")
    if row.fits and row.memory_bytes is not None:
        used = row.memory_bytes.total / GIB
        return Verdict(True, [f"advisor: pre-flight: {where}, {what}: {used:.1f} of {row.capacity_bytes / GIB:.1f} "
                              "GiB per GPU: fits"], exact, row.memory_bytes)
    lines = [f"advisor: pre-flight: {where}, {what}: does not fit"
             + (f" ({row.memory_bytes.total / GIB:.1f} of {row.capacity_bytes / GIB:.1f} GiB per GPU)"
                if row.memory_bytes is not None else f" ({row.unavailable_reason})" if row.unavailable_reason else "")]
    open_plan = plan(model, gpus, nodes=nodes,
                     training=validated_copy(training, {"activation_checkpointing": "auto", "micro_batch_size": None}))
    advice = open_plan.recommendation
    if advice is not None:
        mesh = f" on mesh {advice.mesh.label}" if advice.mesh is not None else ""
        lines.append(f"advisor: advice: {advice.strategy} ({advice.engine}){mesh}, micro-batch {advice.micro_batch_size}, "
                     f"checkpointing {'on' if advice.activation_checkpointing else 'off'}: {advice.reason}")
        from advisor.planning.remedies import remedy_basis, remedy_sections  # the ranked list `advisor plan` prints

        if advice.remedies:
            lines.append(f"advisor: remedies: {remedy_basis(advice.remedies)}")
        for header, remedies in remedy_sections(advice.remedies):
            lines.extend(f"advisor: {header.lower()}: {line}" for line in remedies)
    elif open_plan.smallest_fit is not None:
        lines.append(f"advisor: advice: {open_plan.smallest_fit.message}")
    else:
        lines.append("advisor: advice: nothing fits on these GPUs; see `advisor plan` for the numbers")
    return Verdict(False, lines, exact, row.memory_bytes)


def _planned_world(gpus: str | None, launched: int) -> int:
    """The world the check plans: the GPUs ``gpus=`` names (the cluster the run is for: a test on one CPU
    process checks the 8-GPU job), else this launch's world size."""
    if gpus is None:
        return launched
    from advisor.hardware.cluster import parse_gpus

    try:
        return parse_gpus(gpus).world_size
    except ValueError:
        return launched  # check() reports the bad gpus= itself


def _checked(run: Any) -> Verdict:
    """``run()``'s verdict; a configuration the planner refuses (a bad ``gpus=``, a batch it cannot split)
    is reported, never raised out of ``trainer.train()``: the check advises, the run is the user's."""
    try:
        return run()
    except ValueError as err:
        return Verdict(None, [f"advisor: pre-flight: not checked: {err}"])


def _finish(verdict: Verdict, *, strict: bool, rank_zero: bool) -> None:
    if rank_zero:
        print(verdict, flush=True)
    if strict and verdict.fits is False:
        raise RuntimeError(" ".join(verdict.lines))


def _watch(device: Any, verdict: Verdict, rank_zero: bool) -> measured.StepMemory | None:
    """Measure steps 2-3 on a CUDA device and print the line beside the verdict's figures (rank 0)."""
    source = measured.device_memory_source(device)
    if source is None:
        return None
    return measured.StepMemory(source, verdict.planned, lambda line: print(line, flush=True) if rank_zero else None)


# --- Hugging Face Trainer -------------------------------------------------------------------------


def _hf_precision(args: Any, model: Any) -> str:
    """``bf16=True`` is autocast over the model as loaded. transformers 5 loads a bf16 checkpoint in bf16
    (``from_pretrained(dtype="auto")``) and neither Trainer nor accelerate upcasts it for DDP or one GPU,
    so weights that train in bf16 are pure bf16 (bf16 gradients and AdamW state, no fp32 master):
    measured on an H100, 15.1 GiB where bf16-mixed over fp32 weights is 19.6
    (``benchmarks/results/gpu_stacks.md``). FSDP (accelerate upcasts to fp32 under mixed precision) and
    DeepSpeed (fp32 master in its optimizer) stay bf16-mixed; a PEFT model's fp32 adapters too."""
    if getattr(args, "bf16", False):
        trains_bf16 = [str(p.dtype) == "torch.bfloat16" for p in model.parameters() if p.requires_grad]
        plain = hf_strategy(args) == ("ddp", "torch")
        return "bf16" if plain and trains_bf16 and all(trains_bf16) else "bf16-mixed"
    if getattr(args, "fp16", False):
        return "fp16-mixed"
    first = next(iter(model.parameters()), None)
    return "bf16" if first is not None and str(first.dtype) == "torch.bfloat16" else "fp32"


def _optim_name(args: Any) -> str:
    return str(getattr(getattr(args, "optim", ""), "value", getattr(args, "optim", ""))).lower()


def _hf_optimizer(args: Any) -> str:
    """The Trainer's ``optim`` as ``--from`` reads it (``config_trainer.TRAINER_OPTIM``); another name by the family
    its name says (an 8-bit one as bitsandbytes' 8-bit AdamW), else AdamW."""
    name = _optim_name(args)
    if name in TRAINER_OPTIM:
        return TRAINER_OPTIM[name][0]
    return next((ours for key, ours in _HF_OPTIMIZERS if key in name), "adamw")


def _hf_optimizer_impl(args: Any) -> str | None:
    """How the Trainer's AdamW steps (transformers/trainer_optimizer.py, as ``--from`` reads it): ``adamw_torch_fused``
    is ``torch.optim.AdamW(fused=True)``, ``adamw_torch`` the torch default (foreach on CUDA); None: another
    optimizer, or the trainer recipe's default."""
    return TRAINER_OPTIM.get(_optim_name(args), (None, None))[1]


def _hf_checkpointing(args: Any) -> bool:
    """transformers 5 renames ``gradient_checkpointing`` to ``activation_checkpointing``; either counts, and
    so does FSDP's own (``fsdp_config["activation_checkpointing"]``, what our Trainer export writes)."""
    fsdp_own = bool(getattr(args, "fsdp", None)) and bool(_fsdp_config(args).get("activation_checkpointing"))
    return bool(getattr(args, "activation_checkpointing", False) or getattr(args, "gradient_checkpointing", False)
                or fsdp_own)


def _fsdp_config(args: Any) -> dict:
    """``args.fsdp_config`` as a dict with the ``fsdp_`` prefixes dropped (as ``TrainingArguments`` reads it)."""
    config = getattr(args, "fsdp_config", None) or {}
    if isinstance(config, str):
        with open(config, encoding="utf-8") as handle:
            config = json.load(handle)
    return {(key[5:] if key.startswith("fsdp_") else key): value for key, value in dict(config).items()}


def _deepspeed_strategy(config: Any) -> str:
    if isinstance(config, str):
        with open(config, encoding="utf-8") as handle:
            config = json.load(handle)
    zero = (config or {}).get("zero_optimization", {})
    stage = int(zero.get("stage", 0) or 0)
    offloaded = (zero.get("offload_optimizer") or {}).get("device") == "cpu"
    name = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}[stage]
    return f"{name}_offload" if offloaded and stage in (2, 3) else name


def hf_strategy(args: Any) -> tuple[str, str]:
    """(strategy, engine) a ``TrainingArguments`` runs: its FSDP settings, its DeepSpeed config, or DDP.

    transformers 5 turns every ``fsdp`` spelling into ``fsdp=True`` plus ``fsdp_config``
    (``TrainingArguments._process_fsdp_args``): ``reshard_after_forward`` True (the default) is full
    sharding, False is ``shard_grad_op`` (FSDP1 names the strategy instead), ``cpu_offload`` offloads.
    The legacy string or list (``"full_shard offload"``) is read too."""
    if getattr(args, "deepspeed", None):
        return _deepspeed_strategy(args.deepspeed), "deepspeed"
    fsdp = getattr(args, "fsdp", None)
    if not fsdp:
        return "ddp", "torch"
    config = _fsdp_config(args)
    if isinstance(fsdp, (str, list, tuple)):
        items = fsdp.split() if isinstance(fsdp, str) else list(fsdp)
        options = " ".join(str(getattr(o, "value", o)) for o in items)
        if not any(name in options for name in ("full_shard", "hybrid_shard", "shard_grad_op", "offload")):
            return "ddp", "torch"  # "auto_wrap" alone, "no_shard": no sharding asked for
        grads_only, offload = "shard_grad_op" in options, "offload" in options
    else:
        reshard = config.get("reshard_after_forward", True)
        grads_only = reshard is False or str(reshard).lower() in ("false", "shard_grad_op")
        offload = bool(config.get("cpu_offload") or config.get("offload_params"))
    return ("zero2" if grads_only else "zero3") + ("_offload" if offload else ""), "torch"


def hf_training(args: Any, model: Any, seq_len: int | None, *, world_size: int | None = None) -> TrainingConfig:
    """The ``TrainingConfig`` a ``TrainingArguments`` describes (the sequence length is not in it:
    ``seq_len=``, else TRL's ``max_length`` / ``max_seq_length``, else 2048; TRL's ``activation_offloading``
    too). ``world_size``: the GPUs
    the run is planned for (default: this launch's)."""
    seq = seq_len or getattr(args, "max_length", None) or getattr(args, "max_seq_length", None) or _DEFAULT_SEQ_LEN
    micro = int(args.per_device_train_batch_size)
    world = world_size or max(1, int(getattr(args, "world_size", 1)))
    optimizer = _hf_optimizer(args)
    checkpointing, engine = _hf_checkpointing(args), hf_strategy(args)[1]
    # TRL's SFTConfig.activation_offloading (advisor.estimate.activation_offload), planned under checkpointing on the
    # torch engine only: elsewhere planned without it, which holds more on the GPU than the run does
    offload = bool(getattr(args, "activation_offloading", False)) and checkpointing and engine == "torch"
    return TrainingConfig(
        recipe="trainer", precision=_hf_precision(args, model), optimizer=optimizer, seq_len=int(seq),
        micro_batch_size=micro, global_batch_size=micro * int(args.gradient_accumulation_steps) * world,
        activation_checkpointing="on" if checkpointing else "off",
        engine=engine, optimizer_impl=_hf_optimizer_impl(args) if optimizer == "adamw" else None,
        accumulation_sync="every_micro_batch" if _hf_sync_each_batch(args) else None,
        activation_offload=offload,
    )


def _hf_sync_each_batch(args: Any) -> bool:
    """``accelerator_config``'s ``gradient_accumulation_kwargs.sync_each_batch``: FSDP reduce-scatters every
    micro-batch instead of accumulating under accelerate's no_sync (the trainer recipe's default)."""
    config = getattr(args, "accelerator_config", None)
    kwargs = config.get("gradient_accumulation_kwargs") if isinstance(config, dict) else \
        getattr(config, "gradient_accumulation_kwargs", None)
    return bool(isinstance(kwargs, dict) and kwargs.get("sync_each_batch"))


class AdvisorCallback(TrainerCallback):
    """``transformers.Trainer`` callback: plan the run at train begin; ``strict=True`` stops an
    unfitting run before its first step."""

    def __init__(self, *, seq_len: int | None = None, gpus: str | None = None, strict: bool = False) -> None:
        self.seq_len, self.gpus, self.strict = seq_len, gpus, strict
        self.verdict: Verdict | None = None
        self.memory: measured.StepMemory | None = None  # steps 2-3 measured on CUDA (wrappers.measured)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> Any:
        world = _planned_world(self.gpus, max(1, int(getattr(args, "world_size", 1))))
        self.verdict = _checked(lambda: check(model, strategy=hf_strategy(args)[0], world_size=world, gpus=self.gpus,
                                              training=hf_training(args, model, self.seq_len, world_size=world)))
        rank_zero = bool(getattr(state, "is_world_process_zero", True))
        _finish(self.verdict, strict=self.strict, rank_zero=rank_zero)
        self.memory = _watch(getattr(args, "device", None), self.verdict, rank_zero)
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.memory is not None:
            self.memory.step_done()
        return control


# --- Lightning ------------------------------------------------------------------------------------

_LIGHTNING_PRECISION = {info.lightning: name for name, info in PRECISIONS.items()}


def lightning_strategy(strategy: Any) -> tuple[str, str]:
    """(strategy, engine) of a Lightning strategy object."""
    kind = type(strategy).__name__
    if kind == "DeepSpeedStrategy":
        return _deepspeed_strategy(getattr(strategy, "config", None) or {}), "deepspeed"
    if kind == "ModelParallelStrategy":
        return "zero3", "torch"
    if kind == "FSDPStrategy":
        sharding = str(getattr(strategy, "sharding_strategy", "FULL_SHARD"))
        offload = "_offload" if getattr(getattr(strategy, "cpu_offload", None), "offload_params", False) else ""
        return ("zero2" if "SHARD_GRAD_OP" in sharding else "zero3") + offload, "torch"
    return "ddp", "torch"


def _planned_module(pl_module: Any) -> Any:
    """The model a LightningModule trains: the first submodule with a Hugging Face ``config`` (so
    the plan sees its architecture), else the LightningModule itself."""
    if getattr(pl_module, "config", None) is not None:
        return pl_module
    return next((m for m in pl_module.modules() if getattr(m, "config", None) is not None), pl_module)


def _lightning_class() -> type:
    from lightning.pytorch import Callback

    class AdvisorLightningCallback(Callback):
        """Lightning callback: plan the run at fit start; ``strict=True`` stops an unfitting run
        before its first step. Lightning does not know the batch: pass ``micro_batch_size``."""

        def __init__(self, *, micro_batch_size: int, seq_len: int | None = None, gpus: str | None = None,
                     strict: bool = False, optimizer: str = "adamw", activation_checkpointing: bool = False) -> None:
            self.micro_batch_size, self.seq_len, self.gpus = micro_batch_size, seq_len, gpus
            self.strict, self.optimizer, self.checkpointing = strict, optimizer, activation_checkpointing
            self.verdict: Verdict | None = None
            self.memory: measured.StepMemory | None = None
            self._steps_seen = 0

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            strategy, engine = lightning_strategy(trainer.strategy)
            world = _planned_world(self.gpus, max(1, int(trainer.world_size)))

            def run() -> Verdict:
                training = TrainingConfig(
                    recipe="lightning", precision=_LIGHTNING_PRECISION.get(str(trainer.precision), "fp32"),
                    optimizer=self.optimizer,
                    seq_len=self.seq_len or _DEFAULT_SEQ_LEN, micro_batch_size=self.micro_batch_size, engine=engine,
                    activation_checkpointing="on" if self.checkpointing else "off",
                    global_batch_size=self.micro_batch_size * int(trainer.accumulate_grad_batches) * world)
                return check(_planned_module(pl_module), strategy=strategy, training=training, world_size=world,
                             gpus=self.gpus)

            self.verdict = _checked(run)
            _finish(self.verdict, strict=self.strict, rank_zero=bool(trainer.is_global_zero))
            self.memory = _watch(getattr(trainer.strategy, "root_device", None), self.verdict,
                                 bool(trainer.is_global_zero))
            self._steps_seen = int(trainer.global_step)

        def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            # An optimizer step ends where the global step moves (a batch is not a step under accumulation).
            while self.memory is not None and self._steps_seen < int(trainer.global_step):
                self._steps_seen += 1
                self.memory.step_done()

    return AdvisorLightningCallback


def __getattr__(name: str) -> Any:
    """``AdvisorLightningCallback`` is built on first import, so this module needs Lightning only then."""
    if name == "AdvisorLightningCallback":
        cls = _lightning_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""What an export writes: the plan's recommendation turned into one concrete, checked target.

An export renders the plan's recommendation: its strategy, engine, micro-batch, checkpointing
and mesh (``ParallelDims``, HSDP's dp_replicate included) are written as the plan chose them; no
estimate is made here and nothing is decided again (``--hybrid N`` pins HSDP in the plan itself).
A format can express only some (strategy, engine) pairs: accelerate has no ZeroRedundancyOptimizer
or single-process DataParallel, a DeepSpeed JSON is DeepSpeed only (read from the strategy table's
``Implementation`` fields and the format table's ``runs`` column, ``advisor.export.formats``).
``resolve_target`` keeps the recommendation when the format can express it; otherwise it takes the
nearest candidate the plan itself evaluated that fits and that the format can express, saying so in
``notes``.

The CPU test config (``--cpu``, ``cpu_target``) is not derived from a GPU plan: DDP on gloo, fp32,
``--processes`` processes, the micro-batch the user gave (else 1).

Pure functions of a ``Plan``: no file access, no torch or yaml import. Renderers live in the
per-format modules; file writing in ``write.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from advisor.planning.api import Plan
from advisor.planning.smallest import NothingFits, unfit_subject
from advisor.export.quantization import quantization_notes
from advisor.export.formats import FormatName, Runs, get_format_row
from advisor.export.mesh_target import mesh_engine, mesh_notes, mesh_unavailable
from advisor.mesh import ParallelDims
from advisor.model.spec import ModelSpec
from advisor.precision import PRECISIONS, Precision, PrecisionInfo
from advisor.strategies import ESCALATION, STRATEGIES, Implementation, StrategyName
from advisor.export.optimizer import stack_notes
from advisor.recipes import AccumulationSync, OptimizerImpl
from advisor.model.block_profile import CheckpointFlags
from advisor.recipes import ZeroSettings
from advisor.training import CheckpointMode, Engine, LossKernel, Optimizer, TrainingConfig

Hybrid = Literal["auto", "on", "off"]

def _torch_without_launcher(impl: Implementation) -> bool:
    """torch runs it in a way no launcher config asks for: one-process DataParallel, or DDP +
    ZeroRedundancyOptimizer (optimizer state sharded, parameters not)."""
    return impl.engine == "torch" and (impl.single_process or (impl.shard_optimizer and not impl.shard_params))


def _launcher_expresses(impl: Implementation) -> bool:
    """accelerate, the Trainer and Lightning run DDP, FSDP2 and every DeepSpeed stage."""
    return impl.available and not _torch_without_launcher(impl)


# What each kind of format (the format table's ``runs`` column) can express, read from the strategy
# table's Implementation fields (never a second table of pairs). torchrun launches any script, so
# anything available; a DeepSpeed JSON is DeepSpeed only.
_EXPRESSES: dict[Runs, Callable[[Implementation], bool]] = {
    "launcher": _launcher_expresses,
    "deepspeed": lambda impl: impl.available and impl.engine == "deepspeed",
    "any": lambda impl: impl.available,
    "fsdp2": lambda impl: impl.available and impl.engine == "torch" and not _torch_without_launcher(impl),
}


def expresses(fmt: str, strategy: str, engine: str) -> bool:
    """Whether format ``fmt`` can write ``strategy`` on ``engine``."""
    return _EXPRESSES[get_format_row(fmt).runs](STRATEGIES[strategy].on(engine))  # type: ignore[arg-type]


def why_not_expressed(strategy: str, engine: Engine, fmt: str) -> str:
    """Why ``fmt`` has no config for this pair, for the note that explains the substitute."""
    impl = STRATEGIES[strategy].on(engine)
    if impl.engine == "torch" and impl.single_process:
        return (f"{strategy} ({impl.runs_as}, one process) has no {fmt} config: launchers start one process "
                "per GPU; DDP keeps no more per GPU than DataParallel and is faster")
    if _torch_without_launcher(impl):
        exact = STRATEGIES[strategy].on("deepspeed")
        return (f"{strategy} on the torch engine ({impl.runs_as}) has no {fmt} config: it has no "
                f"ZeroRedundancyOptimizer option; for ZeRO-1 exactly, re-run with --engine deepspeed "
                f"({exact.runs_as})")
    if get_format_row(fmt).runs == "fsdp2":
        return f"{fmt} runs torch DDP and FSDP2 only; the plan used engine {engine} ({impl.runs_as})"
    return f"{fmt} runs only DeepSpeed; the plan used engine {engine}"


PLACEHOLDER_IP = "<MAIN_NODE_IP>"
PLACEHOLDER_RANK = "<MACHINE_RANK>"
DEFAULT_PORT = 29500
GRADIENT_CLIPPING = 1.0


class ExportOptions(BaseModel):
    """Choices that are about the exported file, not about the plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu: bool = Field(default=False, description="A CPU-only test config: DDP on gloo, fp32, one machine.")
    processes: int = Field(default=2, ge=1, le=1024, description="Processes of the CPU test config.")
    hybrid: Hybrid = Field(default="auto", description="A check, not a choice: on / off refuse a plan that is not / "
                           "is hybrid-sharded (the plan decides HSDP; --hybrid N pins it there); auto writes the plan.")
    script: str = Field(default="train.py", description="Training script named in launcher commands.")
    script_args: tuple[str, ...] = Field(default=(), description="Arguments for the training script.")


class ExportTarget(CheckpointFlags, BaseModel):
    """One concrete strategy to write, with every number a format needs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: StrategyName
    engine: Engine
    impl: Implementation = Field(description="The strategy-table row: what is sharded and offloaded.")
    micro_batch_size: int = Field(ge=1, description="Samples per GPU per forward pass.")
    gradient_accumulation_steps: int = Field(ge=1, description="Micro-batches per optimizer step.")
    checkpointing: CheckpointMode = Field(description="Activation checkpointing of the exported candidate: on (full), "
                                          "off or selective (per-op).")
    precision: Precision = Field(description="What runs: the plan's precision; fp32 for a CPU test config.")
    num_nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1, description="Processes per node (one per GPU; --processes for --cpu).")
    cpu: bool = Field(description="CPU-only test config.")
    model_name: str
    block_classes: tuple[str, ...] = Field(default=(), description="Block classes FSDP wraps, one unit each "
                                           "(ModelSpec.block_classes); empty: wrap by size.")
    gpu: str = Field(description="The GPU the plan is for; 'CPU' for a CPU test config.")
    notes: tuple[str, ...] = Field(default=(), description="Substitutions and caveats, one line each.")
    loss: LossKernel = Field(default="hf", description="The plan's loss kernel (--loss).")
    seq_len: int = Field(default=2048, ge=1, description="Tokens per sample (the plan's --seq-len).")
    global_batch_size: int | None = Field(default=None, description="The plan's --global-batch, if given.")
    optimizer: Optimizer = Field(default="adamw", description="The plan's optimizer (--optimizer).")
    optimizer_impl: OptimizerImpl = Field(default="foreach", description="How it steps (the plan's recipe or "
                                          "--optimizer-impl): the trainer-args optim name follows it.")
    accumulation_sync: AccumulationSync = Field(default="every_micro_batch", description="How the plan accumulated "
                                                "gradients under FSDP (TrainingConfig.accumulation_mode): the "
                                                "trainer-args sync_each_batch follows it.")
    mesh: ParallelDims | None = Field(default=None, description="The plan's device mesh (tp/cp/HSDP); None: "
                                      "data parallelism alone.")
    zero: ZeroSettings | None = Field(default=None, description="DeepSpeed sizes the user's own config fixed "
                                      "(the plan's TrainingConfig.zero); None: the planner's.")
    compile: bool = Field(default=False, description="The plan's --compile: torch.compile (inductor) on each block.")
    float8: bool = Field(default=False, description="The plan's --float8: torchao Float8Linear (tensorwise) on the "
                         "blocks' linears.")
    float8_all_gather: bool = Field(default=False, description="The plan's --float8-all-gather (FSDP gathers fp8).")

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def data_parallel_size(self) -> int:
        """Ranks that take distinct micro-batches: the mesh's dp_replicate x dp_shard, else every rank."""
        return self.world_size if self.mesh is None else self.mesh.dp

    @property
    def hybrid(self) -> bool:
        """HSDP: the plan's mesh shards within dp_shard and replicates over dp_replicate."""
        return self.mesh is not None and self.mesh.hybrid

    @property
    def multi_node(self) -> bool:
        return self.num_nodes > 1

    @property
    def fsdp(self) -> bool:
        """Runs as PyTorch FSDP2 (the torch engine's sharded strategies)."""
        return self.engine == "torch" and self.impl.shard_params

    @property
    def zero_stage(self) -> int:
        """DeepSpeed ZeRO stage: 0 replicate, 1 optimizer, 2 + gradients, 3 + parameters."""
        if self.impl.shard_params:
            return 3
        if self.impl.shard_grads:
            return 2
        return 1 if self.impl.shard_optimizer else 0

    @property
    def precision_info(self) -> PrecisionInfo:
        """The precision table's row: how accelerate, DeepSpeed, Lightning and the Trainer spell it."""
        return PRECISIONS[self.precision]

    @property
    def summary(self) -> str:
        nodes = f"{self.num_nodes} nodes x " if self.multi_node else ""
        where = (f"{self.world_size} CPU processes (gloo test config)" if self.cpu
                 else f"{nodes}{self.gpus_per_node} x {self.gpu}")
        return (f"{self.strategy} on {self.engine} ({self.impl.runs_as}) for {self.model_name} on "
                f"{where}: micro-batch {self.micro_batch_size} of {self.seq_len:,} tokens, "
                f"gradient accumulation {self.gradient_accumulation_steps}, activation checkpointing "
                f"{self.checkpointing}, precision {self.precision}"
                f"{', hybrid sharding (HSDP)' if self.hybrid else ''}"
                f"{f', mesh {self.mesh.label}' if self.mesh is not None else ''}")


def require_recommendation(plan: Plan) -> None:
    """A one-line ValueError when nothing fits, naming the smallest fit."""
    if plan.recommendation is not None:
        return
    fit = plan.smallest_fit
    hint = fit.message if fit is not None else "no strategy fits these GPUs"
    what, at = unfit_subject(plan)
    what += " on" if what.endswith("does not fit") else ""
    raise NothingFits(f"{what} {plan.hardware.world_size} x {plan.hardware.gpu.name} for {plan.model.name}{at}, "
                      f"so there is nothing to export: {hint}")


def checkpointing_notes(mode: str, fmt: FormatName, *, fsdp: bool) -> list[str]:
    """What the script must do for the plan's checkpointing (``mode``) where the ``fmt`` file cannot turn it on
    (``ExportFormatRow.checkpointing_key``; ``fsdp``: the file writes torch FSDP), one instruction only: the
    selective mode where the file checkpoints in full says to turn that off; elsewhere the call that runs the
    plan's mode."""
    row = get_format_row(fmt)
    in_file = row.checkpointing_key == "always" or (row.checkpointing_key == "fsdp" and fsdp)
    if mode == "off" or (mode == "on" and in_file) or (mode == "selective" and row.selective_key):
        return []
    if mode == "on":
        return ["Activation checkpointing is part of the plan and this file has no key for it: call "
                "model.gradient_checkpointing_enable() in the script (the Trainer: TrainingArguments("
                "activation_checkpointing=True); wrap() applies the plan's own); the plan's memory assumes it."]
    call = ('wrappers.checkpointing.apply_requested_checkpointing(model, "selective"); in your own loop '
            f'wrap(model, activation_checkpointing="selective") does {"both" if in_file else "it"}')
    if in_file:
        return ["Selective activation checkpointing has no config key here: the file checkpoints each block in "
                "full (it fits; it recomputes more than the plan). To run the plan, turn that off and checkpoint "
                "selectively in the script before the model is prepared (Trainer(...), accelerator.prepare, the "
                f"Lightning strategy): {call}."]
    return ["Selective activation checkpointing is part of the plan and this file has no key for it: checkpoint "
            "selectively in the script before the model is prepared (Trainer(...), accelerator.prepare, "
            f"deepspeed.initialize): {call}."]


def _training_notes(training: TrainingConfig) -> list[str]:
    """What the configs cannot carry of the plan's training settings, and how the script supplies it."""
    notes = []
    if training.chunked_nll:  # TRL's
        notes.append("--loss chunked: the plan counts TRL's chunked_nll, SFTConfig(loss_type=\"chunked_nll\") (the "
                     "default of TRL 1.4.0 and later; not a TrainingArguments key); with the Trainer alone, "
                     "wrappers.losses.use_loss_kernel(model, \"chunked\", checkpointed=True) runs the same algorithm.")
    elif training.loss == "chunked" and training.recipe.chunked_logits is not None:  # the stack's own chunked loss
        compiled = " compiled chunk by chunk" if training.compile and training.recipe.compile_loss else ""
        notes.append(f"--loss chunked: the plan counts the {training.recipe.name} recipe's own chunked cross-entropy"
                     f"{compiled}; elsewhere wrappers.losses.use_loss_kernel(model, \"chunked\") runs the eager "
                     "kernel, which holds more: plan with that stack's --recipe to count it.")
    elif training.loss != "hf":
        if training.loss == "fused" and training.recipe.fused_loss_in_place:
            notes.append("--loss fused: the Trainer's use_liger_kernel (pip install liger-kernel); the plan's memory "
                         "counts Liger's kernel, its head gradient accumulated and scaled in place.")
        else:
            trainer = " (Trainer: use_liger_kernel, pip install liger-kernel, the same algorithm)" \
                if training.loss == "fused" else ""
            notes.append(f"--loss {training.loss}: call wrappers.losses.use_loss_kernel(model, \"{training.loss}\") in "
                         f"the script{trainer}; the plan's memory assumes it.")
    if training.activation_offload:
        notes.append("--activation-offload has no key in these configs: with TRL, SFTConfig(activation_offloading=True) "
                     "(a TrainingArguments key there only); in your own loop, wrap(model, activation_offload=True) or "
                     "wrappers.activation_offload.apply_activation_offload(model); the plan's memory assumes it.")
    if training.lora is not None:
        lora = training.lora
        targets = lora.targets if lora.targets == "all-linear" else list(lora.targets) if lora.targets else None
        notes.append(f"LoRA: no config key carries adapters; make them in the script with peft.get_peft_model(model, "
                     f"LoraConfig(r={lora.rank}, target_modules={targets!r}, lora_dropout={lora.dropout:g}"
                     f"{', use_dora=True' if lora.dora else ''}"
                     f"{f', modules_to_save={list(lora.modules_to_save)!r}' if lora.modules_to_save else ''})) before "
                     "wrap() or the Trainer.")
        if training.base_dtype_counts:
            dtype = (training.precision_info.compute_dtype if training.low_precision_base
                     else training.precision_info.param_dtype)
            trl = ", as TRL does when dtype is not set" if dtype == "float32" else \
                f" (TRL: dtype: {dtype}; its default is float32)"
            notes.append(f"The plan holds the frozen base in {dtype}: load it with from_pretrained(..., "
                         f"dtype=torch.{dtype}){trl}.")
    return notes


def _fallbacks(strategy: str, engine: str, fmt: str) -> list[tuple[StrategyName, Engine]]:
    """Nearest expressible pairs, closest first: same strategy on the other engine, then escalation."""
    start = ESCALATION.index(strategy) if strategy in ESCALATION else 0
    order: list[tuple[str, str]] = []
    engines = [engine, "deepspeed" if engine == "torch" else "torch"]
    if get_format_row(fmt).runs == "deepspeed":
        engines = ["deepspeed"]
    elif _torch_without_launcher(STRATEGIES[strategy].on(engine)):  # type: ignore[arg-type]
        engines = [engine]  # dp, torch zero1: stay on torch (DDP, then FSDP); the note offers deepspeed
    for eng in engines:
        order += [(s, eng) for s in ESCALATION[:start + 1][::-1] if expresses(fmt, s, eng)][:1]
        order += [(s, eng) for s in ESCALATION[start + 1:] if expresses(fmt, s, eng)]
    seen: list[tuple[StrategyName, Engine]] = []
    for pair in order:
        if pair not in seen:
            seen.append(pair)  # type: ignore[arg-type]
    return seen


def _planned(plan: Plan, strategy: str, engine: str):
    """The plan's own data-parallel candidate for this pair, or None when the plan did not evaluate it."""
    return next((c for c in plan.candidates if c.strategy == strategy and c.engine == engine and c.mesh is None), None)


def _substitute(plan: Plan, fmt: str) -> tuple[StrategyName, Engine, int, CheckpointMode, int | None, list[str]]:
    """The recommendation, or, when ``fmt`` cannot express it, the nearest candidate the plan evaluated
    that fits (no estimate is made here: the plan's own numbers are written)."""
    rec = plan.recommendation
    assert rec is not None
    if expresses(fmt, rec.strategy, rec.engine):
        return rec.strategy, rec.engine, rec.micro_batch_size, rec.checkpointing, rec.gradient_accumulation_steps, []
    why = why_not_expressed(rec.strategy, rec.engine, fmt)
    fallbacks = [pair for pair in _fallbacks(rec.strategy, rec.engine, fmt) if pair[1] == rec.engine]
    if not fallbacks:  # another engine: the plan has no candidate of it, and the export estimates nothing
        recipe = get_format_row(fmt).recipe
        raise ValueError(f"{why}: plan it with --recipe {recipe} (advisor export does for --format {fmt} unless "
                         f"--recipe or --engine is given)")
    for strategy, engine in fallbacks:
        cand = _planned(plan, strategy, engine)
        if cand is not None and cand.available and cand.fits:
            note = (f"{why}. Exported the nearest that fits instead: {strategy} on {engine} ({cand.runs_as}), "
                    f"micro-batch {cand.micro_batch_size}.")
            return strategy, engine, cand.micro_batch_size, cand.checkpointing, cand.gradient_accumulation_steps, [note]
    asked = _asked_strategy(plan)
    if asked is not None and fallbacks:  # --strategy pinned: the plan evaluated nothing else to write
        strategy, engine = fallbacks[0]
        other = f" --engine {engine}" if engine != plan.training.engine else ""
        raise ValueError(f"{why}; the plan evaluated only --strategy {asked}: plan it with --strategy {strategy}{other}")
    raise ValueError(f"{why}, and no strategy {fmt} can express fits; try another --format")


def cpu_target(model: ModelSpec, training: TrainingConfig, fmt: FormatName, options: ExportOptions, *,
               strategy: str | None = None) -> ExportTarget:
    """The CPU test config: DDP on gloo, fp32, ``options.processes`` processes on this machine.

    It checks a script's distributed wiring before it meets GPUs, so no GPU plan is involved: the
    micro-batch is ``training``'s (1 when unset), the precision fp32 (what gloo DDP runs here; the
    plan's bf16 autocast is not emulated). FSDP and DeepSpeed are refused: accelerate 1.15 enables
    them only on accelerators. ``strategy`` is the one the user asked for, if any.
    """
    if not get_format_row(fmt).cpu_test:
        raise ValueError(f"--cpu: the {fmt} format has no CPU test config (torchtitan trains on GPUs); use --format "
                         "accelerate or torchrun to test the script on CPU")
    if get_format_row(fmt).runs == "deepspeed" or training.engine != "torch" or strategy not in (None, "ddp"):
        asked = f"--strategy {strategy}" if strategy not in (None, "ddp") else (
            "--engine deepspeed" if training.engine != "torch" else "--format deepspeed-json")
        raise ValueError(f"--cpu makes a gloo test config for ddp only (accelerate 1.15 enables FSDP and DeepSpeed "
                         f"only on accelerators), not {asked}; drop it to test the script on CPU")
    if options.hybrid == "on":
        raise ValueError("--hybrid on needs several nodes and a torch FSDP strategy; --cpu is one machine, DDP")
    processes = options.processes
    micro = training.micro_batch_size or 1
    accum = 1
    if training.global_batch_size is not None:
        if training.global_batch_size % (micro * processes):
            raise ValueError(f"--global-batch {training.global_batch_size} is not a multiple of micro-batch {micro} "
                             f"x {processes} CPU processes")
        accum = training.global_batch_size // (micro * processes)
    notes = ["CPU test config: launched by torch.distributed.run on gloo; scripts using Accelerator need "
             "ACCELERATE_USE_CPU=true (advisor launch sets it) or Accelerator(cpu=True)."]
    if get_format_row(fmt).cpu_note:  # Lightning starts its own processes; DDPStrategy picks gloo on CPU
        notes = [get_format_row(fmt).cpu_note.format(processes=processes)]
    if training.micro_batch_size is None:
        notes.append("Micro-batch 1 per process (--micro-batch to change): the CPU test checks the script's "
                     "distributed wiring, not the GPU plan's batch.")
    if "precision" in training.model_fields_set and training.precision != "fp32":
        notes.append(f"--precision {training.precision} is not used: the CPU test config runs fp32.")
    mode = "off" if training.activation_checkpointing == "auto" else training.activation_checkpointing  # no plan
    return ExportTarget(
        strategy="ddp", engine="torch", impl=STRATEGIES["ddp"].on("torch"), micro_batch_size=micro,
        gradient_accumulation_steps=accum, checkpointing=mode, precision="fp32", num_nodes=1, gpus_per_node=processes,
        cpu=True, model_name=model.name, block_classes=model.block_classes, gpu="CPU",
        notes=tuple(notes + checkpointing_notes(mode, fmt, fsdp=False) + _training_notes(training)), loss=training.loss,
        **_optimizer(training),
    )


def _optimizer(training: TrainingConfig) -> dict:
    """The ExportTarget fields of the plan's optimizer."""
    return {"optimizer": training.optimizer, "optimizer_impl": training.optimizer_implementation,
            "accumulation_sync": training.accumulation_mode,
            "seq_len": training.seq_len, "global_batch_size": training.global_batch_size, "zero": training.zero,
            "compile": training.compile, "float8": training.float8, "float8_all_gather": training.float8_all_gather}


def _asked_strategy(plan: Plan) -> str | None:
    """The strategy the user asked for (``--strategy``: the plan evaluated only it), else None."""
    return plan.candidates[0].strategy if len(plan.candidates) == 1 else None


def resolve_target(plan: Plan, fmt: FormatName, options: ExportOptions | None = None) -> ExportTarget:
    """The target ``fmt`` writes for ``plan``; ValueError when nothing fits or cannot be written.

    With ``options.cpu`` it is the CPU test config (``cpu_target``): the plan's GPUs play no part.
    """
    options = options or ExportOptions()
    if options.cpu:
        return cpu_target(plan.model, plan.training, fmt, options, strategy=_asked_strategy(plan))
    require_recommendation(plan)
    _check_hybrid(plan, options)
    if plan.recommendation.mesh is not None:
        return _mesh_target(plan, fmt)
    strategy, engine, micro, ckpt, accum, notes = _substitute(plan, fmt)
    impl = STRATEGIES[strategy].on(engine)
    hw = plan.hardware
    torch_fsdp = engine == "torch" and impl.shard_params
    notes += quantization_notes(plan.training, engine=engine, impl=impl)
    if not plan.model.block_classes and torch_fsdp:
        notes.append("The model's block class is unknown: FSDP wraps by size (SIZE_BASED_WRAP) instead of per block.")
    return ExportTarget(
        strategy=strategy, engine=engine, impl=impl, micro_batch_size=micro, gradient_accumulation_steps=accum or 1,
        checkpointing=ckpt, precision=plan.training.precision, num_nodes=hw.nodes,
        gpus_per_node=hw.gpus_per_node, cpu=options.cpu, model_name=plan.model.name,
        block_classes=plan.model.block_classes, gpu=hw.gpu.name, notes=tuple(
            notes + checkpointing_notes(ckpt, fmt, fsdp=torch_fsdp) + _training_notes(plan.training)
            + stack_notes(plan.training, fmt, engine=engine, offloads_optimizer=impl.offload_optimizer,
                          zero3=engine == "deepspeed" and impl.shard_params)),
        loss=plan.training.loss, **_optimizer(plan.training),
    )


def _replicas_example(hw) -> str:
    """An --hybrid N that runs here: one replica a node, else the fewest replicas that split a node's GPUs evenly."""
    pin = "pin replicas in the plan with --hybrid N (e.g. --hybrid "
    if hw.nodes > 1:
        return f"{pin}{hw.nodes}: one per node)"
    split = next((n for n in range(2, hw.gpus_per_node) if hw.gpus_per_node % n == 0), None)
    if split is None:
        return (f"{hw.gpus_per_node} GPU{'s' if hw.gpus_per_node > 1 else ''} on one node split into no replicas that "
                "each shard over several GPUs: leave --hybrid out")
    return f"{pin}{split}: {split} replicas, each sharding over {hw.gpus_per_node // split} GPUs)"


def _check_hybrid(plan: Plan, options: ExportOptions) -> None:
    """``--hybrid on|off`` checks the plan's HSDP instead of deciding it: the export writes the plan."""
    rec = plan.recommendation
    hybrid = rec.mesh is not None and rec.mesh.hybrid
    label = rec.mesh.label if rec.mesh is not None else f"dp {plan.hardware.world_size}"
    if options.hybrid == "on" and not hybrid:
        raise ValueError(f"--hybrid on: the plan ({rec.strategy}, mesh {label}) is not hybrid-sharded and the export "
                         f"writes the plan; {_replicas_example(plan.hardware)}")
    if options.hybrid == "off" and hybrid:
        raise ValueError(f"--hybrid off: the plan chose mesh {label} and the export writes the plan; "
                         "pin --hybrid 1 to plan without replicas")


def _mesh_target(plan: Plan, fmt: FormatName) -> ExportTarget:
    """A mesh recommendation as ``fmt`` writes it (``advisor.export.mesh_target``); ValueError when it cannot."""
    rec = plan.recommendation
    mesh = rec.mesh
    why_not = mesh_unavailable(fmt, mesh, num_attention_heads=plan.model.num_attention_heads)
    if why_not:
        raise ValueError(why_not)
    strategy, engine = mesh_engine(fmt, rec.strategy)
    impl = STRATEGIES[strategy].on(engine)
    hw = plan.hardware
    notes = mesh_notes(fmt, mesh, seq_len=plan.training.seq_len)
    return ExportTarget(
        strategy=strategy, engine=engine, impl=impl, micro_batch_size=rec.micro_batch_size,
        gradient_accumulation_steps=rec.gradient_accumulation_steps or 1, checkpointing=rec.checkpointing,
        precision=plan.training.precision, num_nodes=hw.nodes, gpus_per_node=hw.gpus_per_node, cpu=False,
        model_name=plan.model.name, block_classes=plan.model.block_classes, gpu=hw.gpu.name,
        notes=tuple(notes + checkpointing_notes(rec.checkpointing, fmt, fsdp=engine == "torch" and impl.shard_params)
                    + _training_notes(plan.training) + stack_notes(plan.training, fmt, engine=engine)),
        loss=plan.training.loss, mesh=mesh,
        **_optimizer(plan.training),
    )

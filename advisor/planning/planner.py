"""Search strategies x micro-batch x checkpointing, choose one, and explain the choice.

The choice starts from size thresholds (under 1B parameters: ddp; 1-10B: zero3; over 10B: zero3
with CPU offload considered), checks the default against memory, and when it does not fit takes the
fastest GPU-only strategy that fits, on either side of the default (checkpointing and smaller
micro-batches first, within each strategy); offload only when nothing on the GPUs alone fits, along
``strategies.ESCALATION`` from the default. Then it applies the margin policy
(``prefer_practical``: among plans within ``SAME_SPEED`` of that choice's tokens/s, one that leaves
``TrainingConfig.headroom`` of memory free wins, then the one that communicates least; the reason
gives both plans' memory shares and step times), and lists cheaper strategies that also fit
(``advisor.planning.smallest`` finds the fewest GPUs that would fit when nothing does). Pure functions of
validated inputs; ``advisor.planning.api.plan`` wires them to names and strings.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from advisor.planning.fastest import explain_tradeoff, rank_by_time
from advisor.hardware.cluster import Hardware
from advisor.calibration import error_table
from advisor.estimate.error_bars import MemoryRange, memory_range, relative_bounds
from advisor.estimate.memory import MemoryBreakdown, estimate_memory
from advisor.estimate.quantized import quantization_unavailable
from advisor.model.spec import ModelSpec
from advisor.estimate.step_time import StepTime, estimate_step_time
from advisor.mesh import ParallelDims
from advisor.strategies import ESCALATION, STRATEGIES, Implementation, StrategyName
from advisor.training import TrainingConfig
from advisor.units import GIB

AUTO_MICRO_BATCH_CAP = 64
# Throughputs within 3% count as the same speed: well inside the step-time model's error against
# published runs (benchmarks/results/throughput_validation.md: within 25%), so a smaller gap is no
# reason to give up memory headroom or take on more communication.
SAME_SPEED = 0.03
SMALL_MODEL = 10**9
LARGE_MODEL = 10 * 10**9


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Candidate(_Frozen):
    strategy: StrategyName
    engine: str
    available: bool = Field(description="The engine can run this strategy here.")
    unavailable_reason: str | None = None
    runs_as: str = Field(default="", description="The API that implements it.")
    fits: bool = False
    micro_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    activation_checkpointing: bool | None = None
    selective_checkpointing: bool = Field(default=False, description="The checkpointing is selective (per-op).")
    memory_bytes: MemoryBreakdown | None = None
    memory_range: MemoryRange | None = Field(default=None, description="Per-GPU total (bytes): low / expected / high "
                                              "from the measured errors of estimates of this kind "
                                              "(applied to the reserved part; the CUDA context is added as assumed).")
    capacity_bytes: int = Field(description="Memory of one GPU.")
    cpu_memory_bytes: int | None = Field(default=None, description="CPU RAM per node for offloaded states.")
    cpu_capacity_bytes: int | None = Field(default=None, description="CPU RAM per node, when given.")
    step_time_s: float | None = Field(default=None, description="Seconds per optimizer step (fitting candidates).")
    step_time: StepTime | None = Field(default=None, description="Compute/communication split, tokens/s, MFU.")
    mesh: ParallelDims | None = Field(default=None, description="The device mesh (tp/cp/HSDP degrees); None: "
                                      "data parallelism alone over every GPU.")
    stage_peaks: tuple[int, ...] | None = Field(default=None, description="Pipeline/expert meshes: each pipeline "
                                                "rank's peak (bytes, total), rank 0 first; the worst is memory_bytes.")

    @model_serializer(mode="wrap")
    def _serialize(self, handler):  # plans without pp/ep keep their JSON byte-identical
        data = handler(self)
        if self.stage_peaks is None and isinstance(data, dict):
            data.pop("stage_peaks", None)
        return data


class Remedy(_Frozen):
    """One changed knob and the plan it leads to."""

    name: str = Field(description="The change as the CLI spells it, e.g. '--loss fused' or '--gpus 4xA100-80GB-SXM'.")
    keeps_math: bool = Field(description="True: the same training mathematics (same model, optimizer, dtypes and "
                             "global batch); False: it changes what or how the model trains.")
    saved_gib: float = Field(description="Per-GPU memory it saves on the reference candidate at the same micro-batch "
                             "and checkpointing (negative: it costs memory).")
    strategy: StrategyName | None = Field(default=None, description="The strategy the re-plan chooses.")
    step_s: float | None = Field(default=None, description="Seconds per optimizer step of that plan.")
    tokens_per_s: float | None = Field(default=None, description="Global tokens per second of that plan.")
    fits: bool = Field(description="That plan fits on the GPUs alone (no CPU offload).")


class Recommendation(_Frozen):
    strategy: StrategyName
    engine: str
    micro_batch_size: int
    activation_checkpointing: bool
    selective_checkpointing: bool = Field(default=False, description="The checkpointing is selective (per-op).")
    gradient_accumulation_steps: int | None = None
    reason: str
    alternatives: tuple[str, ...] = ()
    mesh: ParallelDims | None = Field(default=None, description="The device mesh; None: data parallelism alone.")
    remedies: tuple[Remedy, ...] = Field(default=(), description="What would change a plan that offloads, leaves the "
                                         "size default unfit or runs below a useful MFU, ranked "
                                         "(advisor.planning.remedies).")


def default_strategy(spec: ModelSpec) -> tuple[StrategyName, str]:
    """The size-threshold default and its one-line rationale."""
    billions = spec.total_params / 1e9
    if spec.total_params < SMALL_MODEL:
        return "ddp", f"{billions:.2g}B parameters (< 1B): replicas fit, DDP communicates least"
    if spec.total_params <= LARGE_MODEL:
        return "zero3", f"{billions:.3g}B parameters (1-10B): full sharding (FSDP FULL_SHARD / ZeRO-3)"
    return "zero3", f"{billions:.3g}B parameters (> 10B): full sharding, CPU offload considered"


def batch_split_problem(training: TrainingConfig, dp_world: int) -> str | None:
    """Why ``dp_world`` data-parallel ranks cannot keep the requested global batch (micro-batch x ranks x
    accumulation = global batch, in whole micro-batches), or None when they can or none was asked."""
    total = training.global_batch_size
    if total is None:
        return None
    if total % dp_world:
        return f"--global-batch {total} is not divisible by {dp_world} data-parallel ranks"
    micro = training.micro_batch_size
    if micro is not None and total % (micro * dp_world):
        return (f"--global-batch {total} is not a multiple of micro-batch {micro} x {dp_world} data-parallel ranks "
                f"({micro * dp_world} samples a micro-step)")
    return None


def _accumulation(training: TrainingConfig, world: int, micro: int) -> int | None:
    if training.global_batch_size is None:
        return None
    return training.global_batch_size // (micro * world)


def _micro_batch_choices(training: TrainingConfig, world: int) -> list[int]:
    """Micro-batch sizes to try, largest first."""
    if training.micro_batch_size is not None:
        return [training.micro_batch_size]
    if training.global_batch_size is None:
        return list(range(AUTO_MICRO_BATCH_CAP, 0, -1))
    per_rank = training.global_batch_size // world
    return [m for m in range(min(per_rank, AUTO_MICRO_BATCH_CAP), 0, -1) if per_rank % m == 0]


def largest_fitting(fits_at, choices: list[int]) -> int | None:
    """Largest choice that fits, by bisection (memory grows with the micro-batch)."""
    ascending = sorted(choices)
    lo, hi, best = 0, len(ascending) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits_at(ascending[mid]):
            best, lo = ascending[mid], mid + 1
        else:
            hi = mid - 1
    return best


def evaluate_candidate(
    spec: ModelSpec, hardware: Hardware, training: TrainingConfig, name: StrategyName,
    mesh: ParallelDims | None = None,
) -> Candidate:
    """Best micro-batch and checkpointing for one strategy (no checkpointing preferred when it fits),
    on ``mesh`` when given (``advisor.estimate.model_parallel`` / ``mesh_time``)."""
    impl = STRATEGIES[name].on(training.engine)
    capacity = hardware.gpu_memory_bytes
    cpu_capacity = None if training.cpu_memory_gib is None else int(training.cpu_memory_gib * GIB)
    base = dict(strategy=name, engine=training.engine, capacity_bytes=capacity, runs_as=impl.runs_as,
                cpu_capacity_bytes=cpu_capacity, mesh=mesh)
    dp_world = hardware.world_size if mesh is None else mesh.dp  # ranks that take distinct micro-batches
    pipelined = mesh is not None and (mesh.pp > 1 or mesh.ep > 1)
    stages: dict[tuple[int, str], object] = {}  # pipeline meshes: every rank's memory (advisor.estimate.pipeline)
    if not impl.available:
        return Candidate(**base, available=False, unavailable_reason=impl.reason)
    quantized_reason = quantization_unavailable(impl, training.quantize)
    if quantized_reason is not None:
        return Candidate(**base, available=False, unavailable_reason=quantized_reason)
    if impl.single_process and hardware.nodes > 1:
        return Candidate(**base, available=False, unavailable_reason="DataParallel is one process: one node only")
    batch_problem = batch_split_problem(training, dp_world)
    if batch_problem is not None:  # the step must keep the asked global batch, never round it down
        return Candidate(**base, available=False, unavailable_reason=batch_problem)
    if mesh is not None:  # the model-parallel estimators load only when a mesh is evaluated
        from advisor.estimate.mesh_time import estimate_mesh_step_time
        from advisor.estimate.model_parallel import estimate_mesh_memory
    if pipelined:
        from advisor.estimate.pipeline import estimate_pipeline_memory, num_micro_batches
        from advisor.estimate.pipeline_time import estimate_pipeline_step_time

    # Checkpointing modes in the order tried: auto takes no checkpointing when it fits; otherwise the
    # faster of selective (keeps attention and every other matmul) and full, each at its largest micro-batch.
    modes = {"on": ["on"], "selective": ["selective"], "off": ["off"], "auto": ["off", "selective", "on"]}[
        training.activation_checkpointing]
    at = {mode: training.model_copy(update={"activation_checkpointing": mode}) for mode in modes}

    estimated: dict[tuple[int, str], MemoryBreakdown] = {}  # the searches below ask for some points twice

    def memory(micro: int, mode: str) -> MemoryBreakdown:
        if (micro, mode) not in estimated and pipelined:  # every pipeline rank; the worst decides
            stages[micro, mode] = estimate_pipeline_memory(
                spec, hardware, at[mode], impl, mesh, micro_batch_size=micro, checkpointing=mode != "off",
                num_micro_batches=num_micro_batches(mesh, _accumulation(training, dp_world, micro)), every_rank=False)
            estimated[micro, mode] = stages[micro, mode].worst.memory
        if (micro, mode) not in estimated:
            estimated[micro, mode] = (
                estimate_mesh_memory(spec, hardware, at[mode], impl, mesh, micro_batch_size=micro,
                                     checkpointing=mode != "off") if mesh is not None else
                estimate_memory(spec, hardware, at[mode], impl, micro_batch_size=micro, checkpointing=mode != "off"))
        return estimated[micro, mode]

    spans: dict[int, MemoryRange] = {}  # keyed by the breakdown's id: each one is kept in `estimated`

    def span(mem: MemoryBreakdown, mode: str) -> MemoryRange:
        if id(mem) not in spans:
            spans[id(mem)] = _range(spec, at[mode], impl, mem)
            worst = next((pm.worst for pm in stages.values() if pm.worst.memory is mem), None)
            if worst is not None and worst.imbalance_bytes:  # routing imbalance: the top of the range
                spans[id(mem)] = spans[id(mem)].model_copy(update={"high": spans[id(mem)].high + worst.imbalance_bytes})
        return spans[id(mem)]

    def timing_of(micro: int, mode: str, accumulation: int) -> StepTime:
        if pipelined:
            return estimate_pipeline_step_time(
                spec, hardware, at[mode], impl, mesh, micro_batch_size=micro, checkpointing=mode != "off",
                num_micro_batches=num_micro_batches(mesh, _accumulation(training, dp_world, micro)))
        if mesh is not None:
            return estimate_mesh_step_time(spec, hardware, at[mode], impl, mesh, micro_batch_size=micro,
                                           checkpointing=mode != "off", gradient_accumulation_steps=accumulation)
        return estimate_step_time(spec, hardware, at[mode], impl, micro_batch_size=micro,
                                  checkpointing=mode != "off", gradient_accumulation_steps=accumulation)

    def fits(mem: MemoryBreakdown, mode: str, limit: float = capacity) -> bool:
        if span(mem, mode).at(training.margin) > limit:  # --margin picks the end
            return False
        return cpu_capacity is None or mem.cpu_bytes * hardware.gpus_per_node <= cpu_capacity

    # --micro-batch auto stops at (1 - headroom) of memory: a batch that fills the GPU to the last GiB
    # is within the estimate's error of an out-of-memory failure. The smallest micro-batch may still use
    # more (whether a plan fits is the capacity test alone); a pinned micro-batch is the user's choice.
    roomy_limit = capacity * (1 - training.headroom) if training.micro_batch_size is None else capacity

    def largest(mode: str) -> tuple[int | None, bool]:
        """The largest micro-batch within the headroom, else the smallest that fits; and whether it is roomy."""
        micro = largest_fitting(lambda m: fits(memory(m, mode), mode, roomy_limit), choices)
        if micro is not None:
            return micro, True
        return (min(choices), False) if fits(memory(min(choices), mode), mode) else (None, False)

    def staged(cand: Candidate) -> Candidate:
        """A pipeline mesh's candidate with every rank's peak (the worst is its memory_bytes)."""
        found = next((key for key, pm in stages.items() if pm.worst.memory is cand.memory_bytes), None)
        if found is None:
            return cand
        (micro, mode), every = found, None
        every = estimate_pipeline_memory(  # every rank, for the plan to show
            spec, hardware, at[mode], impl, mesh, micro_batch_size=micro, checkpointing=mode != "off",
            num_micro_batches=num_micro_batches(mesh, _accumulation(training, dp_world, micro)))
        assert every.worst.memory == cand.memory_bytes, "the search's worst rank is not the worst rank"
        # A pipeline step runs m micro-batches (the schedule's n_microbatches) even without a global batch.
        update = {"stage_peaks": tuple(s.memory.total for s in every.stages)}
        if mesh.pp > 1:
            update["gradient_accumulation_steps"] = num_micro_batches(mesh, _accumulation(training, dp_world, micro))
        return cand.model_copy(update=update)

    choices = _micro_batch_choices(training, dp_world)
    lightest = memory(min(choices), modes[-1])  # the smallest micro-batch with the most recompute
    if not fits(lightest, modes[-1]):  # nothing fits: report it, the configuration closest to fitting
        return staged(Candidate(**base, available=True, fits=False, micro_batch_size=min(choices),
                         activation_checkpointing=modes[-1] != "off", selective_checkpointing=modes[-1] == "selective",
                         gradient_accumulation_steps=_accumulation(training, dp_world, min(choices)),
                         memory_bytes=lightest, memory_range=span(lightest, modes[-1]),
                         cpu_memory_bytes=_cpu_per_node(lightest, hardware)))
    fitting: list[Candidate] = []
    for mode in modes:
        micro, is_roomy = largest(mode)
        if micro is not None:
            mem = memory(micro, mode)
            accumulation = _accumulation(training, dp_world, micro)
            timing = timing_of(micro, mode, accumulation or 1)
            fitting.append(Candidate(**base, available=True, fits=True, micro_batch_size=micro,
                                     activation_checkpointing=mode != "off", selective_checkpointing=mode == "selective",
                                     gradient_accumulation_steps=accumulation, memory_bytes=mem,
                                     memory_range=span(mem, mode),
                                     cpu_memory_bytes=_cpu_per_node(mem, hardware), step_time_s=timing.step_s,
                                     step_time=timing))
            if mode == "off" and is_roomy:
                break  # no recompute and it fits: nothing to gain from checkpointing
    if fitting:
        # Memory first (each mode at the largest micro-batch it fits within the headroom, else at the
        # smallest), then step time: the most tokens/s; a tie keeps the one that recomputes less (the
        # order tried). Checkpointing without recompute is tried further when it only fits past the headroom.
        return staged(max(fitting, key=lambda c: (round(c.step_time.tokens_per_s, 6), -fitting.index(c))))
    # Nothing fits: report the smallest configuration, the one closest to fitting.
    micro, mode = min(choices), modes[-1]
    mem = memory(micro, mode)
    return staged(Candidate(**base, available=True, fits=False, micro_batch_size=micro,
                            activation_checkpointing=mode != "off", selective_checkpointing=mode == "selective",
                            gradient_accumulation_steps=_accumulation(training, dp_world, micro),
                            memory_bytes=mem, memory_range=span(mem, mode),
                            cpu_memory_bytes=_cpu_per_node(mem, hardware)))


def _range(spec: ModelSpec, training: TrainingConfig, impl: Implementation, mem: MemoryBreakdown) -> MemoryRange:
    """The total's low / expected / high from the measured errors of this kind of estimate
    (``profiles/memory_error.json``: model family, strategy kind, variant)."""
    kind = "offload" if impl.offload_params or impl.offload_optimizer else (
        "sharded" if impl.shard_params or impl.shard_grads else "replicated")
    variant = ("qlora" if training.quantize is not None else
               "lora" if training.lora is not None or spec.trainable_params < spec.total_params else
               "loss_kernel" if training.loss != "hf" else
               "checkpointing" if training.activation_checkpointing != "off" else "plain")
    bounds = relative_bounds(error_table(), family=spec.model_type or "*unknown*", strategy_kind=kind, variant=variant)
    return memory_range(mem.total, bounds, unmeasured=mem.outside_allocator)


def _cpu_per_node(mem: MemoryBreakdown, hardware: Hardware) -> int | None:
    return mem.cpu_bytes * hardware.gpus_per_node if mem.cpu_bytes else None


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def choose_fastest(
    spec: ModelSpec, candidates: list[Candidate], *, global_batch_size: int | None = None
) -> tuple[Recommendation | None, list[str]]:
    """``--policy fastest``: among candidates that fit, the most tokens per second (the least time per
    global batch, which gradient accumulation keeps fixed); the 'why' compares it with the default."""
    fitting = [c for c in candidates if c.fits and c.step_time is not None]
    if not fitting:
        return choose(spec, candidates)
    default, rationale = default_strategy(spec)
    best = rank_by_time([(c, c.step_time) for c in fitting])[0][1].tokens_per_s
    # Ties (within 0.5%) go to the size default, then to the strategy that communicates least.
    tied = [c for c in fitting if c.step_time.tokens_per_s >= best * 0.995]
    fastest = min(tied, key=lambda c: (c.strategy != default, ESCALATION.index(c.strategy)
                                       if c.strategy in ESCALATION else -1))
    rate = f"{fastest.step_time.tokens_per_s:,.0f} tokens/s (MFU {fastest.step_time.mfu:.0%})"
    if len(fitting) > 1:
        why = [f"Policy fastest: of {len(fitting)} candidates that fit, {fastest.strategy} is fastest: {rate}."]
    else:
        why = [f"Policy fastest: {fastest.strategy} is the only candidate that fits: {rate}."]
    base = next((c for c in fitting if c.strategy == default), None)
    if base is not None and base.strategy != fastest.strategy:
        why.append(explain_tradeoff((fastest.strategy, fastest.step_time), (base.strategy, base.step_time),
                                    global_batch_size=global_batch_size))
    elif base is None:
        why.append(f"The size default {default} ({rationale}) does not fit.")
    else:
        why.append(f"It is also the size default ({rationale}).")
    return _recommend(fastest, " ".join(why)), why


def _share(cand: Candidate) -> float:
    return cand.memory_bytes.total / cand.capacity_bytes


def _figures(cand: Candidate, *, first: bool) -> str:
    """``zero2 71% of memory, 1.90 s/step at micro-batch 4 (35,000 tokens/s)``; the second of a pair
    drops ``of memory``. Tokens/s is what compares candidates whose micro-batches differ."""
    step = cand.step_time
    return (f"{cand.strategy} {_share(cand):.0%}{' of memory' if first else ''}, {step.step_s:.2f} s/step at "
            f"micro-batch {cand.micro_batch_size} ({step.tokens_per_s:,.0f} tokens/s)")


def prefer_practical(chosen: Candidate, fitting: list[Candidate], *, headroom: float) -> tuple[Candidate, str | None]:
    """Among fitting candidates as fast as ``chosen`` (tokens/s within ``SAME_SPEED``), the one a
    practitioner runs, and the sentence that says why in numbers (None when no peer is as fast).

    The margin policy: a plan fits when its peak plus runtime overhead is at most the GPU's memory;
    one that also leaves ``headroom`` free is comfortable. Comfortable plans come first, and among
    them the one that communicates least (``ESCALATION`` order). When none is comfortable (the auto
    micro-batch stops at the headroom, so only a plan at micro-batch 1 or a pinned one can be past it)
    the size-threshold choice stands.
    """
    if chosen.step_time is None:
        return chosen, None
    speed = chosen.step_time.tokens_per_s
    # Peers are as fast within SAME_SPEED either way: a much faster plan is --policy fastest's business,
    # and calling it "as fast" would misstate the numbers printed beside it.
    # A GPU-only choice has GPU-only peers: offload is for when nothing fits on the GPUs alone.
    peers = [c for c in fitting if c.strategy in ESCALATION and c.step_time is not None
             and abs(c.step_time.tokens_per_s - speed) <= SAME_SPEED * speed
             and (offloads(chosen) or not offloads(c))]
    if len(peers) < 2:
        return chosen, None

    def roomy(c: Candidate) -> bool:
        return _share(c) <= 1 - headroom

    def key(c: Candidate) -> tuple[bool, int]:
        return (not roomy(c), ESCALATION.index(c.strategy) if roomy(c) else int(c is not chosen))

    best = min(peers, key=key)
    runner_up = chosen if best is not chosen else min((c for c in peers if c is not best), key=key)
    limit = f"{1 - headroom:.0%}"
    if roomy(best) and not roomy(runner_up):
        because = f"only {best.strategy} stays within {limit} of memory (the {headroom:.0%} headroom policy)"
    elif roomy(best):
        because = f"both stay within {limit} of memory and {best.strategy} communicates less"
    else:
        because = (f"neither stays within {limit} of memory (the {headroom:.0%} headroom policy), so the "
                   "size-threshold choice stands")
    return best, (f"{best.strategy} rather than {runner_up.strategy}: {_figures(best, first=True)} vs "
                  f"{_figures(runner_up, first=False)}; as fast (within {SAME_SPEED:.0%}) and {because}.")


def choose(
    spec: ModelSpec, candidates: list[Candidate], *, only: StrategyName | None = None,
    headroom: float = TrainingConfig.model_fields["headroom"].default,
) -> tuple[Recommendation | None, list[str]]:
    """The recommendation and the lines of 'why': size thresholds, then escalation, then the margin
    policy among plans as fast as that choice (``prefer_practical``)."""
    by_name = {c.strategy: c for c in candidates}
    fitting = [c for c in candidates if c.available and c.fits]
    if only is not None:
        cand = by_name[only]
        if not cand.fits:
            return None, [_does_not_fit(cand)]
        return _recommend(cand, f"{only} was requested and fits"), [f"{only} was requested; it fits."]
    default, rationale = default_strategy(spec)
    why = [f"Default from size: {default} ({rationale})."]
    start = ESCALATION.index(default)
    chosen = _escalate(by_name, default, fitting)
    if chosen is None:
        why.append(_does_not_fit(by_name[default]))
        last = ESCALATION[-1]
        if last != default and last in by_name:
            why.append(_does_not_fit(by_name[last]))
        return None, why
    chosen, offload_note = _fastest_offload(chosen, fitting)
    size_choice = chosen
    chosen, comparison = prefer_practical(chosen, fitting, headroom=headroom)
    if size_choice.strategy == default:
        why.append(f"{default} fits: {_gib(size_choice.memory_bytes.total)} of {_gib(size_choice.capacity_bytes)} "
                   f"per GPU ({_share(size_choice):.0%}) at micro-batch {size_choice.micro_batch_size}"
                   f"{_with_checkpointing(size_choice)}.")
    else:
        why.append(_does_not_fit(by_name[default]))
        direction = "escalated" if ESCALATION.index(size_choice.strategy) > start else "fell back"
        on_gpu = [c for c in fitting if c.strategy in ESCALATION and not offloads(c)]
        among = (f" (the fastest of {len(on_gpu)} that fit on the GPUs alone: "
                 f"{size_choice.step_time.tokens_per_s:,.0f} tokens/s)" if len(on_gpu) > 1 else "")
        why.append(f"{direction} to {size_choice.strategy}: {_gib(size_choice.memory_bytes.total)} of "
                   f"{_gib(size_choice.capacity_bytes)} per GPU at micro-batch {size_choice.micro_batch_size}{among}.")
    if offload_note is not None:
        why.append(offload_note)
    reason_lines = why[1:]
    if comparison is not None:
        why.append(comparison)
        reason_lines = why[1:]
    if chosen.cpu_memory_bytes:
        checked = ("checked only when --cpu-memory-gib is given" if chosen.cpu_capacity_bytes is None else
                   f"of {_gib(chosen.cpu_capacity_bytes)} given by --cpu-memory-gib")
        why.append(f"{chosen.strategy} needs {_gib(chosen.cpu_memory_bytes)} of CPU RAM per node for offloaded "
                   f"states ({checked}).")
    if chosen.selective_checkpointing:
        why.append("Selective activation checkpointing is on (attention outputs and every other matmul kept): "
                   "without it no micro-batch fits, and it recomputes less than full checkpointing.")
    elif chosen.activation_checkpointing:
        why.append("Activation checkpointing is on: without it no micro-batch fits (costs ~1/3 more compute).")
    cheaper = [c for c in fitting if c.strategy in ESCALATION and c is not chosen
               and ESCALATION.index(c.strategy) < ESCALATION.index(chosen.strategy)]
    alternatives = tuple(f"{c.strategy} also fits ({_share(c):.0%} of memory, micro-batch {c.micro_batch_size}"
                         f"{f', {c.step_time.step_s:.2f} s/step' if c.step_time else ''}) and communicates less"
                         for c in cheaper)
    why.extend(alternatives)
    return _recommend(chosen, " ".join(reason_lines), alternatives), why


def _escalate(by_name: dict[str, Candidate], default: StrategyName, fitting: list[Candidate]) -> Candidate | None:
    """The size default when it fits; otherwise the fastest GPU-only candidate that fits (``prefer_practical``
    then applies the headroom policy among those as fast), whichever side of the default it lies;
    offload only when no GPU-only candidate fits, the first along ``ESCALATION`` from the default."""
    if default in by_name and by_name[default].fits:
        return by_name[default]
    on_gpu = [c for c in fitting if c.strategy in ESCALATION and not offloads(c) and c.step_time is not None]
    if on_gpu:  # ties keep the one that communicates least
        return max(on_gpu, key=lambda c: (round(c.step_time.tokens_per_s, 6), -ESCALATION.index(c.strategy)))
    start = ESCALATION.index(default)
    order = [*ESCALATION[start:], *ESCALATION[:start]]
    return next((by_name[n] for n in order if n in by_name and by_name[n].fits), None)


def offloads(cand: Candidate) -> bool:
    """The candidate keeps parameters or optimizer state on the CPU."""
    impl = STRATEGIES[cand.strategy].on(cand.engine)
    return impl.offload_params or impl.offload_optimizer


def _fastest_offload(chosen: Candidate, fitting: list[Candidate]) -> tuple[Candidate, str | None]:
    """Escalation reaches offload only when nothing fits on the GPUs alone; once there, the offload
    variants differ mostly in how large a micro-batch they leave room for, so take the fastest."""
    if not offloads(chosen) or chosen.step_time is None:
        return chosen, None
    peers = [c for c in fitting if offloads(c) and c.step_time is not None and c.mesh is None]
    best = max(peers, key=lambda c: c.step_time.tokens_per_s)
    if best is chosen or best.step_time.tokens_per_s <= chosen.step_time.tokens_per_s * (1 + SAME_SPEED):
        return chosen, None
    return best, (f"{best.strategy} rather than {chosen.strategy}: both offload, and {best.strategy} runs "
                  f"{best.step_time.tokens_per_s:,.0f} tokens/s (micro-batch {best.micro_batch_size}) against "
                  f"{chosen.step_time.tokens_per_s:,.0f} (micro-batch {chosen.micro_batch_size}).")


def _with_checkpointing(cand: Candidate) -> str:
    if not cand.activation_checkpointing:
        return ""
    return " with selective activation checkpointing" if cand.selective_checkpointing else " with activation checkpointing"


def _recommend(cand: Candidate, reason: str, alternatives: tuple[str, ...] = ()) -> Recommendation:
    return Recommendation(
        strategy=cand.strategy,
        engine=cand.engine,
        micro_batch_size=cand.micro_batch_size,
        activation_checkpointing=bool(cand.activation_checkpointing),
        selective_checkpointing=cand.selective_checkpointing,
        gradient_accumulation_steps=cand.gradient_accumulation_steps,
        reason=reason,
        alternatives=alternatives,
        mesh=cand.mesh,
    )


def _does_not_fit(cand: Candidate) -> str:
    if not cand.available:
        return f"{cand.strategy} is unavailable: {cand.unavailable_reason}."
    mem, span = cand.memory_bytes, cand.memory_range
    cpu_fits = cand.cpu_capacity_bytes is None or (cand.cpu_memory_bytes or 0) <= cand.cpu_capacity_bytes
    if mem.total <= cand.capacity_bytes and span is not None and span.high > cand.capacity_bytes and cpu_fits:
        return (f"{cand.strategy} does not fit at the high end of its range (--margin high): "
                f"{_gib(span.high)} per GPU of {_gib(cand.capacity_bytes)} (expected {_gib(mem.total)}) even at "
                f"micro-batch {cand.micro_batch_size}{' with checkpointing' if cand.activation_checkpointing else ''}.")
    if mem.total <= cand.capacity_bytes and cand.cpu_capacity_bytes is not None:
        return (f"{cand.strategy} does not fit in CPU RAM: needs {_gib(cand.cpu_memory_bytes or 0)} per node "
                f"of {_gib(cand.cpu_capacity_bytes)}.")
    return (f"{cand.strategy} does not fit: needs {_gib(mem.total)} per GPU of {_gib(cand.capacity_bytes)} "
            f"even at micro-batch {cand.micro_batch_size}"
            f"{' with checkpointing' if cand.activation_checkpointing else ''}.")

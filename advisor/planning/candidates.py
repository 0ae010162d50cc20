"""The search: one strategy's candidate (``evaluate_candidate``: micro-batch x checkpointing on the data-parallel
family or a mesh, memory and step time), and the types a plan is made of (``Candidate``, ``Remedy``,
``Recommendation``). Which candidate is recommended is ``advisor.planning.policy``'s; pure functions of
validated inputs, wired to names and strings by ``advisor.planning.api.plan``.
"""

from __future__ import annotations

import functools

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, computed_field, model_serializer, model_validator

from advisor.frozen import in_json_order, validated_copy
from advisor.hardware.cluster import Hardware
from advisor.calibration import error_table
from advisor.estimate.accumulation import accumulation_steps
from advisor.estimate.error_bars import MemoryRange, memory_range, relative_bounds
from advisor.estimate.memory import MemoryBreakdown, estimate_memory
from advisor.estimate.quantized import quantization_unavailable
from advisor.model.spec import ModelSpec
from advisor.estimate.step_time import StepTime, estimate_step_time
from advisor.estimate.strategy_buffers import runs_plain
from advisor.mesh import ParallelDims
from advisor.planning.reasons import ReasonModel
from advisor.strategies import STRATEGIES, StrategyName
from advisor.training import CheckpointMode, TrainingConfig
from advisor.units import GIB

# Throughputs within 3% count as the same speed: well inside the step-time model's error against
# published runs (benchmarks/results/throughput_validation.md: within 25%), so a smaller gap is no
# reason to give up memory headroom, recompute more or take on more communication (advisor.planning.policy).
SAME_SPEED = 0.03
# Below this share of the peak the plan mostly waits (exposed communication or offload). Published
# well-tuned runs reach 38-58% (benchmarks/results/throughput_validation.md: llm-foundry MPT-30B on
# 8 x H100 38%, torchtitan Llama 3 8B on 64 x A100 58%); half the lowest of them is the line drawn here: remedies
# are listed below it (advisor.planning.remedies), and on several nodes meshes and pipeline stages are searched for a
# faster plan (advisor.planning.meshes).
USEFUL_MFU = 0.20
# A third of the step in exposed collectives: the overlap FSDP and DDP are built for has failed (the published
# multi-node runs of benchmarks/results/published_jobs.md expose none), whatever the GPU's peak makes of the MFU (70B
# on 4 x 8 A100 over 100 Gb/s Ethernet: MFU 30%, 40% of the step exposed). A judgement, not a fit.
EXPOSED_SHARE = 1 / 3


AUTO_MICRO_BATCH_CAP = 64
# The keys of a candidate and a recommendation in --json, in the order readers have always seen (some are
# properties now, which pydantic would write last); a pipeline mesh's stage_peaks comes after them.
CANDIDATE_KEYS = ("strategy", "engine", "available", "unavailable_reason", "runs_as", "fits", "micro_batch_size",
                  "gradient_accumulation_steps", "activation_checkpointing", "selective_checkpointing", "memory_bytes",
                  "memory_range", "capacity_bytes", "cpu_memory_bytes", "cpu_capacity_bytes", "step_time_s",
                  "step_time", "mesh")
RECOMMENDATION_KEYS = ("strategy", "engine", "micro_batch_size", "activation_checkpointing", "selective_checkpointing",
                       "gradient_accumulation_steps", "reason", "alternatives", "mesh", "remedies")



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
    checkpointing: CheckpointMode | None = Field(default=None, exclude=True, description="How the step checkpoints "
                                                 "its blocks; None: not evaluated (unavailable). The JSON carries "
                                                 "it as activation_checkpointing and selective_checkpointing.")
    memory_bytes: MemoryBreakdown | None = None
    memory_range: MemoryRange | None = Field(default=None, description="Per-GPU total (bytes): low / expected / high "
                                              "from the lowest and highest measured reserved / estimate of this stack "
                                              "and tuning (profiles/memory_error.json, benchmarks/error_table.py; "
                                              "applied to the reserved part; the CUDA context is added as assumed).")
    capacity_bytes: int = Field(description="Memory of one GPU.")
    cpu_memory_bytes: int | None = Field(default=None, description="CPU RAM per node for offloaded states.")
    cpu_capacity_bytes: int | None = Field(default=None, description="CPU RAM per node, when given.")
    step_time: StepTime | None = Field(default=None, description="Compute/communication split, tokens/s, MFU.")
    mesh: ParallelDims | None = Field(default=None, description="The device mesh (tp/cp/HSDP degrees); None: "
                                      "data parallelism alone over every GPU.")
    stage_peaks: tuple[int, ...] | None = Field(default=None, description="Pipeline/expert meshes: each pipeline "
                                                "rank's peak (bytes, total), rank 0 first; the worst is memory_bytes.")
    uncheckpointed: tuple[int, int, float] | None = Field(
        default=None, exclude=True, description="(micro-batch, total bytes at the --margin end, tokens/s) of the same "
        "strategy without checkpointing, where that fitted and a checkpointed plan was taken: past the headroom, or "
        "slower than the larger micro-batch checkpointing makes room for (the reason says which); not in the JSON.")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def activation_checkpointing(self) -> bool | None:
        """The step recomputes its blocks (fully or selectively); None: not evaluated."""
        return None if self.checkpointing is None else self.checkpointing != "off"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def selective_checkpointing(self) -> bool:
        """The checkpointing is selective (per-op)."""
        return self.checkpointing == "selective"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def step_time_s(self) -> float | None:
        """Seconds per optimizer step (fitting candidates)."""
        return None if self.step_time is None else self.step_time.step_s

    @model_serializer(mode="wrap")
    def _serialize(self, handler):  # plans without pp/ep keep their JSON byte-identical
        data = handler(self)
        if self.stage_peaks is None and isinstance(data, dict):
            data.pop("stage_peaks", None)
        return in_json_order(data, CANDIDATE_KEYS)


class Remedy(_Frozen):
    """One changed knob and the plan it leads to."""

    name: str = Field(description="The change as the CLI spells it, e.g. '--loss fused' or '--gpus 4xA100-80GB-SXM'.")
    keeps_math: bool = Field(description="True: the same training mathematics (same model, optimizer, dtypes and "
                             "global batch); False: it changes what or how the model trains.")
    saved_gib: float = Field(description="Per-GPU memory it saves on the reference candidate at the same micro-batch "
                             "and checkpointing (negative: it costs memory).")
    reference: str | None = Field(default=None, exclude_if=lambda name: name is None,
                                  description="The reference candidate's strategy: the size default where it does "
                                              "not fit, else the chosen plan.")
    strategy: StrategyName | None = Field(default=None, description="The strategy the re-plan chooses.")
    mesh: str | None = Field(default=None, exclude_if=lambda label: label is None,
                             description="The mesh that plan runs on, where the change is a pinned degree (--cp).")
    total_gib: float | None = Field(default=None, exclude_if=lambda gib: gib is None,
                                   description="That plan's per-GPU total (peak with the allocator gap and CUDA "
                                               "context), at its own micro-batch and checkpointing.")
    step_s: float | None = Field(default=None, description="Seconds per optimizer step of that plan.")
    tokens_per_s: float | None = Field(default=None, description="Global tokens per second of that plan.")
    fits: bool = Field(description="That plan fits on the GPUs alone (no CPU offload).")
    own_samples: int | None = Field(default=None, exclude_if=lambda n: n is None,
                                    description="That plan's samples a step where they differ from this plan's and no "
                                                "--global-batch fixes them (the user's or the remedy's): its own "
                                                "micro-batch search's, or a mesh's fewer data-parallel ranks; its "
                                                "step_s is for that many samples.")
    plan_samples: int | None = Field(default=None, exclude_if=lambda n: n is None,
                                     description="This plan's samples a step, where own_samples is given.")
    past_headroom: bool = Field(default=False, exclude_if=lambda past: not past,
                                description="That plan fits on the GPUs alone only past the --headroom (within the "
                                            "estimate's error of an out-of-memory failure).")


class Recommendation(_Frozen):
    """The chosen candidate and why. What it runs (strategy, engine, micro-batch, checkpointing, accumulation,
    mesh) is the candidate's, read from it."""

    candidate: Candidate = Field(exclude=True, description="The recommended candidate; the JSON carries its "
                                 "strategy, engine, micro-batch, checkpointing, accumulation and mesh.")
    reason: str
    alternatives: tuple[str, ...] = ()
    reasons: tuple[SerializeAsAny[ReasonModel], ...] = Field(default=(), exclude=True, description="What ``reason`` says, as data "
                                        "(advisor.planning.reasons; ``reason`` is their rendering).")
    remedies: tuple[Remedy, ...] = Field(default=(), description="What would change a plan that offloads, leaves the "
                                         "size default unfit or runs below a useful MFU, ranked "
                                         "(advisor.planning.remedies).")

    @model_validator(mode="after")
    def _evaluated(self) -> Recommendation:
        if self.candidate.micro_batch_size is None or self.candidate.checkpointing is None:
            raise ValueError(f"{self.candidate.strategy}: a recommendation needs an evaluated candidate")
        return self

    @computed_field  # type: ignore[prop-decorator]
    @property
    def strategy(self) -> StrategyName:
        return self.candidate.strategy

    @computed_field  # type: ignore[prop-decorator]
    @property
    def engine(self) -> str:
        return self.candidate.engine

    @computed_field  # type: ignore[prop-decorator]
    @property
    def micro_batch_size(self) -> int:
        return self.candidate.micro_batch_size

    @property
    def checkpointing(self) -> CheckpointMode:
        """How the step checkpoints its blocks (the JSON carries activation_ and selective_checkpointing)."""
        return self.candidate.checkpointing

    @computed_field  # type: ignore[prop-decorator]
    @property
    def activation_checkpointing(self) -> bool:
        """The step recomputes its blocks (fully or selectively)."""
        return self.checkpointing != "off"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def selective_checkpointing(self) -> bool:
        """The checkpointing is selective (per-op)."""
        return self.checkpointing == "selective"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gradient_accumulation_steps(self) -> int | None:
        return self.candidate.gradient_accumulation_steps

    @computed_field  # type: ignore[prop-decorator]
    @property
    def mesh(self) -> ParallelDims | None:
        """The device mesh; None: data parallelism alone."""
        return self.candidate.mesh

    @model_serializer(mode="wrap")
    def _serialize(self, handler):
        return in_json_order(handler(self), RECOMMENDATION_KEYS)


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
    if training.optimizer_in_backward:  # no gradient accumulation (advisor.estimate.in_backward)
        return [per_rank]
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


@functools.lru_cache(maxsize=256)  # the search asks for the same few copies once per strategy and mesh
def _training_at(training: TrainingConfig, mode: str) -> TrainingConfig:
    return validated_copy(training, {"activation_checkpointing": mode})


# Run by the simulator (fake tensors, torch's FSDP2, a fake group): transformers' Adafactor builds a matrix's factored
# state as plain tensors (``torch.zeros(grad_shape[:-1]).to(grad)``, optimization.py) and adds the DTensor gradient's
# means to them; FSDP1's flat parameters and ZeroRedundancyOptimizer's are plain tensors
ADAFACTOR_ON_FSDP2 = ("transformers' Adafactor cannot step FSDP2's sharded (DTensor) parameters: its factored state is "
                      "built as plain tensors and DTensor refuses the mix (RuntimeError: got mixed torch.Tensor and "
                      "DTensor); zero1, ddp, --fsdp-version 1 or --engine deepspeed run it")


def evaluate_candidate(
    spec: ModelSpec, hardware: Hardware, training: TrainingConfig, name: StrategyName,
    mesh: ParallelDims | None = None,
) -> Candidate:
    """Best micro-batch and checkpointing for one strategy (no checkpointing preferred when it fits),
    on ``mesh`` when given (``advisor.estimate.model_parallel`` / ``mesh_time``)."""
    impl = STRATEGIES[name].on(training.engine)
    if training.fsdp_version == 1 and not impl.shard_params:  # FSDP's version plays no part where FSDP does not run
        training = validated_copy(training, {"fsdp_version": 2})
    capacity = hardware.gpu_memory_bytes
    cpu_capacity = None if training.cpu_memory_gib is None else int(training.cpu_memory_gib * GIB)
    runs_as = ("the plain model (one GPU: no DDP wrapper, as every stack runs it)"
               if runs_plain(impl, hardware.world_size) else impl.runs_as)
    base = dict(strategy=name, engine=training.engine, capacity_bytes=capacity, runs_as=runs_as,
                cpu_capacity_bytes=cpu_capacity, mesh=mesh)
    dp_world = hardware.world_size if mesh is None else mesh.dp  # ranks that take distinct micro-batches
    pipelined = mesh is not None and (mesh.pp > 1 or mesh.ep > 1)
    stages: dict[tuple[int, str], object] = {}  # pipeline meshes: every rank's memory (advisor.estimate.pipeline)
    if not impl.available:
        return Candidate(**base, available=False, unavailable_reason=impl.reason)
    stack = training.recipe.torch_strategies
    if impl.engine == "torch" and stack is not None and name not in stack and not runs_plain(impl, hardware.world_size):
        other = STRATEGIES[name].on("deepspeed")
        instead = (f"; --engine deepspeed runs {name} ({other.runs_as})"
                   if "deepspeed" in training.recipe.engines and other.available else "")
        return Candidate(**base, available=False, unavailable_reason=(
            f"the {training.recipe.name} recipe does not run {impl.runs_as}: its loop runs "
            f"{', '.join(stack)} (profiles/recipes.json torch_strategies){instead}"))
    if training.optimizer == "adafactor" and impl.engine == "torch" and impl.shard_params and training.fsdp_version != 1:
        return Candidate(**base, available=False, unavailable_reason=ADAFACTOR_ON_FSDP2)
    if training.optimizer_in_backward and not runs_plain(impl, hardware.world_size):  # advisor.estimate.in_backward
        return Candidate(**base, available=False, unavailable_reason="--optimizer-in-backward is modelled on the plain "
                         "model of one GPU (torchtune's single-device recipes), not under " + impl.runs_as)
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
        from advisor.estimate.pipeline import estimate_pipeline_memory
        from advisor.estimate.pipeline_schedules import num_micro_batches
        from advisor.estimate.pipeline_time import estimate_pipeline_step_time

    # Checkpointing modes in the order tried, each at its largest micro-batch within the headroom: none, selective
    # (keeps attention and every other matmul) and full; auto takes, of those within the headroom, the one that
    # recomputes least within SAME_SPEED of the fastest (below).
    # A kept KV cache cannot run under selective checkpointing (advisor.estimate.kv_cache): auto skips it.
    auto = ["off", "on"] if training.keeps_kv_cache else ["off", "selective", "on"]
    if training.activation_offload:  # offloading is planned under checkpointing (advisor.estimate.activation_offload)
        auto = [mode for mode in auto if mode != "off"]
    modes = {"on": ["on"], "selective": ["selective"], "off": ["off"], "auto": auto}[training.activation_checkpointing]
    at = {mode: _training_at(training, mode) for mode in modes}

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
            spans[id(mem)] = _range(spec, at[mode], mem)
            worst = next((pm.worst for pm in stages.values() if pm.worst.memory is mem), None)
            if worst is not None and worst.imbalance_bytes:  # routing imbalance: the top of the range
                spans[id(mem)] = validated_copy(spans[id(mem)], {"high": spans[id(mem)].high + worst.imbalance_bytes})
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
                                  checkpointing=mode != "off", gradient_accumulation_steps=accumulation,
                                  paged_on_cpu_bytes=memory(micro, mode).paged_on_cpu,
                                  offloaded_activation_bytes=memory(micro, mode).activations_on_cpu)

    def fits(mem: MemoryBreakdown, mode: str, limit: float = capacity) -> bool:
        if span(mem, mode).at(training.margin) > limit:  # --margin picks the end
            return False
        return cpu_capacity is None or mem.cpu_bytes * hardware.gpus_per_node <= cpu_capacity

    # --micro-batch auto stops at (1 - headroom) of memory: a batch that fills the GPU to the last GiB
    # is within the estimate's error of an out-of-memory failure. The smallest micro-batch may still use
    # more (whether a plan fits is the capacity test alone); a pinned micro-batch is the user's choice.
    roomy_limit = capacity * (1 - training.headroom) if training.micro_batch_size is None else capacity

    def largest(mode: str) -> tuple[int | None, bool]:
        """The largest micro-batch within the headroom, else the smallest that fits; and whether it is roomy. Memory
        grows with the micro-batch but for one step: where accumulation holds gradients (the Trainer's FSDP holds them
        unsharded until the last micro-batch, advisor.estimate.accumulation), the micro-batch that takes the whole
        global batch at once (no accumulation) can fit where every smaller one does not, so it is tried first."""
        if single_step is not None and fits(memory(single_step, mode), mode, roomy_limit):
            return single_step, True
        micro = largest_fitting(lambda m: fits(memory(m, mode), mode, roomy_limit), choices)
        if micro is not None:
            return micro, True
        fitting_past = [m for m in (min(choices), single_step) if m is not None and fits(memory(m, mode), mode)]
        if not fitting_past:
            return None, False
        # past the headroom either way: the one that needs less (the smallest micro-batch, unless accumulating it
        # holds more than the whole batch at once)
        return min(fitting_past, key=lambda m: span(memory(m, mode), mode).at(training.margin)), False

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
        return validated_copy(cand, update)

    choices = _micro_batch_choices(training, dp_world)
    single_step = max(choices) if len(choices) > 1 and _accumulation(training, dp_world, max(choices)) == 1 else None
    lightest = memory(min(choices), modes[-1])  # the smallest micro-batch with the most recompute
    if not fits(lightest, modes[-1]) and not (single_step is not None and fits(memory(single_step, modes[-1]),
                                                                              modes[-1])):
        # nothing fits: report it, the configuration closest to fitting
        return staged(Candidate(**base, available=True, fits=False, micro_batch_size=min(choices),
                         checkpointing=modes[-1],
                         gradient_accumulation_steps=accumulation_steps(training, dp_world=dp_world,
                                                                  micro_batch_size=min(choices)),
                         memory_bytes=lightest, memory_range=span(lightest, modes[-1]),
                         cpu_memory_bytes=_cpu_per_node(lightest, hardware)))
    fitting: list[Candidate] = []
    for mode in modes:
        micro, is_roomy = largest(mode)
        if micro is not None:
            mem = memory(micro, mode)
            accumulation = accumulation_steps(training, dp_world=dp_world, micro_batch_size=micro)
            timing = timing_of(micro, mode, accumulation)
            fitting.append(Candidate(**base, available=True, fits=True, micro_batch_size=micro,
                                     checkpointing=mode,
                                     gradient_accumulation_steps=accumulation, memory_bytes=mem,
                                     memory_range=span(mem, mode),
                                     cpu_memory_bytes=_cpu_per_node(mem, hardware),
                                     step_time=timing))
    if fitting:
        # Memory first: each mode at the largest micro-batch it fits within the headroom, else at the smallest;
        # a mode within the headroom (whatever chose its micro-batch, a pinned one too) beats one past it:
        # micro-batch 1 without checkpointing at 99% of memory is within the estimate's error of an out-of-memory
        # failure, as a full auto batch is. Then step time: the mode that recomputes least (the order tried) among
        # those within SAME_SPEED of the most tokens/s. Every mode is tried, even where the plan without
        # checkpointing fits within the headroom: the larger micro-batch checkpointing makes room for can be the
        # faster step (under CPU offload the optimizer step and the transfers are paid once per step, so it often
        # is). --policy fastest: speed alone.
        comfort = [within_headroom(c, training) for c in fitting]
        best = _least_recompute_of_fastest(fitting, comfort, same_speed=0 if training.policy == "fastest" else SAME_SPEED)
        chosen = staged(fitting[best])
        off = fitting[0] if fitting[0].checkpointing == "off" else None
        if off is not None and best != 0:  # the reason gives what checkpointing was chosen over
            chosen = validated_copy(chosen, {"uncheckpointed": (
                off.micro_batch_size, off.memory_range.at(training.margin), off.step_time.tokens_per_s)})
        return chosen
    # Nothing fits: report the smallest configuration, the one closest to fitting.
    micro, mode = min(choices), modes[-1]
    mem = memory(micro, mode)
    return staged(Candidate(**base, available=True, fits=False, micro_batch_size=micro,
                            checkpointing=mode,
                            gradient_accumulation_steps=accumulation_steps(training, dp_world=dp_world,
                                                                            micro_batch_size=micro),
                            memory_bytes=mem, memory_range=span(mem, mode),
                            cpu_memory_bytes=_cpu_per_node(mem, hardware)))


def _least_recompute_of_fastest(fitting: list[Candidate], comfort: list[bool], *, same_speed: float) -> int:
    """The index of the first candidate (the least recompute: the order tried) among the comfortable ones, if any,
    whose tokens/s is within ``same_speed`` of the fastest of them (0 under --policy fastest: the fastest)."""
    pool = [i for i in range(len(fitting)) if comfort[i]] or list(range(len(fitting)))
    fastest = max(fitting[i].step_time.tokens_per_s for i in pool)
    return next(i for i in pool if fitting[i].step_time.tokens_per_s * (1 + same_speed) >= fastest)


def samples_per_step(cand: Candidate, world: int) -> int:
    """The samples one optimizer step of ``cand`` takes: micro-batch x accumulation steps x data-parallel ranks (its
    mesh's, else all ``world`` GPUs)."""
    return cand.micro_batch_size * (cand.gradient_accumulation_steps or 1) * (
        cand.mesh.dp if cand.mesh is not None else world)


def within_headroom(cand: Candidate, training: TrainingConfig) -> bool:
    """A fitting candidate whose ``--margin`` end leaves ``training.headroom`` of memory free; under --policy
    fastest every fitting one (that policy has no headroom preference)."""
    return (training.policy == "fastest"
            or cand.memory_range.at(training.margin) <= (1 - training.headroom) * cand.capacity_bytes)

def waits_on_network(cand: Candidate, nodes: int) -> bool:
    """On several nodes, the plan runs below USEFUL_MFU or spends EXPOSED_SHARE of its step in exposed collectives:
    meshes and pipeline stages are searched for a faster one (advisor.planning.meshes)."""
    step = cand.step_time
    return nodes > 1 and step is not None and (
        step.mfu < USEFUL_MFU or step.exposed_communication_s >= EXPOSED_SHARE * step.step_s)


def larger_past_headroom(spec: ModelSpec, hardware: Hardware, training: TrainingConfig, chosen: Candidate, *,
                         flags: str | None = None):
    """Where ``--micro-batch auto`` stopped ``chosen`` at the --headroom and the largest micro-batch the GPU holds
    (at the --margin end, same strategy, mesh and checkpointing) runs more than SAME_SPEED faster: that plan, as a
    ``reasons.PastHeadroom`` (None otherwise; not under a pinned micro-batch or --policy fastest, which has no
    headroom). Published runs fill a card so (litgpt's LoRA of Llama 2 7B on an A10G at micro-batch 2, 92% of it by
    the estimate); the plan keeps the headroom and says what it costs. ``flags``: those beside --micro-batch that plan
    it (the mesh and global batch the planner chose)."""
    from advisor.planning import reasons as r

    if (training.micro_batch_size is not None or training.policy == "fastest" or not chosen.fits
            or chosen.step_time is None or not within_headroom(chosen, training)):
        return None
    at = validated_copy(training, {"headroom": 0.0, "activation_checkpointing": chosen.checkpointing})
    larger = evaluate_candidate(spec, hardware, at, chosen.strategy, chosen.mesh)
    if (not larger.fits or larger.step_time is None or larger.micro_batch_size <= chosen.micro_batch_size
            or larger.step_time.tokens_per_s <= (1 + SAME_SPEED) * chosen.step_time.tokens_per_s):
        return None
    return r.PastHeadroom(micro_batch_size=larger.micro_batch_size,
                          total_bytes=larger.memory_range.at(training.margin), capacity_bytes=larger.capacity_bytes,
                          headroom=training.headroom, tokens_per_s=larger.step_time.tokens_per_s,
                          chosen_tokens_per_s=chosen.step_time.tokens_per_s, flags=flags)


def _range(spec: ModelSpec, training: TrainingConfig, mem: MemoryBreakdown) -> MemoryRange:
    """The total's low / expected / high from the measured errors of this kind of estimate
    (``profiles/memory_error.json``: stack and tuning, the most specific with data; the reserved part scaled, the CUDA context
    added as it is)."""
    tuning = ("qlora" if training.quantize is not None else
              "lora" if training.lora is not None or spec.trainable_params < spec.total_params else "full")
    bounds = relative_bounds(error_table(), family=spec.model_type or "*unknown*", recipe=training.recipe.name,
                             tuning=tuning)
    return memory_range(mem.total, bounds, unmeasured=mem.outside_allocator)


def _cpu_per_node(mem: MemoryBreakdown, hardware: Hardware) -> int | None:
    return mem.cpu_bytes * hardware.gpus_per_node if mem.cpu_bytes else None

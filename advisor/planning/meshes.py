"""Device meshes beyond data parallelism: which to consider, when, and why one was chosen.

The data-parallel family (``planner.choose``) stays the default wherever it fits. Meshes (tensor,
context and hybrid-sharded data parallelism; ``advisor.mesh.ParallelDims``) are searched when
nothing in that family fits on the GPUs alone (a GPU-only mesh within the --headroom then replaces its offloading
plan, at the offload plan's samples a step: ``offload_kept``, ``searches_past_offload``, ``at_offload_samples``; the
remedies' re-plans run this step too), when the family's choice fits only past the --headroom at the micro-batch
search's smallest (a mesh within it that runs at least as fast, within ``SAME_SPEED``, replaces it: ``_replace_data_parallel``) or
waits on the network on several nodes (below ``USEFUL_MFU``, or ``EXPOSED_SHARE`` of its step in exposed
collectives: ``waits_on_network``; a mesh faster by more than ``SAME_SPEED`` replaces it, pipeline stages
searched where the other meshes are slow too),
when the global batch cannot give every GPU a sample, when the user
pins a degree (``--tp``, ``--cp``, ``--hybrid``), or under ``--policy fastest`` (a mesh wins there
only when it is faster by more than ``SAME_SPEED``). The meshes tried are the ones a practitioner
would: tp a divisor of the GPUs in a node that divides the attention and key/value heads, cp a
power of two with tp x cp inside a node that splits the sequence into 2 x cp chunks, and on several
nodes HSDP with one replica per node. Every mesh runs FSDP2 (``zero3``, torchtitan's default) on
the dp_shard x cp ranks. The 'why' names the limit that forced the mesh and what each degree buys,
in GiB per GPU and seconds per step, against the same mesh without that degree. Pipeline- and
expert-parallel meshes (pp, ep) join the search when ``advisor.planning.pipeline_meshes`` says why
(pins, nothing here fits, experts dominate, or ``--policy fastest``); the worst pipeline rank decides fit.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from advisor.estimate.activations import shape_of
from advisor.frozen import validated_copy
from advisor.hardware.cluster import Hardware
from advisor.mesh import MESH_STRATEGIES, V_SCHEDULES, ParallelDims
from advisor.model.spec import ModelSpec
from advisor.planning.pipeline_meshes import (check_pipeline_pins, expert_share, no_gpu_only_lines, pipeline_meshes,
                                              pipeline_search_reason, pipeline_summary_line, stage_line, tp_degrees,
                                              without_pp_line)
from advisor.planning import reasons as r
from advisor.planning.candidates import (Candidate, Recommendation, batch_split_problem, evaluate_candidate,
                                         waits_on_network, within_headroom)
from advisor.planning.policy import SAME_SPEED, checkpointing
from advisor.planning.render import render_alternative, render_reason
from advisor.strategies import STRATEGIES
from advisor.training import TrainingConfig


class MeshPins(BaseModel):
    """Degrees the user fixed (``--tp``, ``--cp``, ``--hybrid``); None: searched."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tp: int | None = Field(default=None, ge=1, description="Tensor-parallel degree.")
    cp: int | None = Field(default=None, ge=1, description="Context-parallel degree.")
    dp_replicate: int | None = Field(default=None, ge=1, description="HSDP replicas.")
    pp: int | None = Field(default=None, ge=1, description="Pipeline stages.")
    pp_schedule: str | None = Field(default=None, description="Pipeline schedule (advisor.mesh.PP_SCHEDULES).")
    virtual_stages: int | None = Field(default=None, ge=1, description="Model chunks per pipeline rank.")
    pp_layers: tuple[int, ...] | None = Field(default=None, description="Decoder layers per pipeline rank.")
    ep: int | None = Field(default=None, ge=1, description="Expert-parallel degree.")

    @property
    def any(self) -> bool:
        """A mesh is pinned: some degree above 1 (or a pipeline/expert option). ``--tp 1 --cp 1`` alone pins
        data parallelism, which the data-parallel family plans; each 1 still limits the mesh search."""
        return any(v is not None and v > 1 for v in (self.tp, self.cp, self.dp_replicate)) or self.pipelined

    @classmethod
    def of(cls, mesh: ParallelDims) -> "MeshPins":
        """Every degree of ``mesh`` pinned (those above 1; dp_shard is what they leave): the flags that plan it."""
        staged = mesh.pp > 1

        def above_one(degree: int) -> int | None:
            return degree if degree > 1 else None

        return cls(tp=above_one(mesh.tp), cp=above_one(mesh.cp), dp_replicate=above_one(mesh.dp_replicate),
                   pp=above_one(mesh.pp), ep=above_one(mesh.ep),
                   pp_schedule=mesh.pp_schedule if staged and mesh.pp_schedule != "1f1b" else None,
                   virtual_stages=above_one(mesh.virtual_stages) if staged and mesh.pp_schedule not in V_SCHEDULES
                   else None, pp_layers=mesh.pp_layers if staged else None)

    @property
    def flags(self) -> str:
        """The pinned degrees as the command line spells them: ``--tp 2 --pp 2``."""
        return " ".join(part for part in (self._spelled((("--tp", self.tp), ("--cp", self.cp),
                                                         ("--hybrid", self.dp_replicate))),
                                          self.pipeline_flags) if part)

    @property
    def pipeline_flags(self) -> str:
        """The pipeline and expert options alone (``--pp 2 --ep 4``), which ``enumerate_meshes`` does not plan."""
        return self._spelled((("--pp", self.pp), ("--pp-schedule", self.pp_schedule),
                              ("--virtual-stages", self.virtual_stages),
                              ("--pp-layers", ",".join(map(str, self.pp_layers)) if self.pp_layers else None),
                              ("--ep", self.ep)))

    @staticmethod
    def _spelled(pairs: tuple[tuple[str, object], ...]) -> str:
        return " ".join(f"{flag} {value}" for flag, value in pairs if value is not None)

    @property
    def pipelined(self) -> bool:
        """--pp or --ep above 1, --pp-schedule, --virtual-stages or --pp-layers given. ``--pp 1`` / ``--ep 1`` alone pin
        no pipeline: they keep the search (where it runs) to one stage / no expert split, and the data-parallel family
        is planned as without them (they said 'No mesh with --pp 1 fits' where zero3 fits)."""
        return (any(v is not None for v in (self.pp_schedule, self.virtual_stages, self.pp_layers))
                or any(v is not None and v > 1 for v in (self.pp, self.ep)))


def powers_of_two(limit: int) -> list[int]:
    return [1 << k for k in range(limit.bit_length()) if 1 << k <= limit]


_DIM_NAMES = {"tp": "tensor parallelism", "cp": "context parallelism", "dp_replicate": "replicas (HSDP)",
              "pp": "pipeline stages", "ep": "expert parallelism"}


def check_pins(spec: ModelSpec, hw: Hardware, training: TrainingConfig, pins: MeshPins) -> None:
    """ValueError (one line, naming the constraint) for pinned degrees no mesh can honour."""
    world = hw.world_size
    recipe = training.recipe
    staged = pins.pipelined and not (pins.ep and pins.ep > 1)  # --pp-schedule, --virtual-stages, --pp-layers ask for stages
    unrun = [(flag, dim) for flag, dim, asked in (
        (f"--tp {pins.tp}", "tp", (pins.tp or 1) > 1), (f"--cp {pins.cp}", "cp", (pins.cp or 1) > 1),
        (f"--hybrid {pins.dp_replicate}", "dp_replicate", (pins.dp_replicate or 1) > 1),
        (f"--pp {pins.pp}" if pins.pp else pins.pipeline_flags, "pp", (pins.pp or 1) > 1 or staged),
        (f"--ep {pins.ep}", "ep", (pins.ep or 1) > 1)) if asked and not recipe.runs_mesh_dim(dim)]
    if unrun:
        raise ValueError(f"{' '.join(flag for flag, _ in unrun)}: the {recipe.name} recipe's stack does not run "
                         f"{' or '.join(_DIM_NAMES[dim] for _, dim in unrun)} (its meshes are over "
                         f"{', '.join(recipe.mesh_dims or ())} only: profiles/recipes.json mesh_dims); --recipe "
                         "torch or torchtitan plans every degree")
    refused = [f"{flag} {degree}" for flag, degree in (("--tp", pins.tp), ("--cp", pins.cp), ("--pp", pins.pp),
                                                        ("--ep", pins.ep)) if degree is not None and degree > 1]
    if training.fsdp_version == 1 and refused:
        raise ValueError(f"{' '.join(refused)} needs FSDP2 (accelerate's parallelism_config runs tp, cp and pipelines "
                         "on fsdp_version 2 only); --fsdp-version 1 plans data parallelism, with --hybrid N at most")
    if pins.pipelined and (pins.dp_replicate or 1) > 1:
        raise ValueError(f"--hybrid {pins.dp_replicate} with {pins.pipeline_flags}: pipeline and expert meshes are "
                         "planned with FSDP2 over dp_shard only, not HSDP replicas; drop one of them")
    if pins.pipelined:
        return check_pipeline_pins(spec, hw, training, pins)
    fixed = (pins.tp or 1) * (pins.cp or 1) * (pins.dp_replicate or 1)
    if world % fixed:
        named = " x ".join(f"{flag} {degree}" for flag, degree in (
            ("--tp", pins.tp), ("--cp", pins.cp), ("--hybrid", pins.dp_replicate)) if degree and degree > 1)
        product = named if " x " not in named else f"{named} = {fixed}"
        raise ValueError(f"{product} does not divide the {world} GPUs (the pinned degrees' product must divide "
                         "the GPU count; the data-parallel shards take the rest)")
    mesh = ParallelDims(dp_replicate=pins.dp_replicate or 1, dp_shard=world // fixed, cp=pins.cp or 1,
                        tp=pins.tp or 1, world_size=world)
    from advisor.estimate.model_parallel import check_mesh_support  # mesh estimators load only for meshes

    strategy = STRATEGIES["zero3"].on(training.engine)
    check_mesh_support(spec, training, strategy, mesh)
    if mesh.cp > 1 and training.images_per_sample:
        raise ValueError(f"--cp {mesh.cp} cannot run with images: transformers' vision-language models check the "
                         "image placeholders in input_ids against the image features, and context parallelism "
                         "shards input_ids before the model; use --tp or zero3 for image batches")
    mesh.check_node(hw.gpus_per_node)
    problem = launch_rule(mesh)
    if problem:
        raise ValueError(problem)


def launch_rule(mesh: ParallelDims) -> str | None:
    """accelerate 1.15's rules for a parallelism config (``ParallelismConfig._validate`` and
    ``_validate_accelerator``): FSDP2 needs a dimension to shard over (dp_shard x cp >= 2), and TP/CP
    with replicas needs dp_shard > 1. None when ``mesh`` obeys them."""
    if mesh.dp_shard * mesh.cp == 1:
        return (f"mesh {mesh.label} leaves nothing for FSDP2 to shard (dp_shard x cp = 1): the planner's meshes "
                "shard over dp_shard x cp >= 2 (accelerate's rule; TP alone is not planned): use fewer --tp ranks "
                "or add --cp")
    if mesh.dp_replicate > 1 and mesh.dp_shard == 1 and mesh.model_parallel > 1:
        return (f"mesh {mesh.label}: accelerate cannot combine tp/cp with replicas and dp_shard 1; "
                "lower --hybrid so each replica shards over dp_shard >= 2")
    return None


def enumerate_meshes(spec: ModelSpec, hw: Hardware, training: TrainingConfig,
                     pins: MeshPins | None = None) -> list[ParallelDims]:
    """Sensible meshes for this model and cluster (module docstring), the DP-only layout excluded."""
    pins = pins or MeshPins()
    shape = shape_of(spec)
    if shape.family != "decoder" or shape.assumed or training.lora is not None or training.engine != "torch" \
            or spec.trainable_params < spec.total_params or training.activation_offload:  # offload: data parallel
        return []
    runs = training.recipe.runs_mesh_dim  # the degrees the user's stack runs (profiles/recipes.json mesh_dims)
    if any(degree is not None and degree > 1 and not runs(dim)
           for dim, degree in (("tp", pins.tp), ("cp", pins.cp), ("dp_replicate", pins.dp_replicate))):
        return []
    g, world = hw.gpus_per_node, hw.world_size
    heads, kv = shape.num_attention_heads, shape.num_kv_heads
    # FSDP1 (--fsdp-version 1, accelerate's fsdp_version: 1) runs no tp or cp: replicas (HYBRID_SHARD) at most
    tps = [1] if training.fsdp_version == 1 or not runs("tp") else tp_degrees(spec, g, heads=heads, kv_heads=kv,
                                                                               pinned=pins.tp, loss=training.loss)
    meshes = []
    for tp in tps:
        cps = [pins.cp] if pins.cp else [c for c in powers_of_two(g // tp) if training.seq_len % (2 * c) == 0
                                         and (c == 1 or training.fsdp_version == 2)]
        if (training.attention == "eager" or training.images_per_sample or not runs("cp")) and not pins.cp:
            cps = [1]  # ring attention needs SDPA, and cannot shard a VLM's input_ids (check_pins)
        for cp in cps:
            if world % (tp * cp):
                continue
            dp = world // (tp * cp)
            replicas = [pins.dp_replicate] if pins.dp_replicate else sorted({1, hw.nodes if runs("dp_replicate") else 1})
            for replicate in replicas:
                if dp % replicate or (replicate > 1 and dp // replicate == 1) or (dp // replicate) * cp == 1:
                    continue  # launch_rule: something to shard, within each replica
                mesh = ParallelDims(dp_replicate=replicate, dp_shard=dp // replicate, cp=cp, tp=tp, world_size=world)
                if mesh.is_data_parallel_only or mesh.model_parallel > g:
                    continue
                meshes.append(mesh)
    return meshes


def keeping_global_batch(training: TrainingConfig, meshes: list[ParallelDims]
                         ) -> tuple[list[ParallelDims], list[ParallelDims]]:
    """The meshes that keep the asked global batch (micro-batch x data-parallel ranks x accumulation =
    global batch: ``planner.batch_split_problem``), and those refused for it. A mesh never rounds the
    batch: with --micro-batch and --global-batch pinned, its dp degree must divide them."""
    kept = [m for m in meshes if batch_split_problem(training, m.dp) is None]
    return kept, [m for m in meshes if m not in kept]


def _batch_refusal(training: TrainingConfig, refused: list[ParallelDims], dp_blocked: str | None) -> str:
    """One line: why neither data parallelism nor any mesh tried keeps the global batch."""
    degrees = sorted({m.dp for m in refused}, reverse=True)
    micro = training.micro_batch_size
    lead = f"{dp_blocked}, nor" if dp_blocked else f"--global-batch {training.global_batch_size} is not"
    if micro is None:
        tried = f"nor divisible by the data-parallel ranks of any mesh tried (dp {', '.join(map(str, degrees))})"
        tried = tried if dp_blocked else tried.removeprefix("nor ")
        return f"{dp_blocked + ', ' if dp_blocked else lead + ' '}{tried}; change --global-batch"
    steps = ", ".join(f"dp {dp}: {micro * dp}" for dp in degrees)
    return (f"{lead} a multiple of micro-batch {micro} x the data-parallel ranks of any mesh tried ({steps} samples "
            "a micro-step); a mesh keeps the global batch or is not a candidate: change --global-batch or --micro-batch")


def evaluate_meshes(spec: ModelSpec, hw: Hardware, training: TrainingConfig, meshes: list[ParallelDims], *,
                    strategy: str | None = None) -> list[Candidate]:
    """Each mesh evaluated with FSDP2 (``strategy`` when the user named a sharded one)."""
    names = [strategy] if strategy else list(MESH_STRATEGIES[:1])
    for name in names:
        if name not in MESH_STRATEGIES:
            raise ValueError(f"--strategy {name} cannot run on a mesh: every mesh (tensor, context, pipeline, expert "
                             f"or hybrid) runs FSDP2 ({' or '.join(MESH_STRATEGIES)}) on its data-parallel ranks")
    return [evaluate_candidate(spec, hw, training, name, mesh) for mesh in meshes for name in names]


def _tokens_per_s(c: Candidate) -> float:
    return c.step_time.tokens_per_s if c.step_time is not None else 0.0


def best_mesh(candidates: list[Candidate], training: TrainingConfig | None = None) -> Candidate | None:
    """The fitting mesh with the most tokens/s; within SAME_SPEED, the fewest model-parallel ranks. Under the
    thresholds policy, meshes whose ``--margin`` end leaves ``training.headroom`` of memory free come first (as a
    strategy's checkpointing mode does: advisor.planning.candidates); the others only when none does."""
    fitting = [c for c in candidates if c.fits and c.mesh is not None and c.step_time is not None]
    if training is not None:
        fitting = [c for c in fitting if within_headroom(c, training)] or fitting
    if not fitting:
        return None
    top = max(_tokens_per_s(c) for c in fitting)
    peers = [c for c in fitting if _tokens_per_s(c) >= (1 - SAME_SPEED) * top]
    return min(peers, key=lambda c: (c.mesh.model_parallel * c.mesh.pp, c.mesh.dp_replicate, -_tokens_per_s(c)))


def forcing_limit(spec: ModelSpec, dp_candidates: list[Candidate], training: TrainingConfig,
                  world: int) -> r.Limit:
    """Which limit keeps data parallelism alone from fitting, in numbers."""
    if training.global_batch_size is not None and training.global_batch_size % world:
        return r.BatchLimit(kind="batch-indivisible", global_batch_size=training.global_batch_size, world_size=world)
    if batch_split_problem(training, world) is not None:  # --micro-batch pinned: micro x world does not divide it
        return r.BatchLimit(kind="batch-micro-steps", global_batch_size=training.global_batch_size, world_size=world,
                            micro_batch_size=training.micro_batch_size)
    sharded = [c for c in dp_candidates if c.available and c.memory_bytes is not None
               and STRATEGIES[c.strategy].on(c.engine).shard_params and c.strategy == "zero3"]
    if not sharded:
        return r.NoDataParallelFits()
    c = sharded[0]
    m = c.memory_bytes
    states = m.params + m.grads + m.optimizer
    if m.peak_moment in ("end_of_forward", "loss_backward") and m.activations + m.temporary >= states:
        kind = "activations-and-logits"
    elif m.peak_moment == "block_backward" and m.activations >= m.temporary and m.activations >= states:
        kind = "activations"
    elif m.peak_moment == "block_backward" and m.temporary >= states:
        kind = "largest-layer"
    else:
        kind = "model-states"
    return r.MemoryLimit(kind=kind, activations_bytes=m.activations, temporary_bytes=m.temporary, states_bytes=states,
                         checkpointing=checkpointing(c), total_bytes=m.total, capacity_bytes=c.capacity_bytes,
                         micro_batch_size=c.micro_batch_size, peak_moment=m.peak_moment)


def degree_effects(spec: ModelSpec, hw: Hardware, training: TrainingConfig, chosen: Candidate) -> list[r.DegreeEffect]:
    """What each degree of ``chosen.mesh`` buys: memory and step time against the same mesh with
    that degree folded back into dp_shard, at the same micro-batch and checkpointing."""
    mesh = chosen.mesh
    assert mesh is not None and chosen.memory_bytes is not None and chosen.step_time is not None
    fixed = validated_copy(training, {"micro_batch_size": chosen.micro_batch_size, "global_batch_size": None,
                                        "activation_checkpointing": chosen.checkpointing})
    total = training.global_batch_size
    lines = []
    for dim in ("pp", "ep", "tp", "cp", "dp_replicate"):
        degree = getattr(mesh, dim)
        if degree == 1:
            continue
        folded = {"pp": {"pp_layers": None, "virtual_stages": 1}, "ep": {"dp_shard": mesh.dp_shard}}.get(dim, {})
        try:
            without = validated_copy(mesh, {dim: 1, "dp_shard": mesh.dp_shard * degree, **folded})
        except ValueError:  # the mesh without this degree breaks a rule (ep no longer divides dp_shard x cp)
            continue
        # The same samples a step where --global-batch divides the mesh without the degree (its data-parallel ranks
        # grow), so seconds per step compare like with like; otherwise the two steps hold different numbers of
        # samples (no --global-batch: a micro-batch per data-parallel rank), and so does a pp step (m micro-batches):
        # compare throughput.
        same_step = total is not None and total % (chosen.micro_batch_size * without.dp) == 0
        at = validated_copy(fixed, {"global_batch_size": total}) if same_step else fixed
        other = evaluate_candidate(spec, hw, at, chosen.strategy, without if not without.is_data_parallel_only
                                   else None)
        compare = ("step" if same_step and dim != "pp" else "tokens") if other.step_time is not None else (
            "unfit" if not other.fits else "none")
        lines.append(r.DegreeEffect(
            dim=dim, degree=degree, total_bytes=chosen.memory_bytes.total, without_bytes=other.memory_bytes.total,
            compare=compare, tokens_per_s=chosen.step_time.tokens_per_s, step_s=chosen.step_time.step_s,
            without_tokens_per_s=other.step_time.tokens_per_s if other.step_time else None,
            without_step_s=other.step_time.step_s if other.step_time else None,
            micro_batch_size=chosen.micro_batch_size))
    return lines


def mesh_recommendation(spec: ModelSpec, hw: Hardware, training: TrainingConfig, chosen: Candidate, *,
                        opening: r.Reason, candidates: list[Candidate] | None = None,
                        alternatives: tuple[r.Reason, ...] = (), closing: tuple[r.Reason, ...] = ()
                        ) -> tuple[Recommendation, list[r.Reason]]:
    """The recommendation for a mesh candidate and the reasons, ``opening`` first (``closing`` after what the
    mesh's degrees buy)."""
    m = chosen.memory_bytes
    step = chosen.step_time
    why: list[r.Reason] = [opening, r.MeshFits(
        mesh_label=chosen.mesh.label, strategy=chosen.strategy, total_bytes=m.total,
        capacity_bytes=chosen.capacity_bytes, micro_batch_size=chosen.micro_batch_size,
        checkpointing=checkpointing(chosen), step_s=step.step_s, tokens_per_s=step.tokens_per_s, mfu=step.mfu)]
    why += degree_effects(spec, hw, training, chosen)
    why += [line for line in (stage_line(chosen), without_pp_line(candidates or [])) if line and chosen.stage_peaks]
    why += closing
    rec = Recommendation(candidate=chosen, reasons=tuple(why[1:]), reason=render_reason(tuple(why[1:])),
                         alternatives=tuple(render_alternative(a) for a in alternatives))
    return rec, why + list(alternatives)


def pinned_pipeline_meshes(spec: ModelSpec, hw: Hardware, training: TrainingConfig, pins: MeshPins) -> list[ParallelDims]:
    """The pipeline and expert meshes (``advisor.planning.pipeline_meshes``) with the user's pinned degrees; none under
    --hybrid, which they do not run (HSDP replicas: ``enumerate_meshes``' meshes), so the pin is never dropped."""
    if pins.dp_replicate is not None and pins.dp_replicate > 1:
        return []
    return pipeline_meshes(spec, hw, training, pp=pins.pp or (len(pins.pp_layers) if pins.pp_layers else None),
                           ep=pins.ep, schedule=pins.pp_schedule, pp_layers=pins.pp_layers,
                           virtual_stages=pins.virtual_stages, tp=pins.tp, cp=pins.cp)


def choose_with_meshes(spec: ModelSpec, hw: Hardware, training: TrainingConfig, *, dp_candidates: list[Candidate],
                       dp_choice: Recommendation | None, dp_why: list[r.Reason], pins: MeshPins,
                       strategy: str | None = None, dp_blocked: str | None = None, length_search: bool = False,
                       ) -> tuple[list[Candidate], Recommendation | None, list[r.Reason], TrainingConfig]:
    """Mesh candidates, the recommendation, the 'why' and the training config the recommendation is planned at
    (``training`` but where a GPU-only mesh replaces an offloading plan: the offload plan's samples a step,
    ``at_offload_samples``), given the data-parallel family's choice (module docstring: when meshes are searched
    and when one wins). ``length_search``: ``--seq-len max``, whose length fills the GPU by design (the plan says
    the longest within the --headroom beside it), so a GPU-only mesh that fits replaces an offload there."""
    dp_offloads = dp_choice is not None and _offloads(dp_choice)
    offloaded = None  # the data-parallel plan that runs only by offloading: a GPU-only mesh may replace it, and
    # is planned at its samples a step (under --policy fastest too, so the two compare at the same mathematics)
    if dp_offloads and not pins.any and not strategy:
        offloaded = next(c for c in dp_candidates if c.strategy == dp_choice.strategy and c.mesh is None)
    replacing = offloaded is not None and training.policy != "fastest"
    if (dp_choice is not None and not dp_offloads and not pins.any and not strategy and not length_search
            and training.policy != "fastest"):
        # the family's GPU-only choice past the --headroom (at the micro-batch search's smallest: a micro-batch asked
        # stands), or slow on several nodes: a mesh may replace it
        chosen_dp = next(c for c in dp_candidates if c.strategy == dp_choice.strategy and c.mesh is None)
        if not within_headroom(chosen_dp, training) and training.micro_batch_size is None:
            return _replace_data_parallel(spec, hw, training, chosen_dp, dp_choice, dp_why, pins)
        if within_headroom(chosen_dp, training) and waits_on_network(chosen_dp, hw.nodes):
            return _replace_data_parallel(spec, hw, training, chosen_dp, dp_choice, dp_why, pins, slow=True)
    if pins.any:
        check_pins(spec, hw, training, pins)
    elif dp_choice is not None and (training.policy != "fastest" or strategy) and not (
            replacing and searches_past_offload(spec, dp_candidates, offloaded, training)):
        return [], dp_choice, dp_why, training
    elif strategy and strategy not in MESH_STRATEGIES:  # --strategy ddp etc.: that strategy alone
        if dp_blocked:
            raise ValueError(dp_blocked)
        return [], dp_choice, dp_why, training
    planned = training if offloaded is None else at_offload_samples(training, offloaded, hw.world_size)
    meshes, refused, candidates, best, searched = _search(spec, hw, planned, pins, strategy, dp_offloads)
    own_unfit = None  # the offload plan's samples a step, where no mesh at them replaces the offload but one at its
    # own micro-batch does: those samples were the offload's micro-batch search's, not the user's (no --global-batch).
    # The rule is never to offload while a GPU-only plan fits within the user's settings; --policy fastest's, the
    # fastest plan (a mesh faster than the offload by more than SAME_SPEED)

    def replaces(found: Candidate | None, at: TrainingConfig) -> bool:
        if found is None:
            return False
        if replacing:
            return found.fits if length_search else within_headroom(found, at)
        return _tokens_per_s(found) > (1 + SAME_SPEED) * _tokens_per_s(offloaded)

    if offloaded is not None and planned is not training and not replaces(best, planned):
        own = _search(spec, hw, training, pins, strategy, dp_offloads)
        if replaces(own[3], training):
            own_unfit = planned.global_batch_size
            planned, (meshes, refused, candidates, best, searched) = training, own
    if not meshes and refused and (dp_blocked or pins.any):
        raise ValueError(_batch_refusal(training, refused, dp_blocked))
    if dp_blocked and not meshes:
        raise ValueError(dp_blocked)
    pp_lines: list[r.Reason] = []  # what the pipeline/expert search found, in numbers
    if searched is not None and best is not None and (best.mesh.pp > 1 or best.mesh.ep > 1):
        pp_lines = [r.PipelineSearched(cause=searched)]
    elif searched is not None and best is not None:
        pp_lines = [line for line in (pipeline_summary_line(candidates, searched),) if line]
    dp_why = dp_why + pp_lines
    if dp_offloads and best is None and searched is not None and not pins.any:
        return candidates, dp_choice, dp_why + no_gpu_only_lines(
            candidates, searched, samples_per_step=planned.global_batch_size if planned is not training else None
        ), training
    if replacing and best is not None:
        kept = None if length_search else offload_kept(
            spec, planned, best, offloaded, samples_per_step=planned.global_batch_size if planned is not training else None)
        if kept is not None:
            return candidates, dp_choice, dp_why + [kept], training
        dp_choice = None  # a GPU-only mesh within the headroom: never offload while one fits
    elif replacing:
        return candidates, dp_choice, dp_why, training
    if pins.any:
        rec, why = _pinned(spec, hw, training, candidates, best, pins)
    elif dp_choice is None:
        rec, why = _forced(spec, hw, planned, best, meshes, dp_candidates, dp_blocked, candidates,
                           offloaded=offloaded, samples_kept=planned is not training, own_unfit=own_unfit)
    else:
        dp_best = next(c for c in dp_candidates if c.strategy == dp_choice.strategy and c.mesh is None)
        rec, why = _faster(spec, hw, planned, best, dp_best, candidates, own_unfit=own_unfit)
        if rec is None:
            return candidates, dp_choice, dp_why + why, training
        return candidates, rec, why + pp_lines, planned
    return candidates, rec, dp_why + why, planned if rec is not None else training


def _search(spec: ModelSpec, hw: Hardware, planned: TrainingConfig, pins: MeshPins, strategy: str | None,
            dp_offloads: bool):
    """The mesh search at ``planned``: the meshes that keep its global batch and those refused for it, their
    candidates, the best (``best_mesh``) and why pipeline and expert meshes joined (None where they did not)."""
    meshes, refused = keeping_global_batch(planned, [] if pins.pipelined else enumerate_meshes(spec, hw, planned, pins))
    candidates = evaluate_meshes(spec, hw, planned, meshes, strategy=strategy)
    best = best_mesh(candidates, planned)
    closest = min((c for c in candidates if c.memory_bytes), key=lambda c: c.memory_bytes.total, default=None)
    searched = pipeline_search_reason(spec, planned, pinned=pins.pipelined, best=best, closest=closest,
                                      dp_offloads=dp_offloads, nodes=hw.nodes)
    if searched is not None:  # pipeline and expert meshes join (advisor.planning.pipeline_meshes)
        more, refused_more = keeping_global_batch(planned, pinned_pipeline_meshes(spec, hw, planned, pins))
        meshes, refused = meshes + more, refused + refused_more
        from advisor.planning.pipeline_meshes import evaluate_pipeline_meshes  # (import kept out of the header)

        candidates += evaluate_pipeline_meshes(more, lambda m: evaluate_meshes(spec, hw, planned, [m], strategy=strategy),
                                               dense=not spec.num_experts, prune=not pins.pipelined)
        best = best_mesh(candidates, planned)
    return meshes, refused, candidates, best, searched


def at_offload_samples(training: TrainingConfig, offloaded: Candidate, world: int) -> TrainingConfig:
    """The training config a mesh that may replace ``offloaded`` is planned at: the offload plan's samples a step
    (its micro-batch on each of the ``world`` GPUs), so the two are compared at the same mathematics (a tp or cp
    mesh has fewer data-parallel ranks, and at micro-batch 1 without accumulation it would step on fewer samples).
    ``training`` itself where --global-batch fixed them already or the optimizer steps in backward (no
    accumulation)."""
    if training.global_batch_size is not None or training.optimizer_in_backward:
        return training
    return validated_copy(training, {"global_batch_size": offloaded.micro_batch_size * world})


def offload_kept(spec: ModelSpec, training: TrainingConfig, best: Candidate, offloaded: Candidate, *,
                 samples_per_step: int | None = None) -> r.OffloadKeptOverMesh | None:
    """Whether a dense model's offloading plan stays (its reason) or the best GPU-only mesh replaces it (None).
    The mesh replaces it where its --margin end leaves the --headroom free, as every plan of the thresholds policy
    must (never offload while a GPU-only plan fits within the user's settings), whatever the two speeds: a slower
    mesh says so (``MeshSlowerThanOffload``). A mesh past the headroom does not replace an offload within it, however
    fast (--policy fastest takes it: the reason says so); where both are past it, the mesh replaces the offload
    unless slower by more than SAME_SPEED. Routed experts always go to the mesh (offloading them is the slowest
    plan there is)."""
    if expert_share(spec) > 0.5 or within_headroom(best, training) or offloaded.step_time is None:
        return None
    mesh_rate, offload_rate = _tokens_per_s(best), offloaded.step_time.tokens_per_s
    if not within_headroom(offloaded, training) and mesh_rate >= (1 - SAME_SPEED) * offload_rate:
        return None
    return r.OffloadKeptOverMesh(mesh_label=best.mesh.label, total_bytes=best.memory_range.at(training.margin),
                                 capacity_bytes=best.capacity_bytes, headroom=training.headroom,
                                 tokens_per_s=mesh_rate, offload_strategy=offloaded.strategy,
                                 offload_tokens_per_s=offload_rate,
                                 fastest_takes_mesh=mesh_rate > (1 + SAME_SPEED) * offload_rate,
                                 samples_per_step=samples_per_step)


def searches_past_offload(spec: ModelSpec, dp_candidates: list[Candidate], offloaded: Candidate,
                          training: TrainingConfig) -> bool:
    """Whether a GPU-only mesh might replace ``offloaded`` (``offload_kept``): routed experts always search; a dense
    model where a mesh could fit within the room that rule leaves (the --headroom where the offload is within it).
    Every mesh runs FSDP2 over all the GPUs (tp shards a tensor, dp_shard x cp its rows; a pipeline stage holds its
    layers' share), so each GPU holds at least zero3's optimizer step: its shard of the states and the step's
    temporaries. Where that moment of zero3 alone (its total at the --margin end, scaled by the moment's share of the
    peak) exceeds the room, no mesh can replace the offload, and none is searched: the search would add a third to
    the plan's time for no answer (the README's first command: zero3's foreach step alone needs 79.6 of 79.2 GiB)."""
    if expert_share(spec) > 0.5:
        return True
    zero3 = next((c for c in dp_candidates if c.strategy == "zero3" and c.mesh is None and c.memory_bytes), None)
    if zero3 is None or zero3.memory_range is None:
        return True
    step, peak = zero3.memory_bytes.at_optimizer_step, zero3.memory_bytes.peak_allocated
    if step is None or not peak:
        return True
    room = (1 - training.headroom) if within_headroom(offloaded, training) else 1.0
    return zero3.memory_range.at(training.margin) * step / peak <= room * zero3.capacity_bytes


def _pinned(spec: ModelSpec, hw: Hardware, training: TrainingConfig, candidates: list[Candidate],
            best: Candidate | None, pins: MeshPins) -> tuple[Recommendation | None, list[r.Reason]]:
    if best is None:
        closest = min((c for c in candidates if c.memory_bytes), key=lambda c: c.memory_bytes.total, default=None)
        if closest is None:
            return None, [r.NoPinnedMeshFits()]
        return None, [r.NoPinnedMeshFits(mesh_label=closest.mesh.label, total_bytes=closest.memory_bytes.total,
                                         micro_batch_size=closest.micro_batch_size)]
    return mesh_recommendation(spec, hw, training, best, opening=r.PinnedDegrees(flags=_pins_flags(pins)),
                               candidates=candidates)


def tried_dimensions(meshes: list[ParallelDims]) -> tuple[str, ...]:
    """The parallel dimensions ``meshes`` take past 1, named as the plan's text names them."""
    names = (("tp", "tp"), ("cp", "cp"), ("dp_replicate", "HSDP"), ("pp", "pp"), ("ep", "ep"))
    return tuple(shown for dim, shown in names if any(getattr(mesh, dim) > 1 for mesh in meshes))


def _forced(spec: ModelSpec, hw: Hardware, training: TrainingConfig, best: Candidate | None,
            meshes: list[ParallelDims], dp_candidates: list[Candidate],
            dp_blocked: str | None, candidates: list[Candidate] | None = None, *,
            offloaded: Candidate | None = None, samples_kept: bool = False, own_unfit: int | None = None
            ) -> tuple[Recommendation | None, list[r.Reason]]:
    """Nothing in the data-parallel family runs on the GPUs alone (``offloaded``: the plan that runs it only by
    offloading to the CPU; ``samples_kept``: ``training`` holds its samples a step, ``at_offload_samples``;
    ``own_unfit``: those samples, where no mesh fits within the headroom at them and the mesh steps on its own): the
    best mesh, the limit that forced it, and where the mesh is slower than the offload, by how much."""
    if best is None:
        none_ran = bool(candidates) and not any(c.available for c in candidates)  # FSDP2 cannot run the job here
        return None, ([r.NoMeshFits(num_tried=len(meshes), images=bool(training.images_per_sample),
                                    tried=tried_dimensions(meshes), unavailable=none_ran)] if meshes else [])
    limit = forcing_limit(spec, [] if dp_blocked else dp_candidates, training, hw.world_size)
    step = offloaded.step_time if offloaded is not None else None
    opening = r.DataParallelCannot(limit=limit) if step is None else r.DataParallelCannot(
        limit=limit, offload_strategy=offloaded.strategy, offload_tokens_per_s=step.tokens_per_s,
        samples_per_step=training.global_batch_size if samples_kept else None, offload_samples_unfit=own_unfit,
        mesh_samples_per_step=best.micro_batch_size * best.mesh.dp if own_unfit is not None else None)
    slower = ()
    if step is not None and _tokens_per_s(best) < (1 - SAME_SPEED) * step.tokens_per_s:
        fastest = best_mesh(candidates or [])  # what --policy fastest compares with the offload (no headroom)
        takes = fastest is not None and _tokens_per_s(fastest) > (1 + SAME_SPEED) * step.tokens_per_s
        slower = (r.MeshSlowerThanOffload(mesh_label=best.mesh.label, tokens_per_s=_tokens_per_s(best),
                                          offload_strategy=offloaded.strategy, offload_tokens_per_s=step.tokens_per_s,
                                          fastest_mesh_label=fastest.mesh.label if takes else None),)
    return mesh_recommendation(spec, hw, training, best, candidates=candidates, opening=opening, closing=slower)


def _timing(c: Candidate) -> r.MeshTiming:
    return r.MeshTiming(total_bytes=c.memory_bytes.total, step_s=c.step_time.step_s,
                        micro_batch_size=c.micro_batch_size, tokens_per_s=c.step_time.tokens_per_s,
                        exposed_communication_s=c.step_time.exposed_communication_s, checkpointing=checkpointing(c))


def _faster(spec: ModelSpec, hw: Hardware, training: TrainingConfig, best: Candidate | None,
            dp_best: Candidate, candidates: list[Candidate] | None = None, *, own_unfit: int | None = None
            ) -> tuple[Recommendation | None, list[r.Reason]]:
    """``--policy fastest`` with a data-parallel choice: the mesh when faster by more than SAME_SPEED
    (its recommendation and the why, the DP choice side by side), else None and one line. ``own_unfit``: the offload
    plan's samples a step, at which no mesh was faster (the mesh steps on its own)."""
    if best is None or _tokens_per_s(best) <= (1 + SAME_SPEED) * _tokens_per_s(dp_best):
        return None, ([] if best is None else [r.MeshNotFaster(
            mesh_label=best.mesh.label, tokens_per_s=_tokens_per_s(best), dp_tokens_per_s=_tokens_per_s(dp_best),
            same_speed=SAME_SPEED)])
    opening = r.FastestMesh(mesh_label=best.mesh.label, dp_strategy=dp_best.strategy, mesh=_timing(best),
                            dp=_timing(dp_best), offload_samples_unfit=own_unfit,
                            mesh_samples_per_step=best.micro_batch_size * best.mesh.dp if own_unfit else None)
    b = dp_best.step_time
    alternative = r.DataParallelAlsoFits(strategy=dp_best.strategy, world_size=hw.world_size,
                                         total_bytes=dp_best.memory_bytes.total, step_s=b.step_s,
                                         micro_batch_size=dp_best.micro_batch_size, tokens_per_s=b.tokens_per_s)
    return mesh_recommendation(spec, hw, training, best, opening=opening, candidates=candidates,
                               alternatives=(alternative,))


def _replace_data_parallel(spec: ModelSpec, hw: Hardware, training: TrainingConfig, dp_best: Candidate,
             dp_choice: Recommendation, dp_why: list[r.Reason], pins: MeshPins, *, slow: bool = False,
             ) -> tuple[list[Candidate], Recommendation | None, list[r.Reason], TrainingConfig]:
    """The data-parallel family's GPU-only choice (``dp_best``) either fits only past the --headroom (a long sequence at
    micro-batch 1, within the estimate's error of an out-of-memory failure), or, ``slow``, waits on the network on
    several nodes (``candidates.waits_on_network``). The mesh search's best at its samples a step (else, past the
    headroom only, at its own micro-batch) replaces it where that mesh leaves the headroom free and runs at least as fast, within SAME_SPEED (past
    the headroom: Llama-3.1-8B at 32,768 tokens on 8 x H100, zero3 at 99%, cp 8 at 69% and 1.29x), or faster by more
    than SAME_SPEED (slow: Llama-3.1-70B on 4 x 8 H100 over 100 Gb/s Ethernet, zero3 at MFU 9%, pipeline stages across
    the nodes at 3.3x; the search adds pipelines where its best tp/cp/HSDP mesh is slow too: ``pipeline_search_reason``).
    Otherwise the choice stands, and the mesh candidates are not listed (the remedies name a degree that helps).
    ``pins``: degrees of 1 the user fixed (``--cp 1``), which the search keeps."""
    bar = (1 + SAME_SPEED) if slow else (1 - SAME_SPEED)

    def better(found: Candidate | None, at: TrainingConfig) -> bool:
        return found is not None and within_headroom(found, at) and _tokens_per_s(found) >= bar * _tokens_per_s(dp_best)

    planned = at_offload_samples(training, dp_best, hw.world_size)
    meshes, refused, candidates, best, searched = _search(spec, hw, planned, pins, None, False)
    own_samples = None
    # a slow plan is compared at its own samples a step only: a mesh on more of them is faster by the batch (its
    # collectives amortised over more samples), which --global-batch gives data parallelism too
    if not better(best, planned) and planned is not training and not slow:
        own = _search(spec, hw, training, pins, None, False)
        if better(own[3], training):
            own_samples, planned, (meshes, refused, candidates, best, searched) = (
                planned.global_batch_size, training, own)
    if not better(best, planned):
        return [], dp_choice, dp_why, training
    mesh_samples = best.micro_batch_size * best.mesh.dp * (best.gradient_accumulation_steps or 1) if own_samples else None
    if slow:
        opening: r.Reason = r.MeshOverSlowDataParallel(
            mesh_label=best.mesh.label, dp_strategy=dp_best.strategy, mesh=_timing(best), dp=_timing(dp_best),
            nodes=hw.nodes, dp_mfu=dp_best.step_time.mfu, capacity_bytes=dp_best.capacity_bytes)
    else:
        opening = r.MeshWithinHeadroom(mesh_label=best.mesh.label, dp_strategy=dp_best.strategy, mesh=_timing(best),
                                       dp=_timing(dp_best), capacity_bytes=dp_best.capacity_bytes,
                                       headroom=training.headroom, dp_samples_unfit=own_samples,
                                       mesh_samples_per_step=mesh_samples)
    step = dp_best.step_time
    alternative = r.DataParallelAlsoFits(strategy=dp_best.strategy, world_size=hw.world_size,
                                         total_bytes=dp_best.memory_bytes.total, step_s=step.step_s,
                                         micro_batch_size=dp_best.micro_batch_size, tokens_per_s=step.tokens_per_s)
    pp_lines = [r.PipelineSearched(cause=searched)] if searched is not None and (best.mesh.pp > 1 or best.mesh.ep > 1) \
        else []
    rec, why = mesh_recommendation(spec, hw, planned, best, opening=opening, candidates=candidates,
                                   alternatives=(alternative,))
    # the family's own checkpointing lines are about its plan, not the mesh's (which says its own)
    family = [x for x in dp_why if x.kind not in ("checkpointing-on", "checkpointing-headroom")]
    return candidates, rec, family + pp_lines + why, planned  # the opening just before the mesh's fit: the headline


def _offloads(rec: Recommendation) -> bool:
    return STRATEGIES[rec.strategy].on(rec.engine).offloads


def _pins_flags(pins: MeshPins) -> tuple[tuple[str, str], ...]:
    return tuple((flag, str(value)) for flag, value in (("tp", pins.tp), ("cp", pins.cp), ("hybrid", pins.dp_replicate),
                                                      ("pp", pins.pp), ("pp-schedule", pins.pp_schedule),
                                                      ("virtual-stages", pins.virtual_stages),
                                                      ("pp-layers", ",".join(map(str, pins.pp_layers or ())) or None),
                                                      ("ep", pins.ep))
             if value is not None)

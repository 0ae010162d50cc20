"""Pipeline- and expert-parallel meshes: when the search adds them, which, and the 'why' lines.

``advisor.planning.meshes`` searches DP x TP x CP (+HSDP) first. Meshes with pp and/or ep join when
one of these holds (``pipeline_search_reason``, which names it): the user pinned --pp or --ep; no
mesh of tp, cp and HSDP fits (TP and CP stay inside a node, so this is also the case where TP would
have to cross nodes); routed experts hold most of an MoE model's parameters and data parallelism
alone offloads or fails; or ``--policy fastest``. The meshes tried are the ones a practitioner
would (torchtitan's layout): pp a power of two outermost, at most 16 and with at least two layers a
rank, layers split evenly or, where pp does not divide them, whole layers (whole chunks) with the
extra ones on the middle ranks; tp every degree that divides the node's width and the heads; cp 1;
ep for MoE models the largest power of two dividing the experts and dp_shard x cp inside a node with
tp, and the largest overall; the schedules ``wrap_pipeline`` runs with torch.distributed.pipelining's
classes: 1F1B, and interleaved 1F1B with two chunks a rank where pp x 2 divides the layers
(``wrap_pipeline`` splits several chunks a rank evenly only; the other schedules when pinned).
FSDP2 (zero3) shards the rest. Not searched: cp with pp (``wrap_pipeline`` builds no cp inside a stage).

``evaluate_pipeline_meshes`` skips the meshes another one tried shows cannot fit, so that the search
for 405B on 1024 GPUs stays under 100 ms (``benchmarks/pipeline_speed.py``): an interleaved mesh
whose 1F1B twin (same degrees) does not fit, since it keeps more micro-batches in flight on rank 0
(2 (p - 1) + (v - 1) p + 1 chunks of 1/v, at least p rank micro-batches) with the same parameters;
for a dense model, a narrower tp once a wider one at the same pp and schedule does not fit, since the
stage a pipeline rank holds unsharded from its first backward on (FSDP2 under
torch.distributed.pipelining, ``advisor.estimate.pipeline``) and its activations grow as 1/tp.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import ValidationError

from advisor.estimate.activations import shape_of
from advisor.hardware.cluster import Hardware
from advisor.mesh import ParallelDims, split_layers
from advisor.model.block_kinds import kind_of
from advisor.model.bundled import load_tensor_parallel
from advisor.model.spec import ModelSpec
from advisor.planning import reasons as r
from advisor.planning.candidates import Candidate, waits_on_network
from advisor.strategies import STRATEGIES
from advisor.training import TrainingConfig

if TYPE_CHECKING:
    from advisor.planning.meshes import MeshPins

MAX_PP = 16
SEARCHED_SCHEDULES = ("1f1b", "interleaved_1f1b")  # torch.distributed.pipelining classes wrap_pipeline runs
SEARCHED_VIRTUAL_STAGES = 2  # chunks a rank under the searched interleaved schedule


def expert_share(spec: ModelSpec) -> float:
    """Share of the parameters in routed experts (0 for a dense model)."""
    if not spec.num_experts or not spec.expert_params or not spec.num_sparse_layers:
        return 0.0
    return spec.num_sparse_layers * spec.num_experts * spec.expert_params / spec.total_params


def pipeline_search_reason(spec: ModelSpec, training: TrainingConfig, *, pinned: bool, best: Candidate | None,
                           closest: Candidate | None, dp_offloads: bool, nodes: int = 1) -> r.SearchCause | None:
    """Why pp/ep meshes are searched (with its numbers), or None when they are not. On several ``nodes`` a best mesh
    that waits on the network (``candidates.waits_on_network``) has them searched too: a pipeline sends a stage's
    activations between nodes where FSDP and TP send weights and gradients (405B on 16 x 8 H100 over Ethernet)."""
    if pinned:
        return r.SearchCause(kind="pinned")
    share = expert_share(spec)
    if share > 0.5:
        return r.SearchCause(kind="experts", expert_share=share, num_params=spec.total_params)
    if best is None:
        if closest is None or closest.memory_bytes is None:
            return r.SearchCause(kind="no-mesh-tried")
        return r.SearchCause(kind="no-mesh-fits", mesh_label=closest.mesh.label,
                             total_bytes=closest.memory_bytes.total, capacity_bytes=closest.capacity_bytes)
    if training.policy == "fastest":
        return r.SearchCause(kind="policy-fastest")
    if waits_on_network(best, nodes):
        return r.SearchCause(kind="low-mfu", mesh_label=best.mesh.label, mfu=best.step_time.mfu)
    return None


def _eps(spec: ModelSpec, shard: int, tp: int, g: int) -> list[int]:
    experts = spec.num_experts or 0
    if not experts:
        return [1]
    fitting = [e for e in (1 << k for k in range(1, experts.bit_length())) if experts % e == 0 and shard % e == 0]
    if not fitting:
        return [1]
    inside = [e for e in fitting if e * tp <= g]
    return sorted(({max(inside)} if inside else set()) | {max(fitting)})


def tp_degrees(spec: ModelSpec, gpus_per_node: int, *, heads: int, kv_heads: int, pinned: int | None,
               loss: str = "hf") -> list[int]:
    """The tp degrees a mesh search tries: the pinned one, else every divisor of the node's width that divides
    the heads and key/value heads; only 1 for a family whose transformers TP plan has styles wrap() cannot
    apply (``profiles/tensor_parallel.json`` unsupported_tp_styles; ``check_mesh_support`` says which), or whose
    head tp splits by vocabulary under ``--loss fused``, whose kernel refuses it (``model_parallel.vocab_parallel``:
    a search that met such a mesh ended the plan with that refusal)."""
    if pinned:
        return [pinned]
    if spec.model_type in load_tensor_parallel().unsupported_tp_styles:
        return [1]
    if loss == "fused":
        from advisor.estimate.model_parallel import vocab_parallel  # (loaded with the mesh estimators)

        if vocab_parallel(spec):
            return [1]
    return [t for t in range(1, gpus_per_node + 1) if gpus_per_node % t == 0 and heads % t == 0 and kv_heads % t == 0]


def pipeline_meshes(spec: ModelSpec, hw: Hardware, training: TrainingConfig, *, pp: int | None = None,
                    ep: int | None = None, schedule: str | None = None, virtual_stages: int | None = None,
                    pp_layers: tuple[int, ...] | None = None, tp: int | None = None,
                    cp: int | None = None) -> list[ParallelDims]:
    """Meshes with pp > 1 or ep > 1 (module docstring); pinned degrees fix their dimension."""
    shape = shape_of(spec)
    if shape.family != "decoder" or shape.assumed or training.lora is not None or training.engine != "torch" \
            or spec.trainable_params < spec.total_params or not kind_of(spec).pipelines or spec.head is not None \
            or training.activation_offload or training.fsdp_version == 1:  # offload, FSDP1: data parallelism alone
        return []  # a Jamba stack's stages (their Mamba / attention / MoE blocks), a task head's last stage: not modelled
    runs = training.recipe.runs_mesh_dim  # the degrees the user's stack runs (profiles/recipes.json mesh_dims)
    if (not runs("pp") and not runs("ep")) or any(degree is not None and degree > 1 and not runs(dim) for dim, degree in
                                                  (("pp", pp), ("ep", ep), ("tp", tp), ("cp", cp))):
        return []
    g, world, layers = hw.gpus_per_node, hw.world_size, shape.num_layers
    heads, kv = shape.num_attention_heads, shape.num_kv_heads
    tps = tp_degrees(spec, g, heads=heads, kv_heads=kv, pinned=tp, loss=training.loss) if runs("tp") else [1]
    # --pp-schedule or --virtual-stages without --pp asks for a pipeline: no expert-only (pp 1) mesh, which has neither
    unpipelined = [] if schedule or virtual_stages else [1]
    pps = [pp] if pp else unpipelined + [q for q in (1 << k for k in range(1, 5))
                                         if q <= MAX_PP and 2 * q <= layers and runs("pp")]
    schedules = [schedule] if schedule else list(SEARCHED_SCHEDULES)  # the others when pinned (--pp-schedule)
    cp = cp or 1
    meshes: list[ParallelDims] = []
    for t in tps:
        for q in pps:
            if world % (q * t * cp):
                continue
            shard = world // (q * t * cp)
            for name in schedules if q > 1 else ["1f1b"]:
                searched_v = SEARCHED_VIRTUAL_STAGES if name == "interleaved_1f1b" and not schedule else 1
                v = virtual_stages or (2 if name in ("zbv", "dualpipev") else searched_v)
                chunks = 2 if name in ("zbv", "dualpipev") else v
                if searched_v > 1 and not virtual_stages and layers % (q * v):
                    continue  # wrap_pipeline splits several stages a rank evenly only
                split = pp_layers or (split_layers(layers, q, chunks) if q > 1 else None)
                if q > 1 and split is None and layers % (q * chunks):
                    continue
                for e in ([ep] if ep else _eps(spec, shard * cp, t, g) if runs("ep") else [1]):
                    if q == 1 and e == 1 or (shard * cp) % e:
                        continue
                    meshes.append(ParallelDims(pp=q, pp_schedule=name, virtual_stages=v, pp_layers=split, ep=e,
                                               dp_shard=shard, cp=cp, tp=t, world_size=world))
    return meshes


def evaluate_pipeline_meshes(meshes: list[ParallelDims], evaluate: Callable[[ParallelDims], list[Candidate]], *,
                             dense: bool, prune: bool = True) -> list[Candidate]:
    """``evaluate`` each mesh but those a mesh already evaluated shows cannot fit (module docstring); the
    candidates in the order of ``meshes``. ``prune=False`` (pinned degrees): every mesh."""
    order = sorted(range(len(meshes)), key=lambda i: (meshes[i].pp_schedule != "1f1b", -meshes[i].tp))
    done: dict[int, list[Candidate]] = {}
    misfit_1f1b: set[tuple] = set()  # degrees whose 1F1B mesh does not fit
    misfit_tp: dict[tuple, int] = {}  # (pp, schedule, cp) -> the widest tp that does not fit
    for i in order:
        m = meshes[i]
        degrees, group = (m.pp, m.ep, m.dp_replicate, m.dp_shard, m.cp, m.tp), (m.pp, m.pp_schedule, m.cp)
        dominated = (m.pp_schedule != "1f1b" and degrees in misfit_1f1b) or (dense and m.tp < misfit_tp.get(group, 0))
        if prune and m.pp > 1 and dominated:
            fits = False  # it does not fit: what dominates it does not (and the meshes it dominates do not either)
        else:
            done[i] = evaluate(m)
            fits = any(c.fits for c in done[i])
        if not fits:
            if m.pp_schedule == "1f1b":
                misfit_1f1b.add(degrees)
            misfit_tp[group] = max(misfit_tp.get(group, 0), m.tp)
    return [c for i in sorted(done) for c in done[i]]


def stage_line(c: Candidate) -> r.StagePeaks | None:
    """Each pipeline rank's peak, for a pipeline candidate."""
    if not c.stage_peaks or len(c.stage_peaks) < 2:  # ep alone: one stage, its peak is the plan's
        return None
    return r.StagePeaks(peaks_bytes=c.stage_peaks)


def without_pp_line(candidates: list[Candidate]) -> r.WithoutPipeline | None:
    """The best mesh without pp/ep, beside a pipeline choice."""
    plain = [c for c in candidates if c.mesh is not None and c.mesh.pp == 1 and c.mesh.ep == 1
             and c.memory_bytes is not None]
    if not plain:
        return None
    fitting = [c for c in plain if c.fits and c.step_time is not None]
    if fitting:
        best = max(fitting, key=lambda c: c.step_time.tokens_per_s)
        return r.WithoutPipeline(mesh_label=best.mesh.label, total_bytes=best.memory_bytes.total, fits=True,
                                 step_s=best.step_time.step_s, tokens_per_s=best.step_time.tokens_per_s)
    closest = min(plain, key=lambda c: c.memory_bytes.total)
    return r.WithoutPipeline(mesh_label=closest.mesh.label, total_bytes=closest.memory_bytes.total, fits=False)


def pipeline_summary_line(candidates: list[Candidate], searched: r.SearchCause) -> r.PipelineSummary | None:
    """Pipeline/expert meshes were searched and none chosen: the best of them, in numbers."""
    staged = [c for c in candidates if c.mesh is not None and (c.mesh.pp > 1 or c.mesh.ep > 1)
              and c.memory_bytes is not None]
    if not staged:
        return None
    fitting = [c for c in staged if c.fits and c.step_time is not None]
    if fitting:
        c = max(fitting, key=lambda c: c.step_time.tokens_per_s)
        return r.PipelineSummary(cause=searched, mesh_label=c.mesh.label, total_bytes=c.memory_bytes.total, fits=True,
                                 step_s=c.step_time.step_s, tokens_per_s=c.step_time.tokens_per_s)
    c = min(staged, key=lambda c: c.memory_bytes.total)
    worst = max(range(len(c.stage_peaks or (0,))), key=lambda i: (c.stage_peaks or (0,))[i])
    return r.PipelineSummary(cause=searched, mesh_label=c.mesh.label, total_bytes=c.memory_bytes.total, fits=False,
                             worst_rank=worst, capacity_bytes=c.capacity_bytes)


def check_pipeline_pins(spec: ModelSpec, hw: Hardware, training: TrainingConfig, pins: MeshPins) -> None:
    """--pp / --pp-schedule / --virtual-stages / --ep: ValueError naming the constraint."""
    if not kind_of(spec).pipelines:
        raise ValueError("--pp / --ep: pipeline and expert parallelism of a hybrid Mamba-attention stack (Jamba) are "
                         "not modelled; plan it with --tp, --cp or the data-parallel strategies")
    if spec.head is not None and (pins.pp or pins.pp_layers):
        raise ValueError(f"--pp: the last pipeline stage of a {spec.head.task} head (its loss in flight per "
                         "micro-batch) is not modelled; plan it with --tp, --cp or the data-parallel strategies")
    world, pp, ep = hw.world_size, pins.pp or (len(pins.pp_layers) if pins.pp_layers else 1), pins.ep or 1
    try:  # pp against the layers and ep against the experts first: they hold whatever the GPUs
        ParallelDims(pp=pp, pp_schedule=pins.pp_schedule or "1f1b", virtual_stages=pins.virtual_stages or 1,
                     pp_layers=pins.pp_layers, dp_shard=ep, ep=ep, world_size=pp * ep).check_layers(
            num_layers=spec.num_layers, num_experts=spec.num_experts)
    except ValidationError as err:
        raise ValueError(err.errors()[0]["msg"].removeprefix("Value error, ")) from None
    fixed = pp * (pins.tp or 1) * (pins.cp or 1) * (pins.dp_replicate or 1)
    if world % fixed:
        raise ValueError(f"pp {pp} x tp {pins.tp or 1} x cp {pins.cp or 1} x dp_replicate {pins.dp_replicate or 1} = "
                         f"{fixed} does not divide the {world} GPUs")
    try:
        mesh = ParallelDims(pp=pp, pp_schedule=pins.pp_schedule or "1f1b", virtual_stages=pins.virtual_stages or 1,
                            pp_layers=pins.pp_layers, dp_replicate=pins.dp_replicate or 1, dp_shard=world // fixed,
                            cp=pins.cp or 1, tp=pins.tp or 1, world_size=world)
        mesh = ParallelDims.model_validate({**dict(mesh), "ep": ep})
    except ValidationError as err:
        raise ValueError(err.errors()[0]["msg"].removeprefix("Value error, ")) from None
    from advisor.estimate.model_parallel import check_mesh_support  # mesh estimators load only for meshes

    check_mesh_support(spec, training, STRATEGIES["zero3"].on(training.engine), mesh)
    mesh.check_node(hw.gpus_per_node)


def no_gpu_only_lines(candidates: list[Candidate], searched: r.SearchCause, *,
                      samples_per_step: int | None = None) -> list[r.NoGpuOnlyMesh]:
    """Why no GPU-only mesh replaces the offloading choice, in numbers (``samples_per_step``: the offload plan's,
    at which the meshes were planned)."""
    tried = [c for c in candidates if c.memory_bytes is not None and c.mesh is not None]
    if not tried:
        return []
    c = min(tried, key=lambda c: (c.memory_bytes.total, c.mesh.ep == 1))
    m = c.memory_bytes
    return [r.NoGpuOnlyMesh(cause=searched, mesh_label=c.mesh.label, total_bytes=m.total,
                            capacity_bytes=c.capacity_bytes, micro_batch_size=c.micro_batch_size,
                            states_bytes=m.states_total, samples_per_step=samples_per_step)]

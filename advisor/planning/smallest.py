"""When nothing fits: the fewest GPUs of this kind that would.

Counts are any number up to one server (the GPU's ``default_gpus_per_node``), whole servers beyond.
Per-GPU memory of a sharded strategy falls as GPUs are added, so whether one fits is monotone in the
count and a bisection finds the first count that fits (an exponential search over whole nodes bounds
it first): the answer is the smallest count that fits, not the next power of two.
"""

from __future__ import annotations

from typing import Callable

from pydantic import BaseModel, ConfigDict, Field, computed_field

from advisor.frozen import validated_copy
from advisor.hardware.cluster import Hardware, resize
from advisor.mesh import ParallelDims
from advisor.model.spec import ModelSpec
from advisor.planning import reasons as r
from advisor.planning.candidates import evaluate_candidate
from advisor.planning.render import render
from advisor.strategies import STRATEGIES, StrategyName
from advisor.training import TrainingConfig


class SmallestFit(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    num_gpus: int | None = Field(description="Fewest GPUs of this kind that fit; None: no count does.")
    strategy: StrategyName | None = None
    mesh: ParallelDims | None = Field(default=None, description="The mesh it fits on; None: data parallelism alone.")
    reason: r.SmallestFitFound | r.NoCountFits = Field(exclude=True, description="The answer as a reason "
                                                       "(the plan's last 'why').")

    @computed_field
    @property
    def message(self) -> str:
        """The reason's sentence (JSON: 'message')."""
        return render(self.reason)


def server_size(hardware: Hardware) -> int:
    """GPUs per node when counting up: the cluster's own nodes when it has several, else a full server."""
    if hardware.nodes > 1:
        return hardware.gpu.default_gpus_per_node
    return max(hardware.gpus_per_node, hardware.gpu.default_gpus_per_node)


def at_count(hardware: Hardware, count: int, per_node: int) -> Hardware:
    """``hardware`` resized to ``count`` GPUs: one node up to ``per_node``, whole nodes beyond."""
    nodes, per = (1, count) if count <= per_node else (-(-count // per_node), per_node)
    return resize(hardware, nodes=nodes, gpus_per_node=per)


def smallest_count(fits_at: Callable[[int], bool], *, above: int, per_node: int, max_nodes: int = 2**14) -> int | None:
    """The fewest GPUs, more than ``above``, for which the monotone test ``fits_at`` holds: any count up to
    ``per_node``, whole nodes beyond; None when not even ``max_nodes`` nodes do."""
    within = list(range(above + 1, per_node + 1))
    if within and fits_at(within[-1]):
        lo, hi = 0, len(within) - 1  # within[hi] fits
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits_at(within[mid]) else (mid + 1, hi)
        return within[lo]
    low = max(1, above // per_node)  # node counts up to `low` do not fit (or are not above)
    high = low + 1
    while not fits_at(high * per_node):
        low, high = high, high * 2
        if high > max_nodes:
            return None
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if fits_at(mid * per_node) else (mid, high)
    return high * per_node


def unfit_subject(plan) -> tuple[str, str]:
    """What did not fit in a plan with no recommendation, for its one-line headline and export's refusal:
    ``("ddp does not fit", " at micro-batch 64")`` where something fits the plan's own GPUs (the strategy or the
    micro-batch was fixed), ``("no mesh with --pp 2 --tp 2 fits", "")`` where pinned mesh degrees were,
    ``("nothing fits", "")`` otherwise."""
    fit = plan.smallest_fit
    if fit is None or not getattr(fit.reason, "current", False):
        return "nothing fits", ""
    if fit.reason.without is not None:  # pinned mesh degrees: they are what did not fit
        return f"no mesh with {fit.reason.without} fits", ""
    asked = list(dict.fromkeys(c.strategy for c in plan.candidates))
    micro = plan.training.micro_batch_size
    return (f"{asked[0]} does not fit" if len(asked) == 1 else "nothing fits",
            f" at micro-batch {micro}" if micro is not None else "")


def smallest_fit(spec: ModelSpec, hardware: Hardware, training: TrainingConfig,
                 strategies: tuple[StrategyName, ...] = ("zero3", "zero3_offload"),
                 meshes: Callable[[Hardware], list[ParallelDims]] | None = None, *,
                 from_current: bool = False, pinned: str | None = None) -> SmallestFit:
    """The fewest GPUs of this kind on which a sharded strategy fits at micro-batch 1; with ``meshes``
    (``advisor.planning.meshes.enumerate_meshes`` at a cluster), on one of those meshes when that is fewer.
    ``from_current``: the plan's own count is a candidate too (a pinned strategy or mesh did not fit, so the
    others were not tried on these GPUs). ``pinned``: the mesh degrees the user fixed (``--pp 2 --tp 2``),
    which ``meshes`` keep and a data-parallel answer drops: its sentence says so."""
    relaxed = validated_copy(training, {"micro_batch_size": 1, "global_batch_size": None})
    per_node = server_size(hardware)
    found = []
    for order, name in enumerate(strategies):
        # the plan's own GPUs as they are (nodes and all): a count search would resize them
        if from_current and evaluate_candidate(spec, hardware, relaxed, name).fits:
            found.append((hardware.world_size, order, name))
            continue
        count = smallest_count(lambda n: evaluate_candidate(spec, at_count(hardware, n, per_node), relaxed, name).fits,
                               above=hardware.world_size, per_node=per_node)
        if count is not None:
            found.append((count, order, name))
    if meshes is not None:  # a mesh only matters below the data-parallel answer: counts below it, in order
        from advisor.estimate.model_parallel import check_mesh_support  # mesh estimators load only for meshes

        impl = STRATEGIES["zero3"].on(training.engine)

        def runs(mesh: ParallelDims) -> bool:
            """The job can run on ``mesh`` (a tp mesh refuses --loss fused, for one): the search skips the rest."""
            try:
                check_mesh_support(spec, relaxed, impl, mesh)
            except ValueError:
                return False
            return True

        limit = min((count for count, _, _ in found), default=None)
        counts = [*range(hardware.world_size + 1, per_node + 1), *(per_node * 2**k for k in range(1, 15))]
        for count in (c for c in counts if c > hardware.world_size and (limit is None or c < limit)):
            cluster = at_count(hardware, count, per_node)
            fitting = next((m for m in meshes(cluster)
                            if runs(m) and evaluate_candidate(spec, cluster, relaxed, "zero3", m).fits), None)
            if fitting is not None:
                return SmallestFit(num_gpus=count, strategy="zero3", mesh=fitting, reason=r.SmallestFitFound(
                    num_gpus=count, gpu=hardware.gpu.name, strategy="zero3", mesh_label=fitting.label))
    if found:
        count, _, name = min(found)
        # an offloading answer also names the fewest GPUs that hold the job without offload, when some do
        def offloads(strategy: StrategyName) -> bool:
            return STRATEGIES[strategy].on(training.engine).offloads

        gpu_only = min((c for c, _, n in found if not offloads(n)), default=None)
        return SmallestFit(num_gpus=count, strategy=name,
                           reason=r.SmallestFitFound(num_gpus=count, gpu=hardware.gpu.name, strategy=name,
                                                     current=count == hardware.world_size,
                                                     gpu_only_gpus=gpu_only if offloads(name) else None,
                                                     without=pinned))
    remedies = ["shorten --seq-len"]
    if training.images_per_sample:
        remedies.append("use fewer or smaller images")
    if training.activation_checkpointing == "off":
        remedies.append("enable checkpointing (--activation-checkpointing on)")
    return SmallestFit(num_gpus=None, reason=r.NoCountFits(
        checkpointing_tried=training.activation_checkpointing != "off", hints=tuple(remedies)))

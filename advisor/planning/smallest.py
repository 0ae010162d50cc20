"""When nothing fits: the fewest GPUs of this kind that would.

Counts are any number up to one server (the GPU's ``default_gpus_per_node``), whole servers beyond.
Per-GPU memory of a sharded strategy falls as GPUs are added, so whether one fits is monotone in the
count and a bisection finds the first count that fits (an exponential search over whole nodes bounds
it first): the answer is the smallest count that fits, not the next power of two.
"""

from __future__ import annotations

from typing import Callable

from pydantic import BaseModel, ConfigDict, Field, computed_field

from advisor.calibration import allocator_overhead
from advisor.frozen import validated_copy
from advisor.units import GIB
from advisor.hardware.cluster import Hardware, resize
from advisor.mesh import ParallelDims
from advisor.model.spec import ModelSpec
from advisor.planning import reasons as r
from advisor.planning.candidates import evaluate_candidate
from advisor.planning.render import render
from advisor.strategies import STRATEGIES, StrategyName
from advisor.training import MAX_MICRO_BATCH, TrainingConfig


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


# Whole-node counts beyond doubling that a search under --global-batch also tries, up to this many nodes: those whose
# GPUs are a divisor of it times a power of two (3 nodes of 8 for --global-batch 3: dp 3 x cp 8; 6 nodes: pp 16 x dp 3).
MAX_DIVIDING_NODES = 64


def counts_above(above: int, per_node: int, *, every: bool = True, divides: int | None = None) -> list[int]:
    """The GPU counts a search tries past ``above``: within a node every count (``every``), else the powers of two
    (the degrees tp and cp take), then whole nodes doubling, up to 2**14 nodes, and (``divides``: --global-batch)
    the node counts up to ``MAX_DIVIDING_NODES`` that divide it."""
    within = range(above + 1, per_node + 1) if every else (n for n in (1 << k for k in range(per_node.bit_length()))
                                                           if above < n <= per_node)
    nodes = {per_node * 2**k for k in range(1, 15)}
    if divides is not None:  # a mesh's GPUs are its data-parallel ranks (a divisor) times powers of two (tp, cp, pp)
        nodes |= {count for d in _divisors(divides) for count in (d << k for k in range(15))
                  if count % per_node == 0 and per_node < count <= MAX_DIVIDING_NODES * per_node}
    return [*within, *sorted(n for n in nodes if n > above)]


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


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
    if low >= max_nodes:  # already the most nodes a cluster may have
        return None
    high = low + 1
    while not fits_at(high * per_node):
        if high >= max_nodes:
            return None
        low, high = high, min(high * 2, max_nodes)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if fits_at(mid * per_node) else (mid, high)
    return high * per_node


class NothingFits(ValueError):
    """A command that needs a plan (export, launch) got none, or --seq-len max found no length that fits: nothing
    fits. The CLI exits 3 on it, as plan does."""


def unfit_subject(plan) -> tuple[str, str]:
    """What did not fit in a plan with no recommendation, for its one-line headline and export's refusal:
    ``("ddp does not fit", " at micro-batch 64")`` where something fits the plan's own GPUs (the strategy or the
    micro-batch was fixed), ``("no mesh with --pp 2 --tp 2 fits", "")`` where what fits them drops pinned
    degrees, ``("nothing fits", "")`` otherwise."""
    fit = plan.smallest_fit
    if fit is None or not getattr(fit.reason, "current", False):
        return "nothing fits", ""
    micro = plan.training.micro_batch_size
    at = f" at micro-batch {micro}" if micro is not None else ""
    asked = list(dict.fromkeys(c.strategy for c in plan.candidates))
    if fit.reason.without is not None:  # pinned degrees: they are what did not fit
        return (f"{asked[0] + ' with' if len(asked) == 1 else 'no mesh with'} {fit.reason.pinned} "
                f"{'does not fit' if len(asked) == 1 else 'fits'}", at)
    return (f"{asked[0]} does not fit" if len(asked) == 1 else "nothing fits", at)


def _reserve_held_back(training: TrainingConfig) -> float | None:
    """A --reserve-gib the user raised above the calibrated allocator constant: part of why nothing fits."""
    default = allocator_overhead().allocator_constant_gib
    given = "reserve_gib" in training.model_fields_set and training.reserve_gib > default
    return training.reserve_gib if given else None


def smallest_fit(spec: ModelSpec, hardware: Hardware, training: TrainingConfig,
                 strategies: tuple[StrategyName, ...] = ("zero3", "zero3_offload"),
                 meshes: Callable[[Hardware], list[ParallelDims]] | None = None, *,
                 from_current: bool = False, pinned: str | None = None,
                 pinned_pipeline: str | None = None, meshes_here: bool = False,
                 multiple_of: int | None = None) -> SmallestFit:
    """The fewest GPUs of this kind on which a sharded strategy fits at micro-batch 1; with ``meshes``
    (``advisor.planning.meshes.enumerate_meshes`` at a cluster), on one of those meshes when that is fewer;
    an offloading answer also names the fewest GPUs that hold the job without offload, on a mesh where that
    is fewer. ``from_current``: the plan's own count is a candidate too (a pinned strategy or mesh did not
    fit, so the others were not tried on these GPUs). ``pinned``: the degrees the user fixed (``--pp 2 --tp
    2``), which a data-parallel answer drops and the meshes keep but for ``pinned_pipeline`` (``--pp 2``:
    ``enumerate_meshes`` plans no pipeline); with them the meshes are tried on the plan's own GPUs too, and the
    answer's sentence says what it drops. With --global-batch, a count (a mesh's data-parallel ranks) must divide it,
    and the fit is judged at it: micro-batch 1 with the rest accumulated, else the whole batch at once (where
    accumulation holds gradients, as the Trainer's FSDP does, the latter can need less), the sentence naming which;
    where no count does, the same search without it (these GPUs too: ``meshes_here``, a mesh on the plan's own count)
    says whether --global-batch is the limit. ``multiple_of``: the pinned degrees' product, whose multiples in whole
    nodes (up to ``MAX_DIVIDING_NODES``) are tried too where no power of two is one (``--pp 5``)."""
    relaxed = validated_copy(training, {"micro_batch_size": 1, "global_batch_size": None})
    per_node = server_size(hardware)
    total = training.global_batch_size  # a count (a mesh's data-parallel ranks) must divide it: the run keeps it
    kept = relaxed if total is None else validated_copy(relaxed, {"global_batch_size": total})

    def at(ranks: int) -> TrainingConfig:  # the run at --global-batch where the ranks divide it
        return kept if total is not None and total % ranks == 0 else relaxed

    def micro_fitting(cluster: Hardware, name: StrategyName, ranks: int, mesh: ParallelDims | None = None
                      ) -> int | None:
        """The micro-batch ``name`` fits at on ``cluster`` (``ranks`` data-parallel ranks): 1, else (--global-batch
        kept) the whole batch at once; None where neither fits."""
        if evaluate_candidate(spec, cluster, at(ranks), name, mesh).fits:
            return 1
        whole = total // ranks if total is not None and total % ranks == 0 else 1
        if 1 < whole <= MAX_MICRO_BATCH and evaluate_candidate(
                spec, cluster, validated_copy(kept, {"micro_batch_size": whole}), name, mesh).fits:
            return whole
        return None

    def offloads(strategy: StrategyName) -> bool:
        return STRATEGIES[strategy].on(training.engine).offloads

    def keeps(ranks: int) -> bool:
        return total is None or total % ranks == 0

    found = []
    for order, name in enumerate(strategies):
        # the plan's own GPUs as they are (nodes and all): a count search would resize them
        if (from_current and keeps(hardware.world_size)
                and micro_fitting(hardware, name, hardware.world_size) is not None):
            found.append((hardware.world_size, order, name))
            continue

        def fits(n: int) -> bool:
            return micro_fitting(at_count(hardware, n, per_node), name, n) is not None

        count = smallest_count(fits, above=hardware.world_size, per_node=per_node)
        if count is not None and not keeps(count):  # the next count that divides --global-batch (and fits)
            count = next((n for n in counts_above(count, per_node, divides=total) if keeps(n) and fits(n)), None)
        if count is not None:
            found.append((count, order, name))
    gpu_only = min((c for c, _, n in found if not offloads(n)), default=None)
    on_mesh: tuple[int, ParallelDims] | None = None
    if meshes is not None:  # a mesh only matters below the data-parallel answer on the GPUs alone: counts below it
        from advisor.estimate.model_parallel import check_mesh_support  # mesh estimators load only for meshes

        impl = STRATEGIES["zero3"].on(training.engine)

        def runs(mesh: ParallelDims) -> bool:
            """The job can run on ``mesh`` (a tp mesh refuses --loss fused, for one): the search skips the rest."""
            try:
                check_mesh_support(spec, relaxed, impl, mesh)
            except ValueError:
                return False
            return True

        first = hardware.world_size + (0 if (pinned is not None or meshes_here) and from_current else 1)
        counts = counts_above(first - 1, per_node, divides=total)
        if multiple_of is not None and multiple_of & (multiple_of - 1):  # pinned degrees no power of two divides
            counts = sorted({*counts, *(per_node * k for k in range(1, MAX_DIVIDING_NODES + 1)
                                        if per_node * k >= first and per_node * k % multiple_of == 0)})
        if pinned is not None and gpu_only is not None:  # the count zero3 alone needs: does a pinned mesh fit it?
            counts = sorted({*counts, gpu_only})
        # pinned degrees: a mesh that keeps them wins a tie with data parallelism, which drops them
        for count in (c for c in counts if c >= first and (gpu_only is None or c < gpu_only
                                                           or (pinned is not None and c == gpu_only))):
            cluster = hardware if count == hardware.world_size else at_count(hardware, count, per_node)
            fitting = next((m for m in meshes(cluster) if keeps(m.dp) and runs(m)
                            and m.model_parallel <= cluster.gpus_per_node  # tp x cp inside a node (check_node)
                            and micro_fitting(cluster, "zero3", m.dp, m) is not None), None)
            if fitting is not None:
                on_mesh = (count, fitting)
                break
    best = min(found, default=None)
    if on_mesh is not None and (best is None or on_mesh[0] < best[0] or (
            on_mesh[0] == best[0] and (pinned is not None or offloads(best[2])))):  # a tie: the GPUs alone
        count, mesh = on_mesh
        staged = mesh if mesh.pp > 1 or mesh.ep > 1 else None  # a pipeline or expert mesh keeps --pp / --ep
        cluster = hardware if count == hardware.world_size else at_count(hardware, count, per_node)
        return SmallestFit(num_gpus=count, strategy="zero3", mesh=mesh, reason=r.SmallestFitFound(
            num_gpus=count, gpu=hardware.gpu.name, strategy="zero3", mesh_label=mesh.label,
            current=count == hardware.world_size, without=pinned_pipeline if staged is None else None,
            pinned=pinned if pinned_pipeline and staged is None else None,
            micro_batch_size=micro_fitting(cluster, "zero3", mesh.dp, mesh) or 1))
    if best is not None:
        count, _, name = best
        gpu_only_mesh = gpu_only_micro = None
        if on_mesh is not None and offloads(name):  # fewer GPUs than zero3 alone hold it on a mesh
            gpu_only, gpu_only_mesh = on_mesh[0], on_mesh[1].label
            gpu_only_micro = micro_fitting(at_count(hardware, gpu_only, per_node), "zero3", on_mesh[1].dp, on_mesh[1])
        elif gpu_only is not None and offloads(name):
            gpu_only_micro = micro_fitting(at_count(hardware, gpu_only, per_node), "zero3", gpu_only)
        cluster = hardware if count == hardware.world_size else at_count(hardware, count, per_node)
        return SmallestFit(num_gpus=count, strategy=name,
                           reason=r.SmallestFitFound(num_gpus=count, gpu=hardware.gpu.name, strategy=name,
                                                     current=count == hardware.world_size,
                                                     micro_batch_size=micro_fitting(cluster, name, count) or 1,
                                                     gpu_only_gpus=gpu_only if offloads(name) else None,
                                                     gpu_only_mesh=gpu_only_mesh, without=pinned, pinned=pinned,
                                                     gpu_only_micro_batch=gpu_only_micro))
    sharding = evaluate_candidate(spec, hardware, relaxed, "zero3")
    if not sharding.available:  # no count helps: the strategies left replicate the model on every GPU
        return SmallestFit(num_gpus=None, reason=r.NoCountFits(
            checkpointing_tried=training.activation_checkpointing != "off", hints=(),
            sharding_unavailable=sharding.unavailable_reason))
    remedies = ["shorten --seq-len"]
    bucket = _oversized_bucket(training, hardware)
    if bucket is not None:  # the user's own DeepSpeed size, not the sample, is what no GPU holds
        remedies.insert(0, f"lower DeepSpeed's {bucket[0]}")
    held_back = _reserve_held_back(training)
    if held_back is not None:
        remedies.insert(0, "lower --reserve-gib")
    if training.images_per_sample:
        remedies.append("use fewer or smaller images")
    if training.activation_checkpointing == "off":
        remedies.append("enable checkpointing (--activation-checkpointing on)")
    if pinned is not None:  # the meshes searched kept the pins; others (more tp or cp) were not tried
        remedies.append(f"change or drop {pinned}")
    unbatched = None  # --global-batch is the limit where the search without it finds a count
    if total is not None:
        unbatched = smallest_fit(spec, hardware, validated_copy(training, {"global_batch_size": None}), strategies,
                                 meshes, from_current=True, pinned=pinned, pinned_pipeline=pinned_pipeline,
                                 meshes_here=True, multiple_of=multiple_of)  # these GPUs too: without the batch they may fit
        unbatched = unbatched.reason if unbatched.num_gpus is not None and unbatched.reason.without is None else None
        # (an answer that drops pinned degrees is not this command without --global-batch)
    return SmallestFit(num_gpus=None, reason=r.NoCountFits(
        global_batch_size=total if unbatched is not None else None, without_batch=unbatched,
        above=hardware.world_size if unbatched is not None else None,
        max_nodes=MAX_DIVIDING_NODES if unbatched is not None else None,
        checkpointing_tried=training.activation_checkpointing != "off", hints=tuple(remedies), pinned=pinned,
        reserve_gib=held_back, left_bytes=None if held_back is None else hardware.gpu.memory_bytes - int(
            (held_back + training.context_gib_at(hardware.world_size, hardware.gpu.name)) * GIB),
        kept=(pinned.replace(pinned_pipeline, "").strip() or None) if pinned and pinned_pipeline else pinned,
        bucket=None if bucket is None else bucket[0], bucket_bytes=None if bucket is None else bucket[1]))


def _oversized_bucket(training: TrainingConfig, hardware: Hardware) -> tuple[str, int] | None:
    """The DeepSpeed size the user's config set (``training.zero``: reduce, all-gather or prefetch bucket, or the
    live-parameter cap) whose one buffer, in the 16-bit compute dtype, fills half a GPU or more: ``(name, bytes)``
    of the largest, else None."""
    zero = training.zero
    if zero is None or training.engine != "deepspeed":
        return None
    sizes = {name: getattr(zero, name) for name in ("reduce_bucket_size", "allgather_bucket_size",
                                                     "stage3_prefetch_bucket_size", "stage3_max_live_parameters")}
    name, elements = max(((n, e) for n, e in sizes.items() if e), key=lambda item: item[1], default=(None, 0))
    return (name, 2 * elements) if name is not None and 2 * elements >= hardware.gpu.memory_bytes // 2 else None

"""Remedies: what would change a plan that offloads, does not fit, or runs below a useful MFU.

Each remedy is one changed knob, re-planned with the planner's own estimate (``evaluate_candidate`` and
``choose``), never a guessed factor: the GiB it saves on the reference candidate (the size default
when it does not fit, else the chosen plan) at the same micro-batch and checkpointing, and the step
time and tokens/s of the plan the change leads to. Changes that keep the mathematics (optimizer
implementation, SDPA for eager attention, loss kernel, selective checkpointing, micro-batch with gradient accumulation, FSDP's gradient
sync every micro-batch where the stack holds unsharded gradients until the last, activation offloading,
hybrid sharding, more GPUs of this kind) are listed before those that change it (8-bit optimizer, LoRA, pure
bf16, a shorter sequence). Rendering belongs to the CLI; the reason that names the best remedy when
the plan offloads is built here from the same numbers (``offload_line``, rendered by ``advisor.planning.render``).

Cost is bounded: a re-plan evaluates the four GPU-only strategies, and the two offload ones only when
none of those fits or under --policy fastest, then the planner's mesh step where the planner searches meshes (an offloading answer within
reach of a mesh, routed experts, --policy fastest); the sequence search and the GPU-count search are bisections on
one strategy.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from advisor.estimate.accumulation import accumulates_unsharded
from advisor.estimate.activations import shape_of
from advisor.frozen import validated_copy
from advisor.hardware.cluster import Hardware
from advisor.mesh import MESH_STRATEGIES, ParallelDims
from advisor.model.attention_support import runs_eager_by_default
from advisor.model.lora import LoraConfig, with_lora
from advisor.model.spec import ModelSpec
from advisor.planning import reasons as r
from advisor.planning.candidates import (ADAFACTOR_ON_FSDP2, USEFUL_MFU, Candidate, Remedy, evaluate_candidate,
                                         largest_fitting, samples_per_step, within_headroom)
from advisor.planning.meshes import (MeshPins, best_mesh, choose_with_meshes, enumerate_meshes, evaluate_meshes,
                                     keeping_global_batch, powers_of_two)
from advisor.planning.policy import SAME_SPEED, choose, choose_fastest, default_strategy, offloads
from advisor.planning.render import MIN_SAVED_GIB, remedy_basis, remedy_line, remedy_sections  # noqa: F401 (callbacks read them here)
from advisor.planning.smallest import at_count, counts_above, server_size, smallest_count
from advisor.strategies import STRATEGIES, StrategyName
from advisor.training import TrainingConfig
from advisor.units import GIB

LORA_RANK = 16  # PEFT's examples and the README's use the rank 16 most often
# More GPUs of this kind is a remedy up to this many times the user's count; beyond it (2,712 L4s for a 70B model on 4)
# it is another job, and the remedies on the user's own GPUs (LoRA, an 8-bit optimizer, ...) are the advice
MORE_GPUS_AT_MOST = 8
# Knobs that act on memory alone: when one saves nothing on the reference it cannot change the plan.
MEMORY_KNOBS = {"loss", "activation_checkpointing", "activation_offload"}
GPU_ONLY: tuple[StrategyName, ...] = ("ddp", "zero1", "zero2", "zero3")
OFFLOAD: tuple[StrategyName, ...] = ("zero2_offload", "zero3_offload")


class _Change(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    keeps_math: bool
    update: dict[str, Any] = {}
    spec: ModelSpec | None = None
    hardware: Hardware | None = None
    mesh: ParallelDims | None = None
    pins: MeshPins | None = None  # a pinned degree: the plan is the mesh search's best under it, as --cp N gives


def remedy_reason(spec: ModelSpec, candidates: list[Candidate], chosen: Candidate | None, *,
                  world: int = 0, training: TrainingConfig | None = None) -> str | None:
    """Why remedies are listed (None: the plan needs none): no fit, offload, the size default unfit, a plan
    past the --headroom (even at the micro-batch it was given or 1), or a low MFU."""
    default = next((c for c in candidates if c.strategy == default_strategy(spec, world=world)[0] and c.mesh is None),
                   None)
    if chosen is None:
        return "nothing fits"
    if offloads(chosen):
        return "offload"
    if default is not None and not default.fits:
        return "size default does not fit"
    if training is not None and not within_headroom(chosen, training):
        return "past headroom"
    if chosen.step_time is not None and chosen.step_time.mfu < USEFUL_MFU:
        return "low MFU"
    return None


def find_remedies(spec: ModelSpec, hw: Hardware, training: TrainingConfig, candidates: list[Candidate],
                  chosen: Candidate | None, *, pins: MeshPins | None = None) -> tuple[Remedy, ...]:
    """The remedies that help, ranked: those that keep the mathematics first; within each group the ones
    that fit on the GPUs alone, then the most tokens/s. ``pins``: degrees of 1 the user fixed (``--tp 1``), which
    limit the mesh search of every re-plan as they limit the plan's."""
    reason = remedy_reason(spec, candidates, chosen, world=hw.world_size, training=training)
    if reason is None:
        return ()
    default = next((c for c in candidates if c.strategy == default_strategy(spec, world=hw.world_size)[0]
                    and c.mesh is None), None)
    stack = stack_changes(training, default)  # the size default runs on another stack: measured on the plan
    ref = chosen if default is None or stack or (default.fits and chosen is not None) else default
    if ref is None or not ref.available or ref.memory_bytes is None:
        return ()
    on_gpu_now = chosen is not None and not offloads(chosen)
    current = chosen.step_time.tokens_per_s if chosen is not None and chosen.step_time else 0.0
    found = []
    # the step's samples are the recommended plan's (--global-batch, else its micro-batch on each data-parallel
    # rank), which a remedy that keeps the mathematics keeps: a cp mesh has fewer data-parallel ranks and names the
    # --global-batch that does
    plan = chosen or ref
    samples = training.global_batch_size or samples_per_step(plan, hw.world_size)
    for change in [*stack, *_changes(spec, hw, training, ref, reason, samples=samples, pins=pins)]:
        applied = _apply(spec, hw, training, ref, change, pins=pins, samples=samples)
        if applied is None:
            continue
        remedy, roomy = applied
        # more GPUs help only where they run on the GPUs alone faster than the plan: a plan on the GPUs alone scaled to
        # their count (a forced mesh at 85% on 4 H100s was offered 24 at 0.8x its tokens/s a GPU), an offloading one
        # in all (on 2 x 8 H100s over Ethernet it was offered 24 at 0.74x; 70B QLoRA on 2 RTX 4090s gets 4 at 1.8x)
        scale = change.hardware.world_size / hw.world_size if change.hardware is not None and on_gpu_now else 1
        helps = _helps(remedy, on_gpu_now=on_gpu_now or change.hardware is not None, current=current * scale)
        if roomy if reason == "past headroom" else helps:
            found.append(remedy)  # past the headroom: only what brings the plan back within it
    # One context-parallel degree: the one whose plan runs fastest (the smallest among equals).
    degrees = [x for x in found if x.name.startswith("--cp ")]
    if len(degrees) > 1:
        best = max(degrees, key=lambda x: (x.fits, x.tokens_per_s or 0))
        found = [x for x in found if x is best or not x.name.startswith("--cp ")]
    # A plan on the GPUs alone within the headroom comes first in its group. An expert tries what the same GPUs allow
    # before asking for more of them: more GPUs rank after the remedies of their group whose plan runs on the user's
    # GPUs alone within the headroom, whatever the tokens/s (70B on 8 MI300X at 100%: --optimizer-impl fused at 88%
    # and 0.96x before 16 of them), and a plan that runs slower than this one (more GPUs on a mesh can: 405B on twice
    # the H100s at 0.6x) after those that run at least as fast; of the changes to the mathematics, the smaller first
    # (``_changes``' order: an 8-bit optimizer state before LoRA, which changes what trains), then tokens/s.
    order = {r.name: i for i, r in enumerate(found)}
    return tuple(sorted(found, key=lambda r: (not r.keeps_math, not (r.fits and not r.past_headroom),
                                              r.name.startswith("--gpus"), not _roomy_at(r, current * (1 - SAME_SPEED)),
                                              0 if r.keeps_math else order[r.name], -(r.tokens_per_s or 0),
                                              -r.saved_gib)))


def _roomy_at(remedy: Remedy, speed: float) -> bool:
    """The remedy's plan runs on the GPUs alone, within the --headroom (one at 99.9% of the GPU ranks with the rest),
    at ``speed`` tokens/s or more."""
    return remedy.fits and not remedy.past_headroom and (remedy.tokens_per_s or 0) >= speed


def _helps(remedy: Remedy, *, on_gpu_now: bool, current: float) -> bool:
    if remedy.fits and not on_gpu_now:
        return True
    faster = remedy.tokens_per_s is not None and remedy.tokens_per_s > current * (1 + SAME_SPEED)
    return faster and (remedy.fits or not on_gpu_now)


def _apply(spec: ModelSpec, hw: Hardware, training: TrainingConfig, ref: Candidate,
           change: _Change, *, pins: MeshPins | None = None, samples: int | None = None) -> tuple[Remedy, bool] | None:
    """Re-plan with one change: the saving on ``ref`` (same micro-batch and checkpointing) and the new plan, and
    whether that plan leaves the --headroom free. More GPUs are measured on the size default of their count
    where ``ref`` is the size default of this one (one GPU's plain model becomes full sharding on several).
    ``samples``: the plan's samples a step, named beside the re-plan's where no --global-batch fixes them (the user's,
    or the remedy's own) and the re-plan steps on others (its own micro-batch search's, or a mesh's fewer data-parallel
    ranks): its s/step is then for that many samples."""
    new_spec, new_hw = change.spec or spec, change.hardware or hw
    measured = ref.strategy
    if change.hardware is not None and ref.strategy == default_strategy(spec, world=hw.world_size)[0]:
        measured = default_strategy(new_spec, world=new_hw.world_size)[0]
    # The same micro-batches a step where they still divide the global batch: accumulation holds gradients
    # (advisor.estimate.accumulation), so the saving is measured with the reference's own.
    dp = change.mesh.dp if change.mesh is not None else new_hw.world_size
    total = training.global_batch_size
    kept = total if total is not None and total % (ref.micro_batch_size * dp) == 0 else None
    try:  # a change the training config refuses with the user's other settings (--lora under --float8) is none
        changed = validated_copy(training, change.update)
        pinned = validated_copy(training, {"micro_batch_size": ref.micro_batch_size, "global_batch_size": kept,
                                             "activation_checkpointing": ref.checkpointing or "off",
                                             **{k: v for k, v in change.update.items() if k != "global_batch_size"}})
        searched = None
        if change.pins is not None:  # what the planner runs with that degree pinned (its mesh search) beside the
            # degrees the user fixed; the saving is measured on the mesh it picks
            own = {k: v for k, v in change.pins if v is not None}
            searched = _best_searched_mesh(new_spec, new_hw, changed, validated_copy(pins or MeshPins(), own))
        # the saving on the reference's own mesh where the change names none on the same GPUs (a mesh plan's remedies)
        on = searched.mesh if searched is not None else change.mesh if change.mesh is not None or \
            change.hardware is not None else ref.mesh
        same = evaluate_candidate(new_spec, new_hw, pinned, measured, on)
    except ValueError:  # or the mesh estimators refuse this model (a size alone: no attention heads known)
        return None
    if same.memory_bytes is None:
        return None
    saved = (ref.memory_bytes.total - same.memory_bytes.total) / GIB
    if saved < MIN_SAVED_GIB and change.hardware is None and change.mesh is None and change.update.keys() <= MEMORY_KNOBS:
        return None  # a memory knob that saves nothing at the reference's peak: no re-plan (it bounds the cost)
    if change.pins is not None and change.hardware is None:  # a pinned degree: the mesh search's best under it
        result = searched
    elif change.mesh is not None:  # hybrid sharding: the mesh candidate is the plan
        result = evaluate_candidate(new_spec, new_hw, changed, ref.strategy, change.mesh)
        result = result if result.fits else None
    else:
        result = replan(new_spec, new_hw, changed, pins)
    own_samples = None  # the re-plan's samples a step where no --global-batch fixes them and they are not the plan's
    if result is not None and samples is not None and changed.global_batch_size is None:
        ran = samples_per_step(result, new_hw.world_size)
        own_samples = ran if ran != samples else None
    step = result.step_time if result is not None else None
    fits = result is not None and not offloads(result)
    roomy = fits and within_headroom(result, changed)
    return Remedy(name=change.name, keeps_math=change.keeps_math, saved_gib=round(saved, 2), reference=ref.strategy,
                  strategy=result.strategy if result is not None else None,
                  mesh=result.mesh.label if result is not None and result.mesh is not None and (
                      change.pins is not None or change.mesh is None) else None,
                  total_gib=round(result.memory_bytes.total / GIB, 2) if result is not None and
                  result.memory_bytes is not None else None,
                  step_s=step.step_s if step else None, tokens_per_s=step.tokens_per_s if step else None,
                  fits=fits, own_samples=own_samples, plan_samples=samples if own_samples is not None else None,
                  past_headroom=fits and not roomy), roomy


def _best_searched_mesh(spec: ModelSpec, hw: Hardware, training: TrainingConfig, pins: MeshPins | None = None, *,
                        strategy: str | None = None) -> Candidate | None:
    """The mesh search's best plan, as the planner runs it (the meshes that keep the global batch; ``pins`` fixed,
    ``strategy`` a pinned sharded one); None where no mesh fits."""
    meshes, _ = keeping_global_batch(training, enumerate_meshes(spec, hw, training, pins))
    return best_mesh(evaluate_meshes(spec, hw, training, meshes, strategy=strategy), training)


def replan(spec: ModelSpec, hw: Hardware, training: TrainingConfig, pins: MeshPins | None = None) -> Candidate | None:
    """The planner's choice, by the planner's own two steps: the data-parallel family's (``replan_data_parallel``'s
    candidates and rule), then ``advisor.planning.meshes.choose_with_meshes`` (a GPU-only mesh in place of an offload,
    routed experts' meshes, ``--policy fastest``'s faster mesh). ``pins``: the degrees of 1 the user fixed."""
    candidates = _data_parallel(spec, hw, training)
    rec = _recommended(spec, hw, training, candidates)
    if rec is None:
        return None
    try:
        meshes, rec, _, _ = choose_with_meshes(spec, hw, training, dp_candidates=candidates, dp_choice=rec, dp_why=[],
                                               pins=pins or MeshPins())
    except ValueError:  # the mesh estimators refuse this model (a size alone: no attention heads known)
        return next(c for c in candidates if c.strategy == rec.strategy)
    return next(c for c in [*candidates, *meshes] if c.strategy == rec.strategy and c.mesh == rec.mesh)


def replan_data_parallel(spec: ModelSpec, hw: Hardware, training: TrainingConfig) -> Candidate | None:
    """The data-parallel family's choice (under the config's policy) over the GPU-only strategies, and the offload
    ones only when none of those fits."""
    candidates = _data_parallel(spec, hw, training)
    rec = _recommended(spec, hw, training, candidates)
    return None if rec is None else next(c for c in candidates if c.strategy == rec.strategy)


def _data_parallel(spec: ModelSpec, hw: Hardware, training: TrainingConfig) -> list[Candidate]:
    """The GPU-only strategies, and the offload ones where none of those fits or under --policy fastest (which takes
    an offload that runs faster, as the planner's own does)."""
    candidates = [evaluate_candidate(spec, hw, training, name) for name in GPU_ONLY]
    if training.policy == "fastest" or not any(c.fits for c in candidates):
        candidates += [evaluate_candidate(spec, hw, training, name) for name in OFFLOAD]
    return candidates


def _recommended(spec: ModelSpec, hw: Hardware, training: TrainingConfig, candidates: list[Candidate]):
    if training.policy == "fastest":
        return choose_fastest(spec, candidates, global_batch_size=training.global_batch_size, world=hw.world_size)[0]
    return choose(spec, candidates, headroom=training.headroom, margin=training.margin, world=hw.world_size)[0]


def pinned_remedies(spec: ModelSpec, hw: Hardware, training: TrainingConfig, pinned: Candidate) -> list[r.RemedyFits]:
    """``--strategy X`` that does not fit on these GPUs: the changes under which X itself fits here, the three best
    ranked as ``find_remedies`` ranks them (those that keep the mathematics first, then the most tokens/s). More
    GPUs and other strategies are the count search's answer (``advisor.planning.smallest``), meshes the pins'."""
    if not pinned.available or pinned.memory_bytes is None:
        return []
    found = []
    for change in _changes(spec, hw, training, pinned, "nothing fits", more_gpus=False):
        if change.hardware is not None or change.mesh is not None or change.pins is not None:
            continue
        try:  # a change the training config refuses with the user's other settings is none
            changed = validated_copy(training, change.update)
            cand = evaluate_candidate(change.spec or spec, hw, changed, pinned.strategy)
            if not cand.fits and pinned.strategy in MESH_STRATEGIES:  # as the plan does: a sharded strategy on a mesh
                cand = _best_searched_mesh(change.spec or spec, hw, changed, strategy=pinned.strategy) or cand
        except ValueError:
            continue
        if cand.fits and cand.step_time is not None:
            found.append(r.RemedyFits(remedy=change.name, keeps_math=change.keeps_math, strategy=cand.strategy,
                                      fits=not offloads(cand), step_s=cand.step_time.step_s,
                                      tokens_per_s=cand.step_time.tokens_per_s,
                                      mesh=cand.mesh.label if cand.mesh is not None else None))
    return sorted(found, key=lambda x: (not x.keeps_math, not x.fits, -x.tokens_per_s))[:3]


def _changes(spec: ModelSpec, hw: Hardware, training: TrainingConfig, ref: Candidate, reason: str, *,
             more_gpus: bool = True, samples: int | None = None, pins: MeshPins | None = None) -> list[_Change]:
    memory_bound = reason != "low MFU"
    keep = [*optimizer_impl_changes(training)]
    if training.loss == "hf" and shape_of(spec).vocab_size and not spec.loss_kernel_refusal:
        keep += [_Change(name=f"--loss {kernel}", keeps_math=True, update={"loss": kernel})
                 for kernel in ("chunked", "fused")]
    if training.attention == "eager" and spec.num_attention_heads and not runs_eager_by_default(spec.architecture):
        # the b x heads x s x s scores gone (SDPA's fused kernels), the same attention
        keep.append(_Change(name="--attention sdpa", keeps_math=True, update={"attention": "sdpa"}))
    if training.activation_checkpointing in ("on", "off"):
        keep.append(_Change(name="--activation-checkpointing selective", keeps_math=True,
                            update={"activation_checkpointing": "selective"}))
    if training.micro_batch_size is not None and training.micro_batch_size > 1:
        accumulation = (training.global_batch_size or training.micro_batch_size * hw.world_size) // hw.world_size
        keep.append(_Change(name=f"--micro-batch 1 --global-batch {accumulation * hw.world_size}", keeps_math=True,
                            update={"micro_batch_size": 1, "global_batch_size": accumulation * hw.world_size}))
    total = training.global_batch_size
    if (accumulates_unsharded(training, STRATEGIES[ref.strategy].on(training.engine)) and total is not None
            and total // (ref.micro_batch_size * hw.world_size) > 1):
        # FSDP reduce-scatters every micro-batch: the rank's fp32 shards held, not the unsharded gradients
        keep.append(_Change(name="--accumulation-sync every_micro_batch", keeps_math=True,
                            update={"accumulation_sync": "every_micro_batch"}))
    holds_activations = ref.memory_bytes is not None and ref.memory_bytes.peak_moment not in (
        "optimizer_step", "end_of_backward")  # a peak with no saved activation cannot fall (not even re-planned)
    checkpointed = training.activation_checkpointing != "off" and ref.checkpointing not in (None, "off")
    if (memory_bound and holds_activations and checkpointed and not training.activation_offload
            and training.engine == "torch" and ref.mesh is None):  # planned under checkpointing only
        # the saved activations in CPU memory, out under forward and back under backward beside the compute
        # (advisor.estimate.activation_offload): torchtune's and TRL's, after the kernels and checkpointing
        keep.append(_Change(name="--activation-offload", keeps_math=True, update={"activation_offload": True}))
    if memory_bound and holds_activations:
        keep += _context_parallel(spec, hw, training, ref, samples=samples)
    if hw.nodes > 1 and STRATEGIES[ref.strategy].on(training.engine).shard_params:
        keep.append(_Change(name=f"--hybrid {hw.nodes}", keeps_math=True, mesh=ParallelDims(
            dp_replicate=hw.nodes, dp_shard=hw.gpus_per_node, world_size=hw.world_size)))
    if memory_bound and more_gpus:  # where nothing fits there is no plan whose samples a step more GPUs keep
        keep += _more_gpus(spec, hw, training, pins=pins)
    # Those that change it, from the least change to the most (``find_remedies`` ranks them so where they fit alike):
    # the optimizer state's precision, the frozen base's or the weights' precision, which parameters train, the data.
    change = []
    if training.optimizer in ("adamw", "adam") and spec.trainable_params:
        change.append(_Change(name="--optimizer adamw-8bit", keeps_math=False, update={"optimizer": "adamw-8bit"}))
    if training.base_dtype_counts and training.frozen_base_dtype == "param":
        # the base loaded as the checkpoint's bf16 (from_pretrained's dtype='auto'): the same weights, half the bytes;
        # the linears compute alike under autocast, the norms and the residual stream in bf16
        change.append(_Change(name="--frozen-base compute", keeps_math=False, update={"frozen_base": "compute"}))
    if training.precision in ("bf16-mixed", "fp32") and hw.gpu.bf16_tflops is not None:
        change.append(_Change(name="--precision bf16", keeps_math=False, update={"precision": "bf16"}))
    if training.lora is None and training.quantize is None and spec.trainable_params == spec.total_params:
        try:
            lora = LoraConfig(rank=LORA_RANK)
            change.append(_Change(name=f"--lora {LORA_RANK}", keeps_math=False, update={"lora": lora},
                                  spec=with_lora(spec, lora)))
        except ValueError:  # no block linears known for this model: no LoRA to plan
            pass
    if memory_bound:
        change += _shorter_sequence(spec, hw, training, ref)
    return keep + change


def stack_changes(training: TrainingConfig, default: Candidate | None) -> list[_Change]:
    """Where the size default cannot run on the user's stack but does, with the same mathematics, on another the
    recipe launches: transformers' Adafactor under FSDP1 (accelerate's fsdp_version 1) or DeepSpeed's ZeRO
    (``candidates.ADAFACTOR_ON_FSDP2``). Empty otherwise."""
    if default is None or default.available or default.unavailable_reason != ADAFACTOR_ON_FSDP2:
        return []
    found = [_Change(name="--fsdp-version 1", keeps_math=True, update={"fsdp_version": 1})]
    if "deepspeed" in training.recipe.engines and STRATEGIES[default.strategy].on("deepspeed").available:
        found.append(_Change(name="--engine deepspeed", keeps_math=True, update={"engine": "deepspeed"}))
    return found


def optimizer_impl_changes(training: TrainingConfig) -> list[_Change]:
    """``--optimizer-impl fused`` unless the plan already steps with it: the fused kernel allocates no
    state-sized temporary (advisor.estimate.states) and is the fastest; for-loop saves as much memory but
    launches kernels per tensor, so it is never the better remedy."""
    if training.optimizer_implementation == "fused":
        return []
    return [_Change(name="--optimizer-impl fused", keeps_math=True, update={"optimizer_impl": "fused"})]


def _more_gpus(spec: ModelSpec, hw: Hardware, training: TrainingConfig, *,
               pins: MeshPins | None = None) -> list[_Change]:
    """The fewest GPUs of this kind on which zero3 fits on the GPUs alone within the --headroom (micro-batch 1), or
    fewer on a mesh (``_fewer_on_a_mesh``). A --global-batch the user gave is kept, and the count must divide it (data
    parallelism steps on a micro-batch per GPU); without one the count plans its own samples a step, as every other
    remedy does (the plan's were its own micro-batch search's, not the user's: keeping them could force a mesh, e.g.
    9 samples on 4 GPUs), and the remedy line names both counts. ``pins``: the degrees the user fixed, which the
    meshes keep."""
    relaxed = validated_copy(training, {"micro_batch_size": 1, "global_batch_size": None})
    per_node = server_size(hw)
    total = training.global_batch_size

    def fits(n: int) -> bool:  # the global batch kept where n ranks divide it: accumulation holds gradients, and
        # the micro-batch search (the whole batch at once first) finds the lightest split, as the plan there would
        at = relaxed if total is None or total % n else validated_copy(
            training, {"micro_batch_size": training.micro_batch_size, "global_batch_size": total})
        cand = evaluate_candidate(spec, at_count(hw, n, per_node), at, "zero3")
        return cand.fits and within_headroom(cand, at)  # a count that leaves the --headroom, not one at 99%

    count = smallest_count(fits, above=hw.world_size, per_node=per_node)
    if count is not None and count > MORE_GPUS_AT_MOST * hw.world_size:
        count = None  # a different job, not a remedy (the no-fit answer still counts them: advisor.planning.smallest)
    if count is not None and total is not None and total % count:  # --global-batch asked: only a count keeping it
        count = next((n for n in counts_above(count, per_node) if n <= total and total % n == 0 and fits(n)), None)
    on_mesh = _fewer_on_a_mesh(spec, hw, training, below=count, pins=pins)
    if on_mesh is not None:
        return [on_mesh]
    if count is None:
        return []
    return [_Change(name=f"--gpus {_gpus_flag(hw, count)}", keeps_math=True, hardware=at_count(hw, count, per_node))]


def _gpus_flag(hw: Hardware, count: int) -> str:
    bigger = at_count(hw, count, server_size(hw))
    return f"{bigger.gpus_per_node}x{hw.gpu.name}" if bigger.nodes == 1 else \
        f"{bigger.nodes}x{bigger.gpus_per_node}x{hw.gpu.name}"


def _keeping(training: TrainingConfig, samples: int | None) -> tuple[dict[str, int], str]:
    """The update and the flag that keep the plan's ``samples`` a step, where no --global-batch was given (a remedy
    that changes the data-parallel ranks changes them otherwise): ``({"global_batch_size": 8}, " --global-batch 8")``,
    else ``({}, "")``."""
    if training.global_batch_size is not None or samples is None:
        return {}, ""
    return {"global_batch_size": samples}, f" --global-batch {samples}"


def _fewer_on_a_mesh(spec: ModelSpec, hw: Hardware, training: TrainingConfig, *, below: int | None,
                     pins: MeshPins | None = None) -> _Change | None:
    """More GPUs on a tensor/context-parallel mesh where that takes fewer of them than data parallelism alone
    (``below``: zero3's count; None where none holds the job): a sample's activations and logits do not shrink
    with data-parallel ranks, they do over cp and tp ranks, so a long sequence that needs 24 GPUs of zero3 fits
    2 on cp 2. The plan at each count is the mesh search's best, as the planner runs it (``_best_searched_mesh``),
    on the GPUs alone within the --headroom, at a count where no data-parallel strategy fits on the GPUs alone (where
    one does, even past the headroom, the planner runs it and no mesh). A --global-batch the user gave is kept (a mesh
    only needs its data-parallel ranks' micro-batches to divide it, ``keeping_global_batch``); without one the mesh
    plans its own samples a step, as ``_more_gpus`` does. Counts tried: powers of two within a node, then whole nodes doubling
    (the degrees cp and tp take), so the search stays a few mesh searches."""
    per_node = server_size(hw)
    counts = counts_above(hw.world_size, per_node, every=False)
    for count in (n for n in counts if (below is None or n < below) and n <= MORE_GPUS_AT_MOST * hw.world_size):
        cluster = at_count(hw, count, per_node)
        dp = replan_data_parallel(spec, cluster, training)
        if dp is not None and not offloads(dp):  # the planner runs data parallelism there (past the headroom)
            continue
        try:
            best = _best_searched_mesh(spec, cluster, training, pins)
        except ValueError:  # the mesh estimators refuse this model (a size alone: no attention heads known)
            return None
        if best is not None and not offloads(best) and within_headroom(best, training):
            return _Change(name=f"--gpus {_gpus_flag(hw, count)}", keeps_math=True, hardware=cluster,
                           pins=pins or MeshPins())
    return None


def _context_parallel(spec: ModelSpec, hw: Hardware, training: TrainingConfig, ref: Candidate, *,
                      samples: int | None = None) -> list[_Change]:
    """``--cp N`` for each power of two N inside a node that splits the sequence into 2 x N chunks, as the mesh
    search would (advisor.planning.meshes.enumerate_meshes): the activations and logits of a sample split over N
    ranks, FSDP2 over the rest. The plan is the search's best with cp pinned (it may add tensor parallelism: the
    remedy names its mesh), the saving is measured on that mesh, the step's samples are kept (``--global-batch``:
    ``samples``, the recommended plan's, else the reference's micro-batch on every GPU), and the fastest degree is
    listed. Only for a fully sharded reference whose peak holds activations, with SDPA."""
    if (ref.strategy not in MESH_STRATEGIES or offloads(ref) or training.attention == "eager"
            or training.images_per_sample or not spec.num_attention_heads or not training.recipe.runs_mesh_dim("cp")
            or training.fsdp_version == 1):  # FSDP1 runs no cp (advisor.planning.meshes.check_pins refuses it)
        return []
    world, changes = hw.world_size, []
    # The step's samples kept: without --global-batch the micro-batch sets them per data-parallel rank, and a cp or
    # tp mesh has fewer of those ranks, so the remedy names the global batch that keeps the mathematics.
    keep, said = _keeping(training, samples if samples is not None else ref.micro_batch_size * world)
    for cp in powers_of_two(hw.gpus_per_node)[1:]:  # the degrees the mesh search tries (enumerate_meshes)
        if world % cp == 0 and training.seq_len % (2 * cp) == 0:
            mesh = ParallelDims(dp_shard=world // cp, cp=cp, world_size=world)
            changes.append(_Change(name=f"--cp {cp}{said}", keeps_math=True, mesh=mesh, pins=MeshPins(cp=cp),
                                   update=keep))
    return changes


def _shorter_sequence(spec: ModelSpec, hw: Hardware, training: TrainingConfig, ref: Candidate) -> list[_Change]:
    """The longest sequence (a multiple of 128, or a power of two below 128) at which the reference
    strategy fits on the GPUs alone within the --headroom at micro-batch 1, when shorter than the one asked for."""
    strategy = ref.strategy if not offloads(ref) else "zero3"
    lengths = [n for n in range(128, training.seq_len, 128)] or [2**k for k in range(training.seq_len.bit_length())
                                                                if 2**k < training.seq_len]

    def fits(length: int) -> bool:
        at = validated_copy(training, {"seq_len": length, "micro_batch_size": 1, "global_batch_size": None})
        cand = evaluate_candidate(spec, hw, at, strategy)
        return cand.fits and within_headroom(cand, at)  # the longest that leaves the --headroom

    longest = largest_fitting(fits, lengths)
    if longest is None:
        return []
    return [_Change(name=f"--seq-len {longest}", keeps_math=False, update={"seq_len": longest})]


def offload_line(remedies: tuple[Remedy, ...], chosen: Candidate, *, reference: StrategyName) -> r.OffloadRemedy | None:
    """The first reason of a plan that offloads: the best remedy, in numbers; ``reference`` is the candidate its
    saving is measured on. Best: among those that keep the mathematics, the first that runs on the GPUs alone at least
    as fast as the plan, else the first that runs faster; else the first of the others on the GPUs alone at least as
    fast; else the first (``find_remedies``' order)."""
    if chosen.step_time is None:
        return None
    speed = chosen.step_time.tokens_per_s
    keeping = [x for x in remedies if x.keeps_math]
    best = next((x for x in keeping if _roomy_at(x, speed * (1 - SAME_SPEED))), None) or next(
        (x for x in keeping if (x.tokens_per_s or 0) > speed * (1 + SAME_SPEED)), None) or next(
        (x for x in remedies if _roomy_at(x, speed * (1 - SAME_SPEED))), remedies[0] if remedies else None)
    if best is None or best.tokens_per_s is None:
        return None
    return r.OffloadRemedy(strategy=chosen.strategy, tokens_per_s=chosen.step_time.tokens_per_s, remedy=best.name,
                           keeps_math=best.keeps_math, remedy_strategy=best.strategy, remedy_fits=best.fits,
                           remedy_step_s=best.step_s, remedy_tokens_per_s=best.tokens_per_s, saved_gib=best.saved_gib,
                           reference=reference, remedy_mesh=best.mesh, remedy_samples=best.own_samples,
                           samples=best.plan_samples)


def headroom_line(remedies: tuple[Remedy, ...], chosen: Candidate, training: TrainingConfig) -> r.HeadroomRemedy | None:
    """The first reason of a plan past the --headroom (the remedies were kept only where their plan leaves it: the
    "past headroom" reason of ``find_remedies``): the best of them, in numbers."""
    best = next((x for x in remedies if x.fits and x.total_gib is not None and x.tokens_per_s is not None), None)
    if best is None or chosen.step_time is None:
        return None
    return r.HeadroomRemedy(strategy=chosen.strategy, total_bytes=chosen.memory_range.at(training.margin),
                            capacity_bytes=chosen.capacity_bytes, headroom=training.headroom,
                            tokens_per_s=chosen.step_time.tokens_per_s, remedy=best.name, keeps_math=best.keeps_math,
                            remedy_strategy=best.strategy, remedy_total_gib=best.total_gib, remedy_step_s=best.step_s,
                            remedy_tokens_per_s=best.tokens_per_s, remedy_mesh=best.mesh,
                            remedy_samples=best.own_samples, samples=best.plan_samples)


def single_process_line(remedies: tuple[Remedy, ...], chosen: Candidate) -> r.SingleProcessRemedy | None:
    """The first reason of a plan that falls back to DataParallel: the best remedy that runs on the GPUs alone, within
    the --headroom and faster (``SAME_SPEED``), those that keep the mathematics first; None where none does."""
    if chosen.step_time is None:
        return None
    better = [x for x in remedies if _roomy_at(x, chosen.step_time.tokens_per_s * (1 + SAME_SPEED))]
    best = next((x for x in better if x.keeps_math), better[0] if better else None)
    if best is None:
        return None
    return r.SingleProcessRemedy(strategy=chosen.strategy, tokens_per_s=chosen.step_time.tokens_per_s,
                                 remedy=best.name, keeps_math=best.keeps_math, remedy_strategy=best.strategy,
                                 remedy_step_s=best.step_s, remedy_tokens_per_s=best.tokens_per_s,
                                 remedy_mesh=best.mesh, remedy_samples=best.own_samples, samples=best.plan_samples)


def remedy_fits(remedy: Remedy) -> r.RemedyFits:
    """Nothing fits: what one remedy leads to."""
    return r.RemedyFits(remedy=remedy.name, keeps_math=remedy.keeps_math, strategy=remedy.strategy, fits=remedy.fits,
                        step_s=remedy.step_s, tokens_per_s=remedy.tokens_per_s, mesh=remedy.mesh)

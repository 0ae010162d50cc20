"""``advisor.plan(model, gpus="2xA100", **training) -> Plan``: the library entry point.

Resolves names and strings into validated objects (model spec, hardware, training config), runs
the planner, and collects every default it chose into ``assumptions``. The CLI and ``wrap()`` both
call this; neither does arithmetic of its own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pydantic import (BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, computed_field, field_serializer,
                      model_serializer)

from advisor.estimate.activations import activation_family
from advisor.estimate.memory import image_tokens
from advisor.estimate.optimizer_8bit import EIGHT_BIT_OPTIMIZERS, bitsandbytes_note
from advisor.frozen import validated_copy
from advisor.units import GIB
from advisor.hardware.cluster import Hardware, parse_gpus
from advisor.model.heads import apply_task
from advisor.model.saved_modules import saved_modules_note
from advisor.model.lora import adapts_output_head, lora_of, with_lora
from advisor.model.attention_support import runs_eager_by_default
from advisor.model.releases import behaviour_in, installed_release, is_release, load_release_behaviours
from advisor.model.loss_kernels import HEAD_ADAPTER, TRANSFORMS_LOGITS
from advisor.model.sources import resolve, resolve_model
from advisor.estimate.memory import recipe_dtypes
from advisor.estimate.traced import needs_trace, trace_keys
from advisor.model.spec import ModelSpec, parse_count, validation_problem
from advisor.mesh import MESH_STRATEGIES
from advisor.planning.live_model import (check_quantized, config_quantization, live_frozen_base, live_lora,
                                          live_quantization, with_recorded_linears)
from advisor.planning.longest import (longer_with_change, longer_with_offload, longest_all, longest_key, longest_on_meshes, longest_traced,
                                      planned_length, within_headroom_at)
from advisor.planning.meshes import MeshPins, check_pins, choose_with_meshes, enumerate_meshes, pinned_pipeline_meshes
from advisor.planning.candidates import (Candidate, Recommendation, batch_split_problem, evaluate_candidate,
                                         larger_past_headroom)
from advisor.planning.notes import assumptions_of, longest_note, lora_note, loss_notes, stream_pool_note
from advisor.planning.pipeline_meshes import pipeline_meshes
from advisor.planning.policy import choose, choose_fastest, default_strategy, offload_not_taken, offloads
from advisor.planning.smallest import NothingFits, SmallestFit, smallest_fit
from advisor.planning.reasons import BeyondContext, ReasonModel
from advisor.planning.remedies import (find_remedies, headroom_line, offload_line, pinned_remedies, remedy_fits,
                                       remedy_reason, single_process_line)
from advisor.planning.render import render
from advisor.strategies import STRATEGIES, get_strategy
from advisor.training import TrainingConfig

if TYPE_CHECKING:  # the union names the mesh reasons, loaded on first use
    from advisor.planning.reasons import Reason


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelSpec
    hardware: Hardware = Field(description="The validated cluster (JSON: its flat summary, GPU and links by name).")
    training: TrainingConfig
    candidates: tuple[Candidate, ...]
    recommendation: Recommendation | None
    reasons: tuple[SerializeAsAny[ReasonModel], ...] = Field(
        description="Why this recommendation (or why nothing fits), in the order a reader meets them, with their "
                    "numbers (advisor.planning.reasons; each serialised as its own kind).")
    assumptions: tuple[str, ...]
    smallest_fit: SmallestFit | None = None
    longest_seq_len: dict[str, int | None] | None = Field(
        default=None, description="--seq-len max: per strategy (and per mesh, keyed 'zero3 cp 8 x tp 2'), the "
                                   "longest sequence that fits at micro-batch 1.")

    @property
    def fits(self) -> bool:
        return self.recommendation is not None

    def longest_for(self, candidate: Candidate) -> int | None:
        """--seq-len max: the longest sequence ``candidate`` holds (its own mesh's, not its strategy's on data
        parallelism alone); None where it holds no token or the plan did not search."""
        return (self.longest_seq_len or {}).get(longest_key(candidate.strategy, candidate.mesh))

    def candidate(self, strategy: str) -> Candidate:
        """The data-parallel candidate of ``strategy`` (the first listed; mesh candidates follow)."""
        found = next((c for c in self.candidates if c.strategy == strategy), None)
        if found is None:
            raise ValueError(f"no {strategy!r} candidate in this plan: {', '.join(dict.fromkeys(c.strategy for c in self.candidates))}"[:200])
        return found

    @property
    def chosen(self) -> Candidate | None:
        """The recommended candidate (its mesh included), or None when nothing fits."""
        rec = self.recommendation
        if rec is None:
            return None
        return next(c for c in self.candidates if c.strategy == rec.strategy and c.mesh == rec.mesh)

    @computed_field
    @property
    def why(self) -> tuple[str, ...]:
        """The reasons as sentences (``advisor.planning.render``)."""
        return tuple(render(reason) for reason in self.reasons)

    @model_serializer(mode="wrap")
    def _why_before_reasons(self, handler):  # JSON: 'why' where it always was, the structured 'reasons' after it
        data = handler(self)
        if not isinstance(data, dict) or "why" not in data:
            return data
        why, ordered = data.pop("why"), {}
        for key, value in data.items():
            if key == "reasons":
                ordered["why"] = why
            ordered[key] = value
        return ordered

    @field_serializer("hardware")
    def _hardware_summary(self, hardware: Hardware) -> dict:
        # Same keys as before Plan kept the Hardware object: readers of the JSON see no change.
        return hardware.summary()


def resolve_trainable(spec: ModelSpec, trainable: int | str | None) -> ModelSpec:
    """``--trainable-params N|P%``: a count (``7M``, ``7000000``) or a share of the total (``0.5%``)."""
    if trainable is None:
        return spec
    if isinstance(trainable, str) and trainable.strip().endswith("%"):
        try:
            share = float(trainable.strip()[:-1])
        except ValueError:
            raise ValueError(f"cannot read --trainable-params '{trainable[:40]}'") from None
        if not 0 <= share <= 100:
            raise ValueError("--trainable-params percentage must be between 0% and 100%")
        count = round(spec.total_params * share / 100)
    elif isinstance(trainable, bool) or not isinstance(trainable, (int, str)):
        raise ValueError(f"--trainable-params: expected a count (7M, 7000000) or a share (0.5%), got {trainable!r}"[:120])
    else:
        count = trainable if isinstance(trainable, int) else parse_count(trainable, what="--trainable-params")
    if count < 0:
        raise ValueError(f"--trainable-params must be at least 1 (got {count:,})")
    if count > spec.total_params:
        raise ValueError(f"--trainable-params {count:,} exceeds the model's {spec.total_params:,} parameters")
    return spec.with_trainable(count)


def _with_remedies(spec: ModelSpec, hw: Hardware, training: TrainingConfig, candidates: list[Candidate],
                   recommendation: Recommendation | None,
                   why: list[Reason], *, meshes: list[Candidate] = (), pins: MeshPins | None = None,
                   ) -> tuple[Recommendation | None, list[Reason]]:
    """The ranked remedies (``advisor.planning.remedies``) on the recommendation (a data-parallel candidate or one of
    ``meshes``); when it offloads or leaves less than the --headroom free, the best one opens the 'why'; when nothing
    fits, the three best are why lines."""
    chosen = None if recommendation is None else next(
        c for c in [*candidates, *meshes] if c.strategy == recommendation.strategy and c.mesh == recommendation.mesh)
    remedies = find_remedies(spec, hw, training, candidates, chosen, pins=pins)
    if not remedies:
        return recommendation, why
    if recommendation is None:
        return None, why + [remedy_fits(r) for r in remedies if r.strategy is not None][:3]
    line = None
    if offloads(chosen):
        line = offload_line(remedies, chosen, reference=default_strategy(spec, world=hw.world_size)[0])
    elif remedy_reason(spec, candidates, chosen, world=hw.world_size, training=training) == "past headroom":
        line = headroom_line(remedies, chosen, training)
    elif STRATEGIES[chosen.strategy].on(chosen.engine).single_process and hw.world_size > 1:
        line = single_process_line(remedies, chosen)  # DataParallel as the fallback: what runs faster, first
    return validated_copy(recommendation, {"remedies": remedies}), ([line] if line else []) + why


def _check_fixed_overheads(hw: Hardware, training: TrainingConfig) -> None:
    """--reserve-gib and --context-gib are per-GPU costs before any tensor: together at or past the GPU's memory, no
    plan can fit, and the reason is theirs (not the activations a 'nothing fits' would name)."""
    fixed = training.reserve_gib + training.context_gib_at(hw.world_size, hw.gpu.name)
    if fixed * GIB >= hw.gpu.memory_bytes:
        raise ValueError(f"--reserve-gib {training.reserve_gib:g} and the CUDA context ({fixed - training.reserve_gib:g} "
                         f"GiB) take {fixed:.2f} GiB of the {hw.gpu.name}'s {hw.gpu.memory_bytes / GIB:.2f} GiB before "
                         "any tensor: no plan can fit")


def _without_bf16(hw: Hardware, training: TrainingConfig, notes: list[str]) -> TrainingConfig:
    """A GPU with no bf16 (no bf16 rate in profiles/gpus.json: V100, T4): a pinned bf16 precision is a
    ValueError; the default bf16-mixed becomes fp16-mixed, said in one line."""
    if hw.gpu.bf16_tflops is not None or training.precision_info.compute_dtype != "bfloat16":
        return training
    if "precision" in training.model_fields_set:
        raise ValueError(f"--precision {training.precision}: the {hw.gpu.name} has no bf16 (profiles/gpus.json); "
                         "use --precision fp16-mixed or fp32")
    notes.append(f"precision fp16-mixed: the {hw.gpu.name} has no bf16, so the default bf16-mixed is planned as "
                 "fp16-mixed (fp32 master weights, fp16 compute with loss scaling); --precision fp32 to change")
    return validated_copy(training, {"precision": "fp16-mixed"})


def _with_bitsandbytes(training: TrainingConfig, notes: list[str]) -> TrainingConfig:
    """An 8-bit optimizer's state is counted for the bitsandbytes release given, else the installed one (read
    from package metadata, no import), else the newest (advisor.estimate.optimizer_8bit); the plan says which."""
    if training.optimizer not in EIGHT_BIT_OPTIMIZERS:
        return training
    given = training.bitsandbytes is not None
    if not given:
        installed = installed_release("bitsandbytes")
        if installed is not None and is_release(installed):  # an odd metadata version: the newest, as if absent
            training = validated_copy(training, {"bitsandbytes": installed})
    notes.append(bitsandbytes_note(training.bitsandbytes, installed=not given))
    return training


def _default_attention(spec: ModelSpec, training: TrainingConfig, notes: list[str]) -> TrainingConfig:
    """Eager attention where --attention is left unset and the model's transformers class has no SDPA path
    (Gemma 2, BLOOM, MPT: profiles/attention_support.json), which is what such a model runs by default."""
    if "attention" in training.model_fields_set or not spec.num_attention_heads \
            or not runs_eager_by_default(spec.architecture):
        return training
    notes.append(f"attention eager (default for {spec.architecture}: transformers has no SDPA path for it, so it "
                 "runs eager attention and keeps the b x heads x s x s scores; --attention sdpa: the flash or flex "
                 "attention a model may have, asked for by name, with no s^2 term)")
    return validated_copy(training, {"attention": "eager"})


def _torch_release_note(training: TrainingConfig, notes: list[str]) -> None:
    """With --torch-release, which of torch's allocation-changing behaviours (profiles/library_releases.json) the
    plan counts; without it the newest release's, unsaid (plans made before the option read the same)."""
    release = training.torch_release
    if release is None:
        return
    rows = [b for b in load_release_behaviours() if b.library == "torch"]
    said = "; ".join(f"{b.name.replace('_', ' ')}: {'yes' if behaviour_in(b.name, release) else 'no'} (since {b.since})"
                     for b in rows)
    kept = ("" if training.recipe.fsdp_root_reshards else f" (the {training.recipe.name} recipe keeps the unit that "
            "holds the head unsharded after forward on every release)")
    notes.append(f"torch {release} (--torch-release): {said}{kept}")


def _trl_release_note(training: TrainingConfig, notes: list[str]) -> None:
    """With --trl-release, how the trainer recipe's SFTTrainer prepares a k-bit LoRA model; without it, unsaid (the
    recipe's line names the preparation it cites)."""
    release = training.trl_release
    if release is None:
        return
    said = f"trl {release} (--trl-release)"
    if not training.trl_prepares_kbit:
        notes.append(f"{said}: changes nothing here (it decides how SFTTrainer prepares a 4-bit or 8-bit LoRA model "
                     "under the trainer recipe)")
    elif training.engine == "deepspeed":
        notes.append(f"{said}: changes nothing here (the DeepSpeed engine casts the whole model to the 16-bit dtype "
                     "whatever SFTTrainer prepared)")
    elif training.trl_bf16_trainables:
        notes.append(f"{said}: SFTTrainer keeps the k-bit base in the bf16 it was loaded in (no "
                     "prepare_model_for_kbit_training since 0.26.0) and casts every trainable parameter to bf16: a "
                     "bf16 residual stream, bf16 adapters with bf16 gradients and AdamW state")
    elif behaviour_in("trl_sft_keeps_kbit_base_in_bf16", release):
        notes.append(f"{said}: since 0.26.0 SFTTrainer keeps the base in bf16 and casts the adapters to bf16, which is "
                     f"modelled under bf16-mixed only; this {training.precision} plan counts the preparation before "
                     "0.26 (prepare_model_for_kbit_training's fp32 upcast, fp32 adapters)")
    else:
        notes.append(f"{said}: before 0.26.0 SFTTrainer runs prepare_model_for_kbit_training (the unquantised base "
                     "upcast to fp32, an fp32 residual stream from the first MLP on), fp32 adapters, the embedding and "
                     "head cast back to bf16")


def _transformers_release_note(training: TrainingConfig, notes: list[str]) -> None:
    """With --transformers-release, whether the stack's checkpointing is reentrant (the one transformers behaviour
    a training config reads; the model's own are the resolver's); without it the newest release's, unsaid."""
    release = training.transformers_release
    if release is None:
        return
    how = ("reentrant (gradient_checkpointing_enable() passes use_reentrant=True before 5.0.0)"
           if training.reentrant_checkpointing else "non-reentrant")
    whose = ("through transformers' gradient_checkpointing_enable()" if training.recipe.checkpoints_via_transformers
             else f"with torch's own checkpoint (the {training.recipe.name} recipe, whatever the release)")
    notes.append(f"transformers {release} (--transformers-release): activation checkpointing {whose}: {how}")


def _traced(spec: ModelSpec, config: dict, training: TrainingConfig, *, cache_dir: Path | None, notes: list[str],
            names: list[str], trust_remote_code: bool, checkpointing: bool,
            progress: Callable[[float | None], None] | None) -> ModelSpec:
    """The spec with traced activation profiles when its family has no formula (see ``plan``).
    ``checkpointing=False``: only the profiles without checkpointing (the planner looks at checkpointing
    only for a strategy that does not fit without it; ``plan`` then calls again for the rest)."""
    why = needs_trace(spec, training)
    if why is None:
        return spec
    # Without the trace: the family's own formula (LoRA on GPT-2 / GPT-NeoX), else a Llama-like decoder.
    untraced = "its formula's full fine-tune" if activation_family(spec.model_type) else "a Llama-like decoder"
    if trust_remote_code and config.get("auto_map"):
        raise ValueError(f"traced activation profile not run for model_type {spec.model_type}: the tracer runs "
                         "transformers' own modeling code only, and this model ships its own (auto_map); pass "
                         "--no-trace for the Llama-like estimate")
    from advisor.simulate.profile_cache import traced_profiles  # imports torch: only for these families

    impls = [STRATEGIES[name].on(training.engine) for name in names]
    dtypes = list(dict.fromkeys(recipe_dtypes(training, impl) for impl in impls if impl.available))
    keys = trace_keys(training, dtypes)
    if not checkpointing:
        keys = [k for k in keys if k.checkpointing == "off"] or keys
    keys = [k for k in keys if k not in {p.key for p in spec.traced}]
    if not keys:
        return spec
    try:
        profiles = traced_profiles(config, keys, cache_dir=cache_dir, progress=progress)
    except Exception as err:  # the modeling code cannot run this way (no causal-LM head, fake tensors...)
        notes.append(f"{why}: tracing it failed ({type(err).__name__}: {' '.join(str(err).split())[:160]}), so "
                     f"activations assume {untraced}")
        return spec
    if not spec.traced:
        notes.append(f"{why}: activations traced on fake tensors (one and two blocks, embedding, head and loss, at "
                     f"this sequence length and recipe; cached per config); --no-trace assumes {untraced} instead")
        if training.attention == "sdpa" and runs_eager_by_default(spec.architecture):  # asked for, not there
            notes.append(f"attention eager, traced so: transformers' {spec.architecture} has no SDPA path (it runs "
                         "eager attention whatever is asked, keeping the b x heads x s x s scores)")
    return validated_copy(spec, {"traced": spec.traced + profiles})


def _needs_checkpointing(candidates: list[Candidate]) -> bool:
    """Some strategy that can run does not fit without checkpointing (so checkpointing was estimated)."""
    return any(c.available and (not c.fits or c.activation_checkpointing) for c in candidates)


# Fields whose command-line flag is not the field's name with hyphens (the others with none are set by --from only).
_FLAGS = {"micro_batch_size": "--micro-batch", "global_batch_size": "--global-batch", "dp_replicate": "--hybrid",
          "fragmentation": None, "checkpointing_fragmentation": None, "zero": None, "bitsandbytes": None}


def _option_error(err: ValidationError, rename: dict[str, str] | None = None) -> ValueError:
    """A rejected option as one line naming it as ``advisor.plan`` takes it and as the command line spells it:
    "seq_len (--seq-len): ..." (``rename``: a field ``plan()`` takes under another keyword); a check across options
    keeps its own message, which names them."""
    first = err.errors()[0]
    if not first["loc"] and first.get("type") == "value_error":
        return ValueError(first["msg"].removeprefix("Value error, "))
    where, _, problem = validation_problem(err).partition(": ")
    field, dot, rest = where.partition(".")
    flag = _FLAGS.get(field, f"--{field.replace('_', '-')}")
    named = f"{(rename or {}).get(field, field)}{dot}{rest}"
    return ValueError(f"{named}{f' ({flag})' if flag and not dot else ''}: {problem}")


def _pins(**degrees: Any) -> MeshPins:
    """The pinned degrees, or one ValueError naming the option (``--hybrid`` is the field dp_replicate)."""
    try:
        return MeshPins(**degrees)
    except ValidationError as err:
        raise _option_error(err, {"dp_replicate": "hybrid"}) from None


def training_from_options(options: dict[str, Any]) -> TrainingConfig:
    """``TrainingConfig(**options)``: the user's options, so a rejected value is a one-line ValueError
    naming the option (a ``ValidationError`` reaching the CLI is a bug of ours: exit code 1)."""
    try:
        return TrainingConfig(**options)
    except ValidationError as err:
        raise _option_error(err) from None


def _strategy_named(spec: ModelSpec, hw: Hardware, asked: TrainingConfig, chosen: Candidate, past,
                    update: dict[str, Any]):
    """``past`` (a ``reasons.PastHeadroom``) with ``--strategy`` among its flags where the command it names could plan
    another strategy at that micro-batch: the data-parallel family's re-plan of that command (``asked`` with ``update``
    and the micro-batch: ``remedies.replan_data_parallel``) takes another (a faster one within the headroom there:
    ddp's larger micro-batch past it, zero2's within it), or offloads, where the planner's mesh step may take a mesh
    instead (that step is not run here: it loads the mesh estimators, and the pinned strategy reproduces the plan
    quoted either way)."""
    from advisor.planning.remedies import replan_data_parallel

    if chosen.mesh is not None and not chosen.mesh.is_data_parallel_only:  # the mesh's degrees are named: pinned
        return past
    try:
        again = replan_data_parallel(spec, hw, validated_copy(asked, {**update,
                                                                      "micro_batch_size": past.micro_batch_size}))
    except ValueError:
        again = None
    if again is not None and again.strategy == chosen.strategy and not offloads(again):
        return past
    return validated_copy(past, {"flags": " ".join(part for part in (f"--strategy {chosen.strategy}", past.flags)
                                                   if part)})


def _replanning(chosen: Candidate, training: TrainingConfig, asked: TrainingConfig,
                pins: MeshPins) -> tuple[dict[str, Any], str | None]:
    """What beside a changed --micro-batch plans ``chosen`` again where the planner chose it: its checkpointing (a
    larger micro-batch would take more of it), its mesh (no pins) and its global batch (a mesh planned at an offload
    plan's samples), as a training-config update (the mesh aside) and as flags (``--activation-checkpointing off``,
    ``--tp 2 --cp 2``; None where none is needed). The strategy is named where the plan at the larger micro-batch would
    take another (``_strategy_named``)."""
    update: dict[str, Any] = {}
    if training.activation_checkpointing == "auto" and chosen.checkpointing in ("off", "selective"):  # (the most
        # recompute, "on", is what the planner falls back to)
        update["activation_checkpointing"] = chosen.checkpointing
    if training.global_batch_size is not None and asked.global_batch_size is None:
        update["global_batch_size"] = training.global_batch_size
    parts = [f"--activation-checkpointing {update['activation_checkpointing']}"] if "activation_checkpointing" in \
        update else []
    if chosen.mesh is not None and not chosen.mesh.is_data_parallel_only and not pins.any:
        parts.append(MeshPins.of(chosen.mesh).flags)
    if "global_batch_size" in update:
        parts.append(f"--global-batch {update['global_batch_size']}")
    return update, " ".join(parts) or None


def plan(
    model: Any,
    gpus: str | Hardware = "2xA100",
    *,
    nodes: int | None = None,
    interconnect: str | None = None,
    trainable_params: int | str | None = None,
    strategy: str | None = None,
    trust_remote_code: bool = False,
    training: TrainingConfig | None = None,
    tp: int | None = None,
    cp: int | None = None,
    hybrid: int | None = None,
    pp: int | None = None,
    pp_schedule: str | None = None,
    virtual_stages: int | None = None,
    pp_layers: tuple[int, ...] | None = None,
    ep: int | None = None,
    task: str | None = None,
    num_labels: int | None = None,
    trace: bool = True,
    cache_dir: Path | None = None,
    progress: Callable[[float | None], None] | None = None,
    **options: Any,
) -> Plan:
    """Estimate every strategy for ``model`` on ``gpus`` and recommend one.

    ``lora=`` (a ``LoraConfig``, or a rank for PEFT's default targets) adds the adapters to the model
    and trains only them.

    ``options`` are ``TrainingConfig`` fields (optimizer, precision, seq_len, micro_batch_size,
    global_batch_size, activation_checkpointing, engine, attention, reserve_gib, policy, ...);
    a misspelled one is an error. ``tp``, ``cp``, ``hybrid`` (dp_replicate), ``pp`` (with ``pp_schedule``,
    ``virtual_stages``, ``pp_layers``) and ``ep`` pin mesh degrees
    (``advisor.planning.meshes``); meshes are also searched when data parallelism alone cannot run.

    ``task`` (``advisor.model.heads``: sequence-classification, token-classification, question-answering;
    default the causal LM, or the head class the config's architectures names) with ``num_labels`` puts a
    task head in place of the vocabulary's; under LoRA, PEFT's copy of the head trains too.

    ``trace``: for a family with no activation formula, measure its activations by tracing the model on
    fake tensors (``advisor.simulate.profile``; imports torch); False keeps the Llama-like assumption.
    ``cache_dir``: where traced profiles are kept between plans (the CLI passes
    ``advisor.simulate.profile_cache.default_cache_dir()``); None traces every time.
    ``progress``: called with None when a trace starts (not on a cache hit) and with its seconds when it
    ends, so a caller can say why this plan takes seconds (the CLI prints it on stderr).
    """
    pins = _pins(tp=tp, cp=cp, dp_replicate=hybrid, pp=pp, pp_schedule=pp_schedule, virtual_stages=virtual_stages,
                 pp_layers=pp_layers, ep=ep)
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise ValueError(f"cache_dir: expected a directory path, got {type(cache_dir).__name__}")
    cache_dir = Path(cache_dir) if cache_dir is not None else None
    if progress is not None and not callable(progress):
        raise ValueError(f"progress: expected a function of the trace's seconds, got {type(progress).__name__}")
    if strategy is not None:  # '' or 0 meant every strategy; a list was a TypeError
        if not isinstance(strategy, str):
            raise ValueError(f"strategy: expected a strategy's name, got {type(strategy).__name__}")
        get_strategy(strategy)  # an unknown name: one line listing them
    if training is not None and not isinstance(training, TrainingConfig):
        raise ValueError(f"training: expected a TrainingConfig, got {type(training).__name__}")
    search_length = options.get("seq_len") == "max"
    if search_length:
        given = options.get("micro_batch_size")
        options = {**options, "seq_len": 1, "micro_batch_size": 1 if given is None else given}
    if training is None:
        training = training_from_options(options)
    elif options:
        raise ValueError(f"pass either training= or options, not both ({', '.join(options)})")
    spec, config = resolve(model, trust_remote_code=trust_remote_code, cache_dir=cache_dir)
    image_tokens(spec, training)  # --images-per-sample on a model that takes no images: ValueError now
    notes = []
    live_config = config if config is not None or not hasattr(getattr(model, "config", None), "to_dict") else \
        model.config.to_dict()  # a live model's own config: its label count
    spec, training = apply_task(spec, live_config, training, task=task, num_labels=num_labels, notes=notes)
    context = spec.max_position_embeddings
    if not search_length and "seq_len" not in training.model_fields_set and context and training.seq_len > context:
        notes.append(f"sequence length {context:,} tokens: the model's context (max_position_embeddings), where the "
                     f"default {training.seq_len:,} is past it (--seq-len)")
        training = validated_copy(training, {"seq_len": context})
    if training.chunked_nll and spec.head is None and spec.loss_kernel_refusal \
            and spec.loss_kernel_refusal.startswith(TRANSFORMS_LOGITS):
        # TRL's chunked_nll applies a soft-cap or a scale to each chunk itself, which chunked_nll_bytes does not count
        training = validated_copy(training, {"loss": "hf"})
        notes.append(f"--loss chunked (TRL's chunked_nll): this model transforms its logits ("
                     f"{spec.loss_kernel_refusal.rsplit('(', 1)[-1]}, which TRL applies to each chunk and the "
                     "estimate does not count: planned with --loss hf, the full logits")
    if training.loss != "hf" and spec.head is None and spec.loss_kernel_refusal:
        raise ValueError(f"--loss {training.loss}: wrappers.losses' kernel {spec.loss_kernel_refusal}; "
                         "use --loss hf")
    live = live_lora(model, spec, notes)  # a PEFT model: its adapters are already among its parameters
    if live is None and lora_of(model) is not None:  # adapters the activation model does not know: lm_head's?
        _refuse_fused_head_adapter(spec, validated_copy(training, {"lora": lora_of(model)}))
    counted = live is not None
    quantized = live_quantization(model)
    if quantized is not None:  # bitsandbytes packs its weights: count the base from its config instead
        spec, counted = resolve_model(model.config.to_dict(), trust_remote_code=trust_remote_code), False
        if training.quantize not in (None, quantized[0]):
            raise ValueError(f"quantize={training.quantize} given for a model loaded in {quantized[0]}; leave it out")
        training = validated_copy(training, {"quantize": quantized[0], "double_quant": quantized[1]})
    elif (saved := config_quantization(config, notes)) is not None:  # a checkpoint saved quantised: its config.json says so
        if training.quantize not in (None, saved[0]):
            raise ValueError(f"quantize={training.quantize} given for a checkpoint saved in {saved[0]} (its config's "
                             "quantization_config); leave it out")
        if training.lora is None:
            raise ValueError(f"the checkpoint is saved in bitsandbytes {saved[0]} (config.json's quantization_config): "
                             "its base is frozen, so it trains only with --lora RANK (QLoRA)")
        training = validated_copy(training, {"quantize": saved[0], "double_quant": saved[1]})
    if live is not None:
        if training.lora is not None and training.lora != live:
            raise ValueError(f"lora={training.lora.rank} given for a PEFT model that already has rank {live.rank} "
                             "adapters; leave lora= out")
        training = validated_copy(training, {"lora": live})
        held = live_frozen_base(model) if training.quantize is None and training.frozen_base is None else None
        if held is not None and held != training.frozen_base_dtype:  # the base as the user loaded it
            training = validated_copy(training, {"frozen_base": held})
        if spec.head is not None and any(name.endswith(spec.head.module) for name in live.modules_to_save or ()):
            spec = validated_copy(spec, {"head": validated_copy(spec.head, {"saved_copy": True})})  # PEFT trains it
    if (live is None and training.frozen_base is None and spec.dtype is None and spec.source in ("bundled", "hub")
            and training.base_dtype_counts and training.frozen_base_dtype == "compute"):
        # The recipe loads the base as the checkpoint's dtype (from_pretrained's dtype='auto'); a published config
        # that states none is an fp32-era checkpoint (BERT, GPT-2, T5, BART: written before transformers recorded the
        # dtype), which loads in float32. A hand-written or local config says nothing either way.
        training = validated_copy(training, {"frozen_base": "param"})
        notes.append("frozen base in float32: the config states no dtype (an fp32 checkpoint), which from_pretrained's "
                     "dtype='auto' loads as float32; loaded in 16 bits, it is --frozen-base compute")
    if training.lora is not None:
        if trainable_params is not None:
            raise ValueError("give --lora or --trainable-params, not both (--lora sets what trains)")
        if not counted and config is not None:
            spec = with_recorded_linears(spec, config, cache_dir=cache_dir, trust_remote_code=trust_remote_code)
        _refuse_fused_head_adapter(spec, training)
        notes.append(lora_note(spec, training.lora, training, traced=trace and config is not None))
        if training.lora.modules_to_save and not counted:
            note = saved_modules_note(spec, training.lora)
            if training.copies_in_compute_dtype:
                note += (f"; over the 4-bit base recipe {training.recipe.name} casts the embedding and head copies to "
                         f"{training.precision_info.compute_dtype} (TRL's peft_module_casting_to_bf16), so they train "
                         f"in it on a GPU that holds the whole base (not under FSDP / ZeRO-3, where TRL leaves them)")
            notes.append(note)
        if not counted:
            spec = with_lora(spec, training.lora)
    if training.quantize is not None:
        notes.append(check_quantized(spec, training, strategy))
    spec = resolve_trainable(spec, trainable_params)
    if spec.trainable_params == 0:  # a plan of a backward pass and an optimizer with nothing to update
        raise ValueError("nothing trains: " + ("--trainable-params rounds to 0 parameters" if trainable_params is not None
                         else "every parameter of the model is frozen (requires_grad False)")
                         + "; give at least one trainable parameter, or --lora RANK")
    if isinstance(gpus, Hardware) and (nodes is not None or interconnect is not None):
        raise ValueError("nodes and interconnect go with a gpus string such as '2x8xH100'; a Hardware fixes them")
    hw = gpus if isinstance(gpus, Hardware) else parse_gpus(gpus, nodes=nodes, interconnect=interconnect)
    if training.float8:  # imported only when asked (start-up)
        from advisor.estimate.float8_time import check_float8

        check_float8(spec, hw.gpu.name, hw.gpu.fp8_tflops, training, pp=pp)  # --float8 on A100: ValueError (exit 2)
    training = _without_bf16(hw, training, notes)
    _check_fixed_overheads(hw, training)
    training = _with_bitsandbytes(training, notes)
    training = _default_attention(spec, training, notes)
    _torch_release_note(training, notes)
    _transformers_release_note(training, notes)
    _trl_release_note(training, notes)
    if training.optimizer_in_backward:  # one GPU, torch engine (advisor.estimate.in_backward)
        from advisor.estimate.in_backward import in_backward_problem

        problem = in_backward_problem(training, world=hw.world_size)
        if problem is not None:
            raise ValueError(problem)
    dp_blocked = None  # data parallelism alone cannot split the global batch: only a mesh can
    names = [get_strategy(strategy).name] if strategy else list(STRATEGIES)
    trace_with = dict(cache_dir=cache_dir, notes=notes, trust_remote_code=trust_remote_code, names=names,
                      progress=progress)
    tracing = trace and config is not None
    if tracing and not search_length:  # --seq-len max traces the lengths its search tries (below)
        if pins.any and needs_trace(spec, training) is not None:  # refused pins: before seconds of tracing
            check_pins(spec, hw, training, pins)
        spec = _traced(spec, config, training, checkpointing=False, **trace_with)
    if training.global_batch_size is not None and training.global_batch_size % hw.world_size:
        dp_blocked = f"--global-batch {training.global_batch_size} is not divisible by {hw.world_size} GPUs"
    elif training.global_batch_size is not None and training.micro_batch_size is not None:
        if training.global_batch_size % (training.micro_batch_size * hw.world_size):
            dp_blocked = (f"--global-batch {training.global_batch_size} is not a multiple of micro-batch "
                          f"{training.micro_batch_size} x {hw.world_size} GPUs")
    longest = None
    if search_length:
        traced_family = needs_trace(spec, training) is not None
        if tracing and traced_family:
            def retrace(current: ModelSpec, length: int) -> ModelSpec:
                at = validated_copy(training, {"seq_len": length})
                return _traced(current, config, at, checkpointing=True, **trace_with)

            spec, longest, best = longest_traced(spec, hw, training, names, retrace=retrace)
        else:
            longest, best = longest_all(spec, hw, training, names)
        on_mesh = names[0] if strategy else MESH_STRATEGIES[0]
        # And on the meshes the planner would consider; not for a family with no formula, whose mesh
        # estimate does not read the traced profile (advisor.estimate.model_parallel). Pinned degrees: the plan is
        # one of the pinned meshes (pipeline and expert ones under --pp / --ep), so the length is the longest one
        # of those holds; where none is listed, the pins' own error comes from the plan below.
        if on_mesh in MESH_STRATEGIES and not traced_family:
            if pins.pipelined:  # the pins' own one-line error before any mesh is built with them
                check_pins(spec, hw, training, pins)
            listed = (lambda at: pinned_pipeline_meshes(spec, hw, at, pins)) if pins.pipelined else \
                (lambda at: enumerate_meshes(spec, hw, at, pins))
            on_meshes = longest_on_meshes(spec, hw, training, on_mesh, listed)
            longest.update(on_meshes)
            if pins.any and on_meshes:
                best = planned_length(on_meshes, training)
                if best is None:
                    raise NothingFits(f"not even one token fits a mesh with {pins.flags} at micro-batch "
                                      f"{training.micro_batch_size}; see advisor plan without --seq-len max")
            else:
                best = planned_length(longest, training)
            if best is None and training.global_batch_size is not None and not pins.pipelined:
                # a batch no data-parallel rank count here splits: a pipeline's stages take the GPUs it leaves
                # (with the pinned --tp / --cp degrees)
                longest.update(longest_on_meshes(spec, hw, training, on_mesh,
                                                 lambda at: pinned_pipeline_meshes(spec, hw, at, pins)))
                best = planned_length(longest, training)
        unsplit = batch_split_problem(training, hw.world_size) is not None and not any(" " in key for key in longest)
        if best is None and unsplit:  # no strategy's or mesh's ranks keep --global-batch: nothing was searched
            raise ValueError(f"--global-batch {training.global_batch_size} cannot be split over these GPUs: no "
                             "strategy's or mesh's data-parallel ranks (x the micro-batch) divide it; change "
                             "--global-batch")
        if best is None:
            at = (f"--global-batch {training.global_batch_size}" if training.global_batch_size is not None else
                  f"micro-batch {training.micro_batch_size or 1}")
            raise NothingFits(f"not even one token fits on these GPUs at {at}; see advisor plan without --seq-len max")
        notes.append(longest_note(spec, longest, best, training.micro_batch_size))
        if spec.learned_positions and spec.max_position_embeddings and best > spec.max_position_embeddings:
            best = spec.max_position_embeddings  # a learned position table: no longer input runs
        training = validated_copy(training, {"seq_len": best})
    candidates, recommendation, why = [], None, []  # why: the reasons (advisor.planning.reasons), in order
    if dp_blocked is None:
        candidates = [evaluate_candidate(spec, hw, training, name) for name in names]
        if strategy and not candidates[0].available:  # bad input, not a plan that does not fit
            raise ValueError(f"--strategy {names[0]} cannot run with the {training.engine} engine here: "
                             f"{candidates[0].unavailable_reason}")
        if tracing and spec.traced and _needs_checkpointing(candidates):
            spec = _traced(spec, config, training, checkpointing=True, **trace_with)
            candidates = [evaluate_candidate(spec, hw, training, name) for name in names]
        if training.policy == "fastest" and not strategy:
            recommendation, why = choose_fastest(spec, candidates, global_batch_size=training.global_batch_size,
                                                 world=hw.world_size)
        else:
            recommendation, why = choose(spec, candidates, only=names[0] if strategy else None,
                                         headroom=training.headroom, margin=training.margin, world=hw.world_size)
    asked = training  # a mesh that replaces an offload is planned at that plan's samples a step (its training)
    meshes, recommendation, why, training = choose_with_meshes(
        spec, hw, training, dp_candidates=candidates, dp_choice=recommendation, dp_why=list(why), pins=pins,
        strategy=strategy, dp_blocked=dp_blocked, length_search=search_length)
    if search_length:
        why.extend(longer_with_offload(spec, hw, training, longest))
        if recommendation is not None and not spec.traced and (recommendation.mesh is None or (
                recommendation.mesh.pp == 1 and recommendation.mesh.ep == 1)):
            roomy = within_headroom_at(spec, hw, training, recommendation.strategy, training.seq_len,
                                       recommendation.mesh)
            why.extend([roomy] if roomy is not None else [])
            longer = longer_with_change(spec, hw, training, recommendation.strategy, training.seq_len,
                                        recommendation.mesh)
            why.extend([longer] if longer is not None else [])
    if recommendation is not None and context and training.seq_len > context:  # --seq-len max, or a given length
        why.insert(0, BeyondContext(seq_len=training.seq_len, context=context, learned=spec.learned_positions))
    if not (strategy or pins.any or search_length or dp_blocked) and (
            recommendation is None or recommendation.mesh is None or asked.policy != "fastest"):
        # a remedy is the command with one change: planned from what was asked (advisor.planning.remedies)
        recommendation, why = _with_remedies(spec, hw, asked, candidates, recommendation, why, meshes=meshes,
                                             pins=pins)
    elif strategy and recommendation is None and not (pins.any or search_length or dp_blocked):
        why.extend(pinned_remedies(spec, hw, training, candidates[0]))
    if recommendation is not None and not search_length:  # the length search fills the GPU already (above)
        update, flags = _replanning(recommendation.candidate, training, asked, pins)
        past = larger_past_headroom(spec, hw, training, recommendation.candidate, flags=flags)
        past = past if past is None else _strategy_named(spec, hw, asked, recommendation.candidate, past, update)
        why.extend([past] if past is not None else [])
    if recommendation is not None and asked.policy != "fastest" and not (strategy or pins.any or search_length
                                                                         or dp_blocked):
        passed_over = offload_not_taken(recommendation.candidate, candidates)  # a faster offload the policy left
        why.extend([passed_over] if passed_over is not None else [])
    # --optimizer-in-backward is planned on one GPU only: no larger count to look for.
    smallest = None if recommendation or training.optimizer_in_backward else smallest_fit(
        spec, hw, training, meshes=lambda cluster: (  # the pipeline and expert meshes too (first: pinned ones)
            pinned_pipeline_meshes(spec, cluster, training, pins) + enumerate_meshes(spec, cluster, training, pins)
            if pins.pipelined else enumerate_meshes(spec, cluster, training, pins) + (
                [] if pins.any else pipeline_meshes(spec, cluster, training))),
        from_current=bool(strategy) or training.micro_batch_size is not None or pins.any,
        pinned=pins.flags if pins.any else None, pinned_pipeline=pins.pipeline_flags or None,
        multiple_of=(pins.pp or 1) * (pins.tp or 1) * (pins.cp or 1) if pins.any else None)
    if smallest is not None:
        why.append(smallest.reason)
    if not pins.any:  # pinned: the meshes were asked
        why.extend(loss_notes(spec, hw, training, candidates + (meshes if recommendation is not None and
                                                               recommendation.mesh is not None else []),
                              recommendation))
    candidates += meshes
    chosen = next((c for c in candidates if recommendation is not None and c.strategy == recommendation.strategy
                   and c.mesh == recommendation.mesh), None)
    flush = stream_pool_note(chosen.memory_bytes if chosen is not None else None, hw.gpu_memory_bytes)
    if flush is not None:
        notes.append(flush)
    return Plan(
        model=spec, hardware=hw, training=training, candidates=tuple(candidates),
        recommendation=recommendation, reasons=tuple(why), assumptions=tuple(notes + assumptions_of(spec, hw, training)),
        smallest_fit=smallest, longest_seq_len=longest,
    )


def _refuse_fused_head_adapter(spec: ModelSpec, training: TrainingConfig) -> None:
    """ValueError when ``--loss fused``, or TRL's chunked_nll (``Recipe.chunked_logits`` "checkpointed"), meets a
    LoRA adapter on the output head (``wrappers.losses`` and TRL refuse it too: the kernel would train without the
    adapter's contribution)."""
    if training.loss == "fused" and training.lora is not None and adapts_output_head(spec, training.lora):
        raise ValueError(f"--loss fused: wrappers.losses' fused kernel {HEAD_ADAPTER}; use --loss chunked "
                         "(it calls the adapted head)")
    if training.chunked_nll and training.lora is not None and adapts_output_head(spec, training.lora):
        raise ValueError(f"--loss chunked under --recipe {training.recipe.name}: TRL's chunked_nll {HEAD_ADAPTER} "
                         "(TRL refuses it too); use --loss hf")

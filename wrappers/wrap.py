"""``wrap(model, optimizer, loader)``: plan for the live model and this launch, then apply the plan.

The flow: read the launch once (``read_launch_env``), decide (``plan_wrap``: the planner's
recommendation when GPUs are visible, the size-threshold default on CPU where there is no GPU
memory to check; the same for a model on the meta device, at the batch the loader feeds), apply it (``apply_recipe``, the same call the simulator makes), check that the
result is what the decision claims (``verify_applied``: process group of the launch's size, the
wrapping and sharding, the dtypes; ``RuntimeError`` otherwise), shard the loader, and attach the
decision to the returned model (``model.advisor_decision``). Rank 0 prints the decision once.

With the torch recipe the result trains with a plain ``loss.backward(); optimizer.step()`` loop:
under DDP, ZeRO-1 and DataParallel with a mixed precision the model's forward runs under
``torch.autocast`` (hooks on the model, ``wrappers.precision``), under FSDP2 the
``MixedPrecisionPolicy`` casts. A model stored in bf16 is planned and recorded as pure ``bf16``.
When ``accelerate launch`` started the script with an FSDP or DeepSpeed config (or
``engine="accelerate"`` / ``"deepspeed"``), ``wrap`` returns what ``Accelerator().prepare`` returns;
then the loop must call ``accelerator.backward(loss)`` (DeepSpeed scales and steps inside it), with
the accelerator at ``model.advisor_accelerator``. That path checks too: accelerate must run as many
processes as the launch started, with the plugin the config asks for, and the decision records the
precision accelerate really runs.

``wrappers.finish()`` ends the script: a barrier, then the process group destroyed; a group ``wrap()``
created is also destroyed at exit if the script does not call it (``wrappers.process_group``).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Literal, get_args

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from advisor.mesh import MESH_STRATEGIES, ParallelDims
from advisor.model.block_profile import CheckpointFlags
from advisor.model.meta import spec_from_module
from advisor.model.spec import ModelSpec
from advisor.planning.policy import default_strategy
from advisor.strategies import STRATEGIES, StrategyName
from advisor.training import CheckpointMode, Engine, Precision
from wrappers import measured
from wrappers.checkpointing import apply_requested_checkpointing, requested_mode, turn_off_kv_cache
from wrappers.launch_env import LaunchEnv, read_launch_env
from wrappers.loader import loader_shape, shard_loader
from wrappers.mesh import resolve_dims
from wrappers.optim import optimizer_implementation
from wrappers.parallelize import is_meta, model_from_config
from wrappers.precision import apply_autocast, precision_dtypes
from wrappers.process_group import init_launch_group
from wrappers.prepare_accelerate import prepare_with_accelerate
from wrappers.recipe import Recipe, apply_recipe
from wrappers.verify import verify_applied

# Who prepares the model: "torch" is this package's recipe (``apply_recipe``, for the planner's torch
# engine); "accelerate" is ``Accelerator().prepare``, and "deepspeed" the same with the DeepSpeed
# plugin of an ``accelerate launch`` config (the planner's deepspeed engine, run by accelerate).
Preparer = Literal[Engine, "accelerate"]


class Decision(CheckpointFlags, BaseModel):
    """What ``wrap`` applied and why; reachable as ``model.advisor_decision``."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    strategy: StrategyName | None = Field(description="Applied strategy; None: model returned unchanged.")
    engine: Preparer = Field(description="Who prepared the model: the torch recipe or accelerate.")
    precision: Precision
    checkpointing: CheckpointMode = Field(description="Activation checkpointing applied: on (full), off, or "
                                          "selective (keeps attention outputs and every other matmul).")
    world_size: int
    reason: str
    plan: Any = Field(default=None, description="The advisor Plan, when GPUs let us check memory.")
    mesh: ParallelDims | None = Field(default=None, description="The device mesh applied: TP, CP, HSDP, or data "
                                      "parallelism alone (dp_shard = world size).")
    micro_batch_size: int | None = Field(default=None, description="Samples per rank per forward the plan is for: "
                                         "the loader's batch_size, else the plan's choice; None: not planned.")
    seq_len: int | None = Field(default=None, description="Tokens per sample the plan is for: the loader's first "
                                "sample, else the seq_len given, else the planner's default.")

    def summary(self) -> str:
        ckpt = {"off": "", "on": ", activation checkpointing",
                "selective": ", selective activation checkpointing"}[self.checkpointing]
        applied = self.strategy or "not parallelised"  # precision and checkpointing may still apply: named beside it
        if self.mesh is not None and not self.mesh.is_data_parallel_only:
            applied = f"{applied} on mesh {self.mesh.label}"
        return f"[advisor] {applied} ({self.engine}, {self.precision}{ckpt}) on {self.world_size} process(es): {self.reason}"


def _plan_one_gpu(spec: ModelSpec, env: LaunchEnv, options: dict, live: Any = None) -> Any:
    """The plan of the unchanged model on its one GPU (the plain model, in the precision it keeps), for
    the figures the measured steps are printed beside; None when nothing fits (the run is the user's)."""
    one = {**options, "strategy": "ddp", "precision": options.get("precision", "fp32")}
    try:
        return _plan_on_gpus(spec, env, one, live).plan
    except ValueError:
        return None


def _plan_on_gpus(spec: ModelSpec, env: LaunchEnv, options: dict, live: Any = None) -> Decision:
    """Ask the planner, with the GPUs this launch really has; about ``live`` itself when given, so a
    PEFT model is planned as LoRA (its adapters' activations), not as a partly frozen model."""
    from advisor.hardware.cluster import build_hardware
    from advisor.planning.api import plan

    per_node = env.local_world_size if env.distributed else env.num_gpus  # one process: DataParallel over all
    hardware = build_hardware(env.gpu_name, gpus_per_node=per_node, nodes=env.nodes)
    result = plan(spec if live is None else live, hardware, **options)
    rec = result.recommendation
    if rec is None:
        raise ValueError("wrap(): nothing fits on these GPUs. " + " ".join(result.why))
    return Decision(strategy=rec.strategy, engine="torch", precision=result.training.precision,
                    checkpointing=rec.checkpointing, world_size=env.world_size, reason=rec.reason, plan=result,
                    mesh=rec.mesh)


def decide(spec: ModelSpec, env: LaunchEnv, *, strategy: StrategyName | None = None,
           precision: Precision | None = None, activation_checkpointing: bool | CheckpointMode | None = None,
           seq_len: int | None = None, micro_batch_size: int | None = None, live: Any = None,
           optimizer_impl: str | None = None, compile: bool = False, float8: bool = False,
           activation_offload: bool = False) -> Decision:
    """The strategy for this model and launch (pure but for the planner's data files). ``live``: the
    module ``spec`` describes, planned as itself where GPUs are visible (a PEFT model is recognised).
    ``optimizer_impl``: how the handed optimizer steps (``wrappers.optim.optimizer_implementation``);
    None plans with the torch recipe's."""
    if not env.distributed and strategy not in (None, "dp"):
        raise ValueError(f"wrap(strategy={strategy!r}) needs one process per GPU: start the script with "
                         "`advisor launch` (or torchrun)")
    options = {k: v for k, v in dict(precision=precision, seq_len=seq_len, micro_batch_size=micro_batch_size,
                                      strategy=strategy or ("dp" if not env.distributed else None),
                                      optimizer_impl=optimizer_impl, compile=compile or None,
                                      float8=float8 or None, activation_offload=activation_offload or None).items()
               if v is not None}
    asked = requested_mode(activation_checkpointing)
    if asked is not None:
        options["activation_checkpointing"] = asked
    if activation_offload:  # planned under checkpointing only (advisor.estimate.activation_offload)
        if asked == "off":
            from advisor.training import OFFLOAD_NEEDS_CHECKPOINTING
            raise ValueError(OFFLOAD_NEEDS_CHECKPOINTING.replace("--activation-offload", "activation_offload=True"))
        asked = asked or "on"  # where no plan chooses the mode (no GPU to plan on): full checkpointing
    if not env.distributed and env.num_gpus <= 1:
        where = "one GPU" if env.num_gpus else "no GPU"
        return Decision(strategy=None, engine="torch", precision=precision or "fp32",
                        checkpointing=asked or "off", world_size=1,
                        reason=f"one process and {where}: nothing to parallelise; the same script runs anywhere",
                        plan=_plan_one_gpu(spec, env, options, live) if env.num_gpus else None)
    if env.num_gpus:
        return _plan_on_gpus(spec, env, options, live)
    chosen, rationale = (strategy, "requested") if strategy else default_strategy(spec)
    return Decision(strategy=chosen, engine="torch", precision=precision or "fp32",
                    checkpointing=asked or "off", world_size=env.world_size,
                    reason=f"{rationale}; no GPU visible, so memory was not checked")


def plan_wrap(model: nn.Module, env: LaunchEnv, *, optimizer=None, loader=None, strategy: StrategyName | None = None,
              precision: Precision | None = None, activation_checkpointing: bool | CheckpointMode | None = None,
              seq_len: int | None = None, micro_batch_size: int | None = None, compile: bool = False,
              float8: bool = False, activation_offload: bool = False) -> Decision:
    """The Decision ``wrap()`` applies, without applying it: the model planned the same way whatever its device
    (a meta-device model by its shapes, a live one as itself, so PEFT adapters are seen), at the batch the
    loader feeds (its ``batch_size`` and the first sample's tokens) unless ``micro_batch_size`` / ``seq_len``
    say otherwise, with the optimizer's implementation; data parallelism is the mesh with tp = cp = 1."""
    read_batch, read_seq = loader_shape(loader)
    micro_batch_size = read_batch if micro_batch_size is None else micro_batch_size
    seq_len = read_seq if seq_len is None else seq_len
    meta = is_meta(model)
    decision = decide(spec_from_module(model), env, strategy=strategy, precision=precision or _stored_precision(model),
                      activation_checkpointing=activation_checkpointing, seq_len=seq_len,
                      micro_batch_size=micro_batch_size, live=None if meta else model,
                      optimizer_impl=optimizer_implementation(optimizer), compile=compile, float8=float8,
                      activation_offload=activation_offload)
    return _with_batch(decision, micro_batch_size, seq_len, env)


def _with_batch(decision: Decision, micro_batch_size: int | None, seq_len: int | None, env: LaunchEnv) -> Decision:
    """The decision with its mesh (data parallelism over the world where the plan has no other) and the batch
    it was planned at: the plan's own when it ran, else what the loader feeds."""
    plan = decision.plan
    if plan is not None and plan.recommendation is not None:
        micro_batch_size, seq_len = plan.recommendation.micro_batch_size, plan.training.seq_len
    mesh = decision.mesh or ParallelDims.data_parallel(env.world_size)
    return Decision(**{**dict(decision), "mesh": mesh, "micro_batch_size": micro_batch_size, "seq_len": seq_len})


def _stored_precision(model: nn.Module) -> Precision | None:
    """``"bf16"`` for a model stored in bf16 (it will compute in bf16 whatever autocast says), else None."""
    stored = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return "bf16" if stored == {precision_dtypes("bf16").param_dtype} else None


def _ensure_process_group(env: LaunchEnv) -> None:
    if env.distributed:
        init_launch_group(env)


def _prepare_with_accelerate(objects: list, why: str, env: LaunchEnv, plugin: str | None,
                             checkpointing: CheckpointMode | None) -> tuple:
    """Accelerate prepares; the decision records the precision, process count and checkpointing that
    accelerate really runs."""
    prepared = prepare_with_accelerate(objects, env, plugin, checkpointing=checkpointing)
    model = prepared.objects[0]
    model.advisor_accelerator = prepared.accelerator
    model.advisor_decision = Decision(strategy=prepared.strategy, engine="accelerate", precision=prepared.precision,
                                      checkpointing=prepared.checkpointing,
                                      world_size=prepared.accelerator.num_processes,
                                      reason=f"{why}; accelerate runs {prepared.runs_as}")
    return prepared.objects


def _check_arguments(model: Any, *, strategy: Any, engine: Any, seq_len: Any, micro_batch_size: Any, tp: Any,
                     cp: Any, hybrid: Any, optimizer: Any = None, precision: Any = None) -> None:
    """One ValueError naming the argument for what wrap() cannot take (a fuzz run found these reaching pydantic
    dumps, AttributeErrors, a silently ignored engine, or a plan at micro-batch 64 for a micro-batch of 0)."""
    from wrappers.mesh_wrap import is_config

    if not isinstance(model, nn.Module) and not is_config(model):
        raise ValueError(f"model: expected a torch.nn.Module or a transformers config, got {type(model).__name__}")
    if strategy is not None and (not isinstance(strategy, str) or strategy not in STRATEGIES):
        raise ValueError(f"strategy: unknown {strategy!r}"[:80] + f"; one of {', '.join(STRATEGIES)}")
    if engine not in get_args(Preparer):
        raise ValueError(f"engine: expected one of {', '.join(get_args(Preparer))}, got {engine!r}"[:160])
    for name, value in (("seq_len", seq_len), ("micro_batch_size", micro_batch_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name}: expected a whole number of at least 1, got {value!r}"[:120])
    for name, value in (("tp", tp), ("cp", cp), ("hybrid", hybrid)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a whole number of at least 1, got {value!r}"[:120])
    # wrap(model, "adamw"): a name, not an optimizer (what the accelerate path prepares beside the model may be any
    # object accelerate takes, a loader among them, so only plain values are refused)
    if isinstance(optimizer, (str, bytes, bool, int, float, dict, list, tuple)):
        raise ValueError(f"optimizer: expected a torch.optim.Optimizer built on the model's parameters, got "
                         f"{type(optimizer).__name__} {optimizer!r}"[:160])
    if precision is not None and precision not in get_args(Precision):
        raise ValueError(f"precision: expected one of {', '.join(get_args(Precision))}, got {precision!r}"[:160])


def wrap(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    loader: torch.utils.data.DataLoader | None = None,
    *,
    strategy: StrategyName | None = None,
    engine: Preparer = "torch",
    precision: Precision | None = None,
    activation_checkpointing: bool | CheckpointMode | None = None,
    seq_len: int | None = None,
    micro_batch_size: int | None = None,
    verbose: bool = True,
    env: LaunchEnv | None = None,
    mesh: ParallelDims | dict | None = None,
    tp: int = 1,
    cp: int = 1,
    hybrid: int = 1,
    checkpoint: str | None = None,
    num_microbatches: int | None = None,
    compile: bool = False,
    float8: bool = False,
    activation_offload: bool = False,
) -> Any:
    """Apply the recommended (or the requested) strategy to ``model``; see the module docstring.

    The model is planned by ``plan_wrap`` whatever its device (a meta-device model or a transformers config
    by its shapes) at the loader's batch; the plan is then applied on its mesh (TP, CP, HSDP, or data
    parallelism alone). A meta model is materialised from the safetensors directory ``checkpoint`` or
    initialised: shard by shard under a sharded plan (``wrappers.mesh_wrap``), whole under DDP / ZeRO-1.
    ``mesh`` (a ``ParallelDims`` or its dict, e.g. a plan's), or ``tp`` / ``cp`` / ``hybrid``
    (dp_replicate), pin a device mesh, applied as given without a memory check. A mesh with ``pp > 1``
    (pinned or planned) is run by ``wrap_pipeline`` with ``num_microbatches`` per step (else the plan's
    gradient accumulation): the ``Pipeline`` comes back in the model's place (``wrappers.pipeline_wrap``).
    ``compile`` / ``float8`` plan and apply the planner's --compile / --float8: each block torch.compiled (on the
    DP-family recipe and on an FSDP2 / HSDP mesh with tp = cp = 1: ``wrappers.parallelize.mesh_compile_problem``),
    the blocks' linears converted by
    torchao (``wrappers.compile_float8``; the DP-family recipe only); where wrap() does not apply one (float8 on a
    mesh, either on a pipeline or under accelerate's prepare) it is refused (ValueError) rather than ignored.
    ``activation_offload`` plans and applies --activation-offload: the body's saved tensors wait in CPU memory
    (``wrappers.activation_offload``), on the data-parallel paths only (refused on a mesh, a pipeline or
    accelerate's prepare).
    Returns ``model`` alone, or the tuple of what was passed (model, optimizer, loader) in order.
    """
    _check_arguments(model, strategy=strategy, engine=engine, seq_len=seq_len, micro_batch_size=micro_batch_size,
                     tp=tp, cp=cp, hybrid=hybrid, optimizer=optimizer, precision=precision)
    _refuse_wrapped(model)
    turn_off_kv_cache(model)  # as HF Trainer does: the cache only costs memory in training
    activation_checkpointing = requested_mode(activation_checkpointing)
    env = env or read_launch_env()
    from wrappers.mesh_wrap import is_config, materialize_whole, wrap_on_mesh

    if mesh is not None or (tp, cp, hybrid) != (1, 1, 1):
        # The caller's own mesh: applied as given (the degrees are checked, the memory is not planned).
        _refuse_unapplied("a pinned device mesh", compile=False, float8=float8, activation_offload=activation_offload)
        dims = resolve_dims(mesh, world_size=env.world_size, tp=tp, cp=cp, hybrid=hybrid)
        if dims.pp > 1:
            _refuse_unapplied(f"a pinned pipeline ({dims.label})", compile=compile, float8=False)
            return _pipelined(model, optimizer, loader, dims=dims, env=env, verbose=verbose, plan=None,
                              num_microbatches=num_microbatches, precision=precision,
                              checkpointing=activation_checkpointing, checkpoint=checkpoint)
        model, optimizer, loader, decision = wrap_on_mesh(
            model, optimizer, loader, env=env, mesh=mesh, tp=tp, cp=cp, hybrid=hybrid, checkpoint=checkpoint,
            strategy=strategy, precision=precision, activation_checkpointing=activation_checkpointing,
            compile=compile)
        return _finish(model, optimizer, loader, Decision(**decision), env, verbose)
    if is_config(model):
        model = model_from_config(model)
    if checkpoint is not None and not is_meta(model):
        raise ValueError("checkpoint= loads into a model built on the meta device; this one has weights already")
    passed = [obj for obj in (model, optimizer, loader) if obj is not None]
    if engine in ("accelerate", "deepspeed") or env.accelerate_plugin is not None:
        why = f"accelerate launch with a {env.accelerate_plugin} config" if env.accelerate_plugin else f"engine={engine}"
        plugin = env.accelerate_plugin or ("deepspeed" if engine == "deepspeed" else None)
        _refuse_unapplied(f"accelerate's prepare ({why})", compile=compile, float8=float8,
                          activation_offload=activation_offload)
        prepared = _prepare_with_accelerate(passed, why, env, plugin, activation_checkpointing)
        return prepared[0] if len(prepared) == 1 else prepared
    decision = plan_wrap(model, env, optimizer=optimizer, loader=loader, strategy=strategy, precision=precision,
                         activation_checkpointing=activation_checkpointing, seq_len=seq_len,
                         micro_batch_size=micro_batch_size, compile=compile, float8=float8,
                         activation_offload=activation_offload)
    # One path, whatever the model's device: the plan is applied on its mesh when it needs one, by FSDP2
    # materialising each rank's shard for a sharded plan of a meta model, otherwise to the model materialised
    # whole with the DP-family recipe.
    if decision.mesh.pp > 1:
        _refuse_unapplied(f"the planned pipeline ({decision.mesh.label})", compile=compile, float8=float8,
                          activation_offload=activation_offload)
        return _pipelined(model, optimizer, loader, dims=decision.mesh, env=env, verbose=verbose, plan=decision.plan,
                          num_microbatches=num_microbatches, precision=decision.precision,
                          checkpointing=decision.checkpointing, checkpoint=checkpoint)
    needs_mesh = not decision.mesh.is_data_parallel_only
    if needs_mesh or (is_meta(model) and env.world_size > 1 and decision.strategy in MESH_STRATEGIES):
        where = f"the planned mesh ({decision.mesh.label})" if needs_mesh else "a meta-device model sharded rank by rank"
        _refuse_unapplied(where, compile=False, float8=float8, activation_offload=activation_offload)
        model, optimizer, loader, fields = wrap_on_mesh(
            model, optimizer, loader, env=env, mesh=decision.mesh, tp=1, cp=1, hybrid=1, checkpoint=checkpoint,
            strategy=decision.strategy, precision=decision.precision, activation_checkpointing=decision.checkpointing,
            compile=compile)
        kept = {k: getattr(decision, k) for k in ("reason", "plan", "micro_batch_size", "seq_len")}
        return _finish(model, optimizer, loader, Decision(**{**fields, **kept}), env, verbose)
    if is_meta(model) or checkpoint is not None:
        model, optimizer = materialize_whole(model, optimizer, env=env, checkpoint=checkpoint)
    if decision.strategy is None:
        # Cast only for a requested precision: a model's own dtype is left as the user made it.
        dtype = None if precision is None else precision_dtypes(decision.precision).param_dtype
        wrapped, new_optimizer = model.to(env.device, dtype), optimizer  # ``to`` keeps parameter identity
        if float8:  # the order apply_recipe keeps: float8, checkpointing, compile
            from wrappers.compile_float8 import apply_float8
            apply_float8(wrapped)
        # offloading runs under checkpointing: the decision's mode where none was asked (decide)
        applied = apply_requested_checkpointing(
            wrapped, decision.checkpointing if activation_offload and activation_checkpointing is None
            else activation_checkpointing)
        if compile:
            from wrappers.compile_float8 import apply_compile
            apply_compile(wrapped)
        decision = Decision(**{**dict(decision), "checkpointing": applied})
        apply_autocast(wrapped, decision.precision, env.device.type)
        verify_applied(wrapped, optimizer, strategy=None, precision=decision.precision, world_size=env.world_size)
    else:
        if decision.strategy == "dp":
            warnings.warn("wrap(): DataParallel drives every GPU from one Python process and gathers outputs, "
                          "gradients and the optimizer on GPU0; one process per GPU (`advisor launch`, DDP) is "
                          "faster and balances memory", stacklevel=2)
        if decision.precision == "fp16-mixed":
            warnings.warn("wrap(): fp16-mixed needs a gradient scaler (torch.amp.GradScaler) in your loop; "
                          "bf16-mixed does not", stacklevel=2)
        _ensure_process_group(env)
        planned = decision.plan.training if decision.plan is not None else None  # the plan's --compile / --float8
        recipe = Recipe(strategy=decision.strategy, precision=decision.precision, checkpointing=decision.checkpointing,
                        compile=compile or (planned is not None and planned.compile),
                        float8=float8 or (planned is not None and planned.float8),
                        float8_all_gather=planned is not None and planned.float8_all_gather)
        if recipe.spec.applier != "fsdp":  # FSDP2 casts with its MixedPrecisionPolicy instead
            apply_autocast(model, decision.precision, env.device.type)
        applied = apply_recipe(model, recipe, device=env.device, optimizer=optimizer)
        wrapped, new_optimizer = applied.model, applied.optimizer
        verify_applied(wrapped, new_optimizer, strategy=decision.strategy, precision=decision.precision,
                       world_size=env.world_size)
        if loader is not None and env.distributed:
            loader = shard_loader(loader, num_replicas=env.world_size, rank=env.rank)
    if activation_offload:  # the body's saved tensors in CPU memory, as planned (advisor.estimate.activation_offload)
        from wrappers.activation_offload import apply_activation_offload
        apply_activation_offload(wrapped)
    return _finish(wrapped, new_optimizer if optimizer is not None else None, loader, decision, env, verbose)


def _pipelined(model, optimizer, loader, *, dims: ParallelDims, env: LaunchEnv, verbose: bool, plan: Any,
               num_microbatches: int | None, precision: Precision | None, checkpointing: CheckpointMode | None,
               checkpoint: str | None) -> Any:
    """A mesh with pp > 1: ``wrap_pipeline`` builds it; the pipeline comes back in the model's place."""
    from wrappers.pipeline_wrap import wrap_as_pipeline

    planned = plan.recommendation.gradient_accumulation_steps if plan is not None and plan.recommendation else None
    built, fields = wrap_as_pipeline(model, optimizer, loader, dims=dims, env=env, num_microbatches=num_microbatches,
                                     planned_microbatches=planned, precision=precision, checkpointing=checkpointing,
                                     checkpoint=checkpoint)
    rest = list(built[1:])
    new_optimizer = rest.pop(0) if optimizer is not None else None
    new_loader = rest.pop(0) if loader is not None else None
    return _finish(built[0], new_optimizer, new_loader, Decision(**fields, plan=plan), env, verbose)


def _refuse_unapplied(where: str, *, compile: bool, float8: bool, activation_offload: bool = False) -> None:
    """``float8`` and ``activation_offload`` are applied on the data-parallel recipe's path (``wrappers.recipe.
    apply_recipe`` and the one-process path) only, ``compile`` there and on a mesh: refuse them elsewhere rather
    than return a model that runs eager bf16, or keeps its activations on the GPU."""
    asked = [f"{name}=True" for name, on in (("compile", compile), ("float8", float8),
                                              ("activation_offload", activation_offload)) if on]
    if not asked:
        return
    paths = "the data-parallel path and device meshes" if asked == ["compile=True"] else "the data-parallel path"
    yourself = []
    if compile or float8:
        yourself.append("convert or compile the blocks yourself (wrappers.compile_float8.apply_float8 / apply_compile)")
    if activation_offload:
        yourself.append("apply wrappers.activation_offload.apply_activation_offload to the wrapped model yourself")
    raise ValueError(f"wrap({', '.join(asked)}) is applied on {paths} only, not on {where}: "
                     f"{' and '.join(yourself)} and call wrap() without it")


def _refuse_wrapped(model: Any) -> None:
    """A model ``wrap()`` (or the user) already wrapped would be wrapped again: DDP(DDP(m)), FSDP2 over a
    user's DDP, and the post-wrap check would look at the outer layer only. Refuse it, naming the layer."""
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    if isinstance(model, (DistributedDataParallel, DataParallel)):
        layer = f"{type(model).__name__}: pass model.module, the bare model"
    elif getattr(model, "advisor_decision", None) is not None:
        layer = "by wrap() already; use the model it returned as it is"
    elif isinstance(model, nn.Module) and any(isinstance(p, DTensor) for p in model.parameters()):
        layer = "its parameters are DTensor shards (FSDP2 or tensor parallelism applied already)"
    else:
        return
    raise ValueError(f"wrap(): the model is wrapped {layer}")


def _finish(model: nn.Module, optimizer, loader, decision: Decision, env: LaunchEnv, verbose: bool) -> Any:
    """Attach the decision, log it once, watch the memory of steps 2-3 on CUDA (``wrappers.measured``:
    one line beside the plan's figures, at ``model.advisor_memory``), and return what was passed in order."""
    model.advisor_decision = decision
    if verbose and env.rank == 0:
        print(decision.summary(), file=sys.stderr, flush=True)

    def report(line: str) -> None:
        if verbose and env.rank == 0:
            print(line, file=sys.stderr, flush=True)

    model.advisor_memory = measured.watch_optimizer(optimizer, measured.device_memory_source(env.device),
                                                    measured.planned_breakdown(decision.plan, decision.strategy),
                                                    report)
    result = [model] + ([optimizer] if optimizer is not None else []) + ([loader] if loader is not None else [])
    return result[0] if len(result) == 1 else tuple(result)

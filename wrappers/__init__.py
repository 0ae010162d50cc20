"""Apply a plan's strategy to a live model (``wrap``). Torch is imported here, never in ``advisor``.

    from wrappers import wrap
    model, optimizer, loader = wrap(model, optimizer, loader)

Layout, one module per concern (torchtitan's one-file-per-technique):

- ``wrap.py``: ``wrap()`` (decide, apply, verify, shard the loader, log once on rank 0);
  ``process_group.py``: the group ``wrap()`` creates, destroyed at exit, and ``finish()`` (the last
  call of a script: barrier, then the group destroyed);
  ``launch_env.py``: the one place the launcher's environment is read; ``loader.py``:
  ``DistributedSampler`` sharding with automatic ``set_epoch``; ``verify.py``: the check that the
  applied model is what the decision claims (process group, wrapping, sharding, dtypes);
  ``prepare_accelerate.py``: the ``Accelerator().prepare`` path, checked the same way;
  ``measured.py``: on CUDA, the peak allocated and reserved memory of steps 2-3, printed beside the
  plan's figures (``wrap()`` and the Trainer / Lightning callbacks).
- ``recipe.py``: ``Recipe`` (strategy, precision, activation checkpointing, offload), the strategy
  table ``STRATEGIES`` (each strategy's ``Applier``), ``apply_recipe`` (the one call ``wrap()`` and
  the simulator make) and ``autocast_context`` for the training loop.
- ``precision.py``: torch dtypes of ``advisor.precision``'s table, and autocast hooks that
  DataParallel replicas honour.
- ``ddp.py`` (``apply_ddp``), ``zero1.py`` (``apply_zero1``: DDP + ZeroRedundancyOptimizer),
  ``fsdp.py`` (``apply_fsdp``: FSDP2 ``fully_shard`` for ZeRO-2/3 and offload), ``dp.py``
  (``apply_dp``: single-process DataParallel).
- ``mesh.py`` (``build_meshes``: the named ``DeviceMesh`` of an ``advisor.mesh.ParallelDims`` and its
  tp / cp / fsdp / dp submeshes), ``tensor_parallel.py`` (the TP plan, ``parallelize_module``, the
  CUDA-only context-parallel step), ``parallelize.py`` (``apply_mesh``: TP, checkpointing, FSDP2 or
  HSDP, then materialisation), ``materialize.py`` (a meta model's shards loaded from safetensors
  slices or initialised), ``mesh_wrap.py`` (``wrap()``'s mesh branch).
- ``pipeline.py`` (``apply_pipeline``: a decoder split into stages by layer, run by a
  ``torch.distributed.pipelining`` schedule, TP and FSDP2 / HSDP inside each stage), ``pipeline_wrap.py``
  (``wrap_pipeline``: a plan's pp mesh applied, the pipeline returned in the model's place since it
  is stepped by its schedule; ``wrap()`` routes a pp mesh there), ``experts.py``
  (``apply_expert_parallel``: an MoE block's experts sharded over an ep group, all-to-all dispatch and
  combine).
- ``blocks.py`` (``find_blocks``), ``checkpointing.py`` (``apply_activation_checkpointing``),
  ``optim.py`` (``rebuild_optimizer`` after FSDP2 replaced the parameters),
  ``checkpoint_io.py`` (``save_checkpoint`` / ``load_checkpoint``, consolidated or sharded, with
  every rank's RNG state) and ``rng_state.py``.

Dependencies run one way: ``wrappers`` imports ``advisor`` (tables, planner, model counts), never
``advisor.simulate`` or ``advisor.cli``; only ``advisor.simulate`` imports ``wrappers``, to run the
same recipe (``tests/wrappers/test_layering.py``).

Every ``apply_*`` function is a pure "apply": explicit arguments, no planning, no environment reads,
no printing.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from wrappers.process_group import finish
from wrappers.wrap import Decision, wrap

if TYPE_CHECKING:  # pragma: no cover
    from wrappers.checkpoint_io import load_checkpoint, save_checkpoint
    from wrappers.pipeline_wrap import wrap_pipeline

__all__ = ["Decision", "finish", "load_checkpoint", "save_checkpoint", "wrap", "wrap_pipeline"]
_LAZY = {"load_checkpoint": "wrappers.checkpoint_io", "save_checkpoint": "wrappers.checkpoint_io",
         "wrap_pipeline": "wrappers.pipeline_wrap"}


def __getattr__(name: str) -> Any:
    """``load_checkpoint`` and ``save_checkpoint`` on first use (PEP 562): ``checkpoint_io`` imports
    torch.distributed's checkpoint and optimizer modules (about 0.6 s, TorchScript compiles), which the
    tracer (``advisor.simulate.profile``, through ``wrappers.blocks``) never needs; ``wrap_pipeline``
    likewise (``torch.distributed.pipelining``)."""
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'wrappers' has no attribute {name!r}")

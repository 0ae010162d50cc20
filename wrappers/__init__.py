"""Apply a plan's strategy to a live model (``wrap``). Torch is imported here, never in ``advisor``.

    from wrappers import wrap
    model, optimizer, loader = wrap(model, optimizer, loader)

Layout, one module per concern (torchtitan's one-file-per-technique):

- ``wrap.py``: ``wrap()`` (decide, apply, shard the loader, log once on rank 0);
  ``launch_env.py``: the one place the launcher's environment is read; ``loader.py``:
  ``DistributedSampler`` sharding with automatic ``set_epoch``.
- ``recipe.py``: ``Recipe`` (strategy, precision, activation checkpointing, offload), the strategy
  table ``STRATEGIES``, ``apply_recipe`` (the one call ``wrap()`` and the simulator make) and
  ``autocast_context`` for the training loop.
- ``ddp.py`` (``apply_ddp``), ``zero1.py`` (``apply_zero1``: DDP + ZeroRedundancyOptimizer),
  ``fsdp.py`` (``apply_fsdp``: FSDP2 ``fully_shard`` for ZeRO-2/3 and offload; also the precision
  vocabulary), ``dp.py`` (``apply_dp``: single-process DataParallel).
- ``blocks.py`` (``find_blocks``), ``checkpointing.py`` (``apply_activation_checkpointing``),
  ``optim.py`` (``rebuild_optimizer`` after FSDP2 replaced the parameters),
  ``checkpoint_io.py`` (``save_checkpoint`` / ``load_checkpoint``, consolidated or sharded).

Every ``apply_*`` function is a pure "apply": explicit arguments, no planning, no environment reads,
no printing.
"""

from wrappers.checkpoint_io import load_checkpoint, save_checkpoint
from wrappers.wrap import Decision, wrap

__all__ = ["Decision", "load_checkpoint", "save_checkpoint", "wrap"]

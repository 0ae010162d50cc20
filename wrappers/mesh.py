"""The ``DeviceMesh`` of a ``ParallelDims`` and the submeshes each technique runs on.

``build_meshes(dims, device_type=...)`` makes one 4-D mesh with every dimension named, outermost
first (``advisor.mesh.DIM_NAMES``: dp_replicate, dp_shard, cp, tp; degree-1 dimensions included, so
every name always exists), with ``torch.distributed.device_mesh.init_device_mesh``, then hands out:

- ``tp``: the 1-D mesh tensor parallelism splits layers over (innermost: neighbouring ranks);
- ``cp``: the 1-D mesh context parallelism splits the sequence over;
- ``fsdp``: what FSDP2 ``fully_shard`` runs on. Parameters are sharded over dp_shard x cp (CP ranks
  hold different tokens but the same weights, so they shard the weights like data-parallel ranks,
  as torchtitan's ``dp_shard_cp`` does); 1-D, or 2-D ``(dp_replicate, dp_shard_cp)`` for HSDP,
  which FSDP2 reads as "replicate over dim 0, shard over dim 1";
- ``dp``: the ranks that read different batches (dp_replicate x dp_shard), for the loader's sampler.
  TP and CP ranks of one replica must see the same batch.

Flattened dimensions are built from the root once and kept here (``DeviceMesh._flatten``, the
method torchtitan uses; slicing a flattened name back out of the root is deprecated in PyTorch 2.11),
and only when two dimensions larger than one must become one. Reads no environment: the caller
initialised the process group (gloo on CPU, NCCL on CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from advisor.mesh import DIM_NAMES, ParallelDims


@dataclass(frozen=True)
class Meshes:
    """The root mesh of a ``ParallelDims`` and its submeshes (see the module docstring)."""

    dims: ParallelDims
    root: DeviceMesh
    tp: DeviceMesh
    cp: DeviceMesh
    fsdp: DeviceMesh
    dp: DeviceMesh

    @property
    def dp_rank(self) -> int:
        """This rank's index among the data-parallel ranks (its slice of the global batch)."""
        return self.dp.get_local_rank()


def _joined(root: DeviceMesh, outer: str, inner: str, name: str) -> DeviceMesh:
    """``outer`` x ``inner`` as one 1-D dimension; the larger alone when the other is 1 (nothing to flatten)."""
    if root[outer].size() == 1:
        return root[inner]
    if root[inner].size() == 1:
        return root[outer]
    return root[outer, inner]._flatten(name)


def build_meshes(dims: ParallelDims, *, device_type: str) -> Meshes:
    """The named 4-D mesh of ``dims`` on ``device_type`` ("cpu" over gloo, "cuda" over NCCL), and its submeshes."""
    if not dist.is_initialized():
        raise ValueError("build_meshes needs an initialised process group (torchrun / advisor launch, or "
                         "torch.distributed.init_process_group)")
    if dist.get_world_size() != dims.world_size:
        raise ValueError(f"the mesh {dims.label} has {dims.world_size} ranks but the process group has "
                         f"{dist.get_world_size()}")
    root = init_device_mesh(device_type, tuple(getattr(dims, n) for n in DIM_NAMES), mesh_dim_names=DIM_NAMES)
    shard_cp = _joined(root, "dp_shard", "cp", "dp_shard_cp")
    if dims.dp_replicate > 1:
        # HSDP: a 2-D mesh, replicate outer and shard inner. With cp == 1 a plain slice of the root.
        fsdp = root["dp_replicate", "dp_shard"] if dims.cp == 1 else root["dp_replicate", "dp_shard_cp"]
    else:
        fsdp = shard_cp
    dp = _joined(root, "dp_replicate", "dp_shard", "dp")
    return Meshes(dims=dims, root=root, tp=root["tp"], cp=root["cp"], fsdp=fsdp, dp=dp)


def resolve_dims(mesh: ParallelDims | dict | None, *, world_size: int, tp: int = 1, cp: int = 1,
                 hybrid: int = 1) -> ParallelDims:
    """The ``ParallelDims`` ``wrap()`` was given: one (or its dict, e.g. a plan's JSON, or a plan's
    recommendation carrying one as ``.mesh``), or the degrees ``tp`` / ``cp`` / ``hybrid``
    (dp_replicate), with dp_shard taking the remaining ranks."""
    if mesh is not None and not isinstance(mesh, (ParallelDims, dict)) and hasattr(mesh, "mesh"):
        mesh = mesh.mesh
    if mesh is not None:
        if (tp, cp, hybrid) != (1, 1, 1):
            raise ValueError("pass either mesh= or tp= / cp= / hybrid=, not both")
        dims = mesh if isinstance(mesh, ParallelDims) else ParallelDims.model_validate(mesh)
        if dims.world_size != world_size:
            raise ValueError(f"mesh {dims.label} is for {dims.world_size} ranks; this launch has {world_size}")
        return dims
    model_parallel = tp * cp * hybrid
    if model_parallel < 1 or world_size % model_parallel:
        raise ValueError(f"tp {tp} x cp {cp} x hybrid {hybrid} = {model_parallel} does not divide the "
                         f"{world_size} ranks of this launch")
    return ParallelDims(dp_replicate=hybrid, dp_shard=world_size // model_parallel, cp=cp, tp=tp,
                        world_size=world_size)

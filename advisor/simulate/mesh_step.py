"""One training step on a 2-D (or 4-D) device mesh, on fake tensors under a fake process group.

``simulate_mesh(model, dims=ParallelDims(...), training=..., micro_batch_size=...)`` is
``advisor.simulate.step.simulate`` for a ``ParallelDims`` layout: the same fake tensors, fake process
group of ``dims.world_size`` ranks, tracker (``FSDPMemTracker``) and categories, with the mesh
``wrap(mesh=...)`` builds (``wrappers.mesh.build_meshes``), tensor parallelism
(``wrappers.tensor_parallel``) and FSDP2 on the data-parallel submesh (``wrappers.fsdp``). This
process plays rank 0; every rank of a TP x FSDP mesh holds the same shapes, so its peak is each
rank's.

Two details of running DTensor under ``FakeTensorMode``: ``DeviceMesh`` reads its rank list back with
``tolist()``, which a fake tensor cannot answer, so the meshes are built outside the fake mode and
``fully_shard`` (which builds the joint dp x tp mesh for TP parameters) runs with the fake mode
unset; fake parameters keep dispatching to their own fake mode, so nothing real is allocated.
Context parallelism is not simulated (its ring attention needs CUDA SDPA kernels; see
``wrappers.tensor_parallel``), nor is sequence parallelism (not applied by ``wrap()``).
"""

from __future__ import annotations

import contextlib

import time

from pydantic import BaseModel, ConfigDict, Field

from advisor.mesh import ParallelDims
from advisor.training import TrainingConfig


class MeshStep(BaseModel):
    """Peak bytes of one rank during the measured step, by the simulator's categories."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    mesh: ParallelDims
    micro_batch_size: int
    seq_len: int
    params: int = Field(description="Sharded parameters (and buffers) held at the peak, bytes.")
    grads: int
    optimizer: int
    activations: int
    temporary: int = Field(description="Gathered parameters and gradients, collectives' buffers, temporaries.")
    wall_s: float

    @property
    def peak_bytes(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.temporary


def simulate_mesh(model: str | dict, *, dims: ParallelDims, training: TrainingConfig, micro_batch_size: int,
                  checkpointing: bool = False) -> MeshStep:
    """Measure one steady-state step of ``model`` on rank 0 of the ``dims`` mesh (see the module docstring)."""
    if dims.cp > 1:
        raise ValueError(f"cp {dims.cp}: context parallelism is not simulated (PyTorch's ring attention needs CUDA)")
    if training.precision == "bf16" or training.lora is not None:
        raise ValueError("the mesh simulation runs full fine-tuning in fp32 or a mixed precision")
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from advisor.simulate.cuda_kernels import cuda_softmax_backward
    from advisor.simulate.fake_env import (cuda_autocast_policy, cuda_dropout, cuda_kernels, fake_mode,
                                           fake_process_group, unpacked_batches)
    from advisor.simulate.measure import breakdown, dora_weight_unhooked, fast_peaks
    from wrappers.recipe import autocast_context
    from advisor.simulate.model import (build_optimizer, materialize, meta_model, net_vocab, resolve_config,
                                        unique_params)
    from wrappers.blocks import find_blocks
    from wrappers.checkpointing import apply_activation_checkpointing
    from wrappers.fsdp import apply_fsdp
    from wrappers.mesh import build_meshes
    from wrappers.tensor_parallel import apply_tensor_parallel

    start = time.perf_counter()
    name, cfg = resolve_config(model)
    net = meta_model(cfg, training)
    dims.check_model(num_attention_heads=net.config.num_attention_heads,
                     num_kv_heads=getattr(net.config, "num_key_value_heads", None) or net.config.num_attention_heads)
    with fake_process_group(dims.world_size):
        meshes = build_meshes(dims, device_type="cpu")
        # The contexts simulate() runs under: CUDA's autocast fp32 list, CUDA's dropout, SDPA kernel and
        # gradient sums, and no packed-sequence guess from fake position ids (which would build an s x s mask).
        with fake_mode(), cuda_autocast_policy(training), unpacked_batches(), cuda_dropout(), cuda_kernels(), \
                dora_weight_unhooked():
            materialize(net, device="cpu", real=False)
            net.train()
            apply_tensor_parallel(net, meshes.tp)
            if checkpointing:
                apply_activation_checkpointing(net, blocks=find_blocks(net),
                                               selective=training.activation_checkpointing == "selective")
            with unset_fake_temporarily():
                apply_fsdp(net, reshard_after_forward=True, precision=training.precision, cpu_offload=False,
                           mesh=meshes.fsdp)
            opt = build_optimizer([p for p in unique_params(net) if p.requires_grad], training)
            ids = torch.randint(0, int(net_vocab(cfg)), (micro_batch_size, training.seq_len))

            def step() -> None:
                # FSDP2 casts through its MixedPrecisionPolicy; accelerate autocasts too, which only TRL's chunked_nll
                # reads (simulate()'s _Step.micro runs the same)
                with autocast_context(training.precision, "cpu") if training.chunked_nll else contextlib.nullcontext():
                    loss = net(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            step()  # warm-up: optimizer state exists from here on, as in a steady state
            tracker = fast_peaks(FSDPMemTracker(net, opt))
            tracker.track_inputs((ids,))
            with tracker, cuda_softmax_backward():
                step()
            measured = breakdown(tracker)
    return MeshStep(model=name, mesh=dims, micro_batch_size=micro_batch_size, seq_len=training.seq_len,
                    **measured, wall_s=round(time.perf_counter() - start, 3))

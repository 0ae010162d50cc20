"""Pipeline parallelism: a decoder split into stages by layer, run by ``torch.distributed.pipelining``,
each stage split by tensor parallelism over ``tp`` and sharded with FSDP2 over the data-parallel ranks
of a ``["pp", "dp_replicate", "dp_shard", "tp"]`` mesh (degree-1 dimensions included).

The shape is torchtitan's (``pipeline_llm`` in ``torchtitan/distributed/pipeline_parallel.py`` cuts the
model parts, then calls ``parallelize_llama`` on each part: TP, then FSDP2):

1. ``split_decoder``: stage ``s`` of ``num_stages`` holds a contiguous run of decoder layers (an
   even split, or ``layers_per_stage``), the token embedding on the first stage, the final norm and
   the LM head on the last. Layers keep their index in the original model, so every parameter keeps its
   name (``model.layers.5.mlp.up_proj.weight``): a checkpoint of the stages is a checkpoint of the
   model. Tied input and output embeddings are refused (they would live on two stages).
2. Stages are placed on the ranks of the ``pp`` dimension: loop style (stage ``s`` on rank
   ``s % pp``) for GPipe, 1F1B and the interleaved schedules, V style (rank ``r`` holds stages ``r``
   and ``2 pp - 1 - r``) for ZBV and DualPipeV, as torchtitan's ``generate_llm_fqn_per_model_part``.
3. With ``tp > 1``, each stage is split by the whole model's TP plan (``wrappers.tensor_parallel``,
   the plan ``wrap()`` applies without a pipeline) restricted to the modules the stage holds: its
   layers' attention and MLP projections, the vocabulary-split embedding on the first stage and the
   head on the last (logits gathered over tp: ``colwise_gather_output``, no vocabulary-parallel loss,
   as without a pipeline). Hidden states between stages are whole on every TP rank (no sequence
   parallelism), and each TP rank talks to the same TP rank of the next stage (the ``pp`` group).
4. Each stage's layers, then the stage itself, are ``fully_shard``-ed on the data-parallel submesh:
   ``dp_shard``, or ``(dp_replicate, dp_shard)`` (HSDP: replicate outer, shard inner) when
   ``dp_replicate > 1``; over TP's ``DTensor`` shards when ``tp > 1`` (FSDP2 on the TP shards, as
   ``parallelize.apply_mesh``). ``reshard_after_forward=False``: torchtitan keeps a stage's parameters
   gathered across its micro-batches instead of gathering them once per micro-batch (its
   ``fsdp_reshard_after_forward="default"`` is ``not pp_enabled``).
5. A ``PipelineStage`` per stage on the ``pp`` process group, and one schedule object over this
   rank's stages. ``scale_grads`` stays on: gradients are the mean over micro-batches, so with
   ``causal_lm_loss`` (a mean over tokens) a step equals one process's step on the whole batch.

What runs here is checked on CPU over gloo (``tests/wrappers/test_pipeline.py``: pp x dp_shard;
``tests/wrappers/test_pipeline_tp.py``: pp x tp and pp x dp_replicate); which schedules
run there is in ``SCHEDULES``' ``cpu_checked``. Supported models: Hugging Face causal LMs of the
Llama shape (``model.model.{embed_tokens, layers, norm, rotary_emb}`` and ``model.lm_head``, one
rotary embedding for all layers); the stages chained in one process reproduce the whole model's
logits exactly for Llama, Qwen2 and Mixtral (the test), trained in a pipeline: Llama. Refused:
tied embeddings, sliding-window layers (each stage would need the sliding mask), other shapes.
A MoE decoder's router auxiliary loss is not added (the stages return logits only).

Not here: context parallelism inside a stage (its ring attention is entered around a step's forward
and backward, which the schedule runs), experts sharded over ep inside a stage, activation
checkpointing of the stages, and the planner's choice of schedule (``advisor``); ``apply_pipeline``
is told the degrees.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as pp_schedules

from wrappers.fsdp import apply_fsdp
from wrappers.tensor_parallel import apply_tensor_parallel

# The pipeline mesh's dimensions, outermost first (torchtitan's order, without cp).
PIPELINE_DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "tp")

@dataclass(frozen=True)
class ScheduleRow:
    """One pipeline schedule (``advisor.mesh``'s names): its ``torch.distributed.pipelining`` class and
    how its stages sit on ranks."""

    class_name: str | None  # None: torch.distributed.pipelining has no such schedule
    style: Literal["loop", "v"]
    min_stages_per_rank: int
    max_stages_per_rank: int | None  # None: no upper bound
    cpu_checked: bool  # trains to one-process parity on CPU/gloo: tests/wrappers/test_pipeline.py (1f1b,
    # interleaved_1f1b, zbv) or benchmarks/pipeline_schedules_cpu.py (gpipe, zb_h1 at 1 and 2 stages per
    # rank, dualpipev): max |diff| 8.6e-6 for every one, torch 2.13 CPU


SCHEDULES: dict[str, ScheduleRow] = {
    "gpipe": ScheduleRow("ScheduleGPipe", "loop", 1, 1, cpu_checked=True),
    "1f1b": ScheduleRow("Schedule1F1B", "loop", 1, 1, cpu_checked=True),
    "interleaved_1f1b": ScheduleRow("ScheduleInterleaved1F1B", "loop", 2, None, cpu_checked=True),
    # torch's interleaved zero bubble is the paper's ZB-1p (ScheduleInterleavedZeroBubble's docstring),
    # with one stage per rank or more
    "zb_h1": ScheduleRow("ScheduleInterleavedZeroBubble", "loop", 1, None, cpu_checked=True),
    "zb_h2": ScheduleRow(None, "loop", 1, 1, cpu_checked=False),
    "zb_2p": ScheduleRow(None, "loop", 1, 1, cpu_checked=False),  # the paper's auto-scheduled ZB-2p: no torch class
    "zbv": ScheduleRow("ScheduleZBVZeroBubble", "v", 2, 2, cpu_checked=True),
    "dualpipev": ScheduleRow("ScheduleDualPipeV", "v", 2, 2, cpu_checked=True),
}


def schedule_row(name: str, *, virtual_stages: int) -> ScheduleRow:
    """The row of ``name``; ``ValueError`` for an unknown name or a stage count the schedule cannot run."""
    if name not in SCHEDULES:
        raise ValueError(f"pipeline schedule {name!r} is not one of {', '.join(SCHEDULES)}")
    row = SCHEDULES[name]
    if row.class_name is None:
        raise ValueError(f"schedule {name}: torch.distributed.pipelining has no such schedule class")
    if row.max_stages_per_rank == 1 and virtual_stages != 1:
        raise ValueError(f"schedule {name} runs one stage per rank; use virtual_stages=1 or an interleaved schedule")
    if row.style == "v" and virtual_stages != 2:
        raise ValueError(f"schedule {name} runs exactly two stages per rank (a V); use virtual_stages=2")
    if virtual_stages < row.min_stages_per_rank:
        raise ValueError(f"schedule {name} interleaves several stages per rank; use virtual_stages >= "
                         f"{row.min_stages_per_rank}")
    return row


def stage_ids_of_rank(pp_rank: int, *, pp: int, virtual_stages: int, style: Literal["loop", "v"]) -> tuple[int, ...]:
    """The stages ``pp_rank`` holds (see the module docstring, step 2)."""
    if style == "v":
        return (pp_rank, 2 * pp - 1 - pp_rank)
    return tuple(pp_rank + v * pp for v in range(virtual_stages))


def split_layers(num_layers: int, num_stages: int, layers_per_stage: Sequence[int] | None = None) -> list[range]:
    """The decoder layers of each stage: ``layers_per_stage`` when given, else an even split."""
    if layers_per_stage is None:
        if num_layers % num_stages:
            raise ValueError(f"{num_stages} pipeline stages do not divide the model's {num_layers} decoder layers; "
                             "pass layers_per_stage for an uneven split")
        layers_per_stage = [num_layers // num_stages] * num_stages
    if len(layers_per_stage) != num_stages or sum(layers_per_stage) != num_layers or min(layers_per_stage) < 0:
        raise ValueError(f"layers_per_stage {list(layers_per_stage)} must give {num_stages} stages "
                         f"{num_layers} layers in all")
    starts = [sum(layers_per_stage[:s]) for s in range(num_stages)]
    return [range(start, start + count) for start, count in zip(starts, layers_per_stage)]


class DecoderStage(nn.Module):
    """Decoder layers of one stage, with the embedding (first stage) and final norm + head (last).

    Submodule names repeat the original model's (``model.layers.<index>``, ``model.norm``,
    ``lm_head``), so parameter names are the model's. Input: token ids on the first stage, hidden
    states elsewhere; output: logits on the last stage, hidden states elsewhere.
    """

    def __init__(self, model: nn.Module, layer_ids: range, *, first: bool, last: bool) -> None:
        super().__init__()
        inner = model.model
        self.config = model.config
        self.model = nn.Module()
        self.model.embed_tokens = inner.embed_tokens if first else None
        self.model.layers = nn.ModuleDict({str(i): inner.layers[i] for i in layer_ids})
        self.model.rotary_emb = copy.deepcopy(inner.rotary_emb)  # buffers only; one per stage
        self.model.norm = inner.norm if last else None
        self.lm_head = model.lm_head if last else None

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask

        hidden = self.model.embed_tokens(inputs) if self.model.embed_tokens is not None else inputs
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        # The mask the whole model would build (None under SDPA: causal by is_causal, as in the model). The cache
        # argument is `past_key_values` up to transformers 5.23 and `cache` from 5.24 (the old name warns, and goes
        # in 5.40): no cache either way.
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=None,
                                  position_ids=positions, **{_cache_argument(create_causal_mask): None})
        rotary = self.model.rotary_emb(hidden, position_ids=positions)
        for layer in self.model.layers.values():
            hidden = layer(hidden, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        if self.lm_head is not None:
            hidden = self.lm_head(self.model.norm(hidden))
        return hidden


@functools.cache
def _cache_argument(create_causal_mask) -> str:
    """The name ``create_causal_mask`` gives its cache argument in the installed transformers."""
    return "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


def _check_splittable(model: nn.Module) -> None:
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, n) for n in needed) or not hasattr(model, "lm_head"):
        raise ValueError(f"{type(model).__name__}: pipeline stages are cut from a causal LM with model.embed_tokens, "
                         "model.layers, model.norm, model.rotary_emb and lm_head (the Llama shape); this model differs")
    config = model.config
    if model.lm_head.weight is inner.embed_tokens.weight or getattr(config, "tie_word_embeddings", False):
        raise ValueError(f"{type(model).__name__} ties its input and output embeddings: the embedding sits on the "
                         "first pipeline stage and the head on the last, and one tensor cannot be on both; build it "
                         "with tie_word_embeddings=False (a copy of the embedding as the head) to pipeline it")
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        raise ValueError(f"{type(model).__name__} has sliding-window layers; pipeline stages build the full causal "
                         "mask only")


def split_decoder(model: nn.Module, stage_ids: Sequence[int], *, num_stages: int,
                  layers_per_stage: Sequence[int] | None = None) -> list[DecoderStage]:
    """This rank's stages (``stage_ids`` of ``num_stages``) of ``model``, sharing its modules."""
    _check_splittable(model)
    layers = split_layers(len(model.model.layers), num_stages, layers_per_stage)
    return [DecoderStage(model, layers[s], first=s == 0, last=s == num_stages - 1) for s in stage_ids]


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, the mean over tokens: what a Hugging Face causal LM computes from ``labels``."""
    shifted = logits[:, :-1].float()
    return F.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)


class RankModel(nn.Module):
    """This rank's part of the model under its original names: the state-dict view of its stages.

    ``save_checkpoint`` / ``load_checkpoint`` and the optimizer see one module holding exactly this
    rank's parameters, named as in the whole model; the stages share the modules.
    """

    def __init__(self, stages: Sequence[DecoderStage]) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleDict({k: v for s in stages for k, v in s.model.layers.items()})
        for stage in stages:
            for name in ("embed_tokens", "norm"):
                if getattr(stage.model, name) is not None:
                    setattr(self.model, name, getattr(stage.model, name))
            if stage.lm_head is not None:
                self.lm_head = stage.lm_head


@dataclass
class Pipeline:
    """What ``apply_pipeline`` built on this rank: its stages, the schedule, and the rank's model view."""

    stages: list[DecoderStage]
    pipeline_stages: list[PipelineStage]
    schedule: pp_schedules._PipelineSchedule
    rank_model: RankModel
    mesh: DeviceMesh
    stage_ids: tuple[int, ...]
    num_stages: int

    @property
    def dp_rank(self) -> int:
        """This rank's index among the data-parallel ranks (dp_replicate x dp_shard): its slice of the batch."""
        mesh = self.mesh
        return _dim_rank(mesh, "dp_replicate") * _dim_size(mesh, "dp_shard") + _dim_rank(mesh, "dp_shard")

    @property
    def has_first_stage(self) -> bool:
        return 0 in self.stage_ids

    @property
    def has_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stage_ids

    def step(self, input_ids: torch.Tensor) -> torch.Tensor | None:
        """Forward and backward of one batch (this data-parallel rank's), split into the schedule's
        micro-batches; the mean loss on the rank holding the last stage, None elsewhere. Every rank
        of the pp group passes the same ``input_ids`` (the first stage reads them, the last the labels)."""
        losses: list[torch.Tensor] = []
        args = (input_ids,) if self.has_first_stage else ()
        target = input_ids if self.has_last_stage else None
        self.schedule.step(*args, target=target, losses=losses)
        return torch.stack(losses).mean() if losses else None


def build_pipeline_mesh(*, pp: int, dp_shard: int, device_type: str, dp_replicate: int = 1,
                        tp: int = 1) -> DeviceMesh:
    """The ``PIPELINE_DIM_NAMES`` mesh, every name present (pp outer as torchtitan: stages across nodes,
    data parallelism inside, tp innermost on neighbouring ranks)."""
    return init_device_mesh(device_type, (pp, dp_replicate, dp_shard, tp), mesh_dim_names=PIPELINE_DIM_NAMES)


def _dim_size(mesh: DeviceMesh, name: str) -> int:
    return mesh[name].size() if name in (mesh.mesh_dim_names or ()) else 1


def _dim_rank(mesh: DeviceMesh, name: str) -> int:
    return mesh[name].get_local_rank() if name in (mesh.mesh_dim_names or ()) else 0


def _fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """What FSDP2 shards a stage over: dp_shard, or (dp_replicate, dp_shard) for HSDP."""
    return mesh["dp_replicate", "dp_shard"] if _dim_size(mesh, "dp_replicate") > 1 else mesh["dp_shard"]


def apply_pipeline(model: nn.Module, mesh: DeviceMesh, *, schedule: str = "1f1b", virtual_stages: int = 1,
                   num_microbatches: int, device: torch.device, layers_per_stage: Sequence[int] | None = None,
                   loss_fn=causal_lm_loss) -> Pipeline:
    """Split ``model`` into ``pp x virtual_stages`` stages, keep this rank's, split them over
    ``mesh["tp"]`` (when the mesh has one of size > 1), shard them with FSDP2 over the data-parallel
    dimensions and build the schedule (see the module docstring). Build the optimizer on
    ``pipeline.rank_model`` afterwards (TP and FSDP2 replaced the parameters)."""
    row = schedule_row(schedule, virtual_stages=virtual_stages)
    pp = mesh["pp"].size()
    num_stages = pp * virtual_stages
    if num_microbatches < pp:
        raise ValueError(f"{num_microbatches} micro-batches cannot fill {pp} pipeline ranks; use at least {pp}")
    stage_ids = stage_ids_of_rank(mesh["pp"].get_local_rank(), pp=pp, virtual_stages=virtual_stages, style=row.style)
    stages = split_decoder(model, stage_ids, num_stages=num_stages, layers_per_stage=layers_per_stage)
    rank_model = RankModel(stages)
    fsdp_mesh = _fsdp_mesh(mesh)
    for stage in stages:
        stage.to(device)
        if _dim_size(mesh, "tp") > 1:
            apply_tensor_parallel(stage, mesh["tp"], plan_of=model)
        apply_fsdp(stage, reshard_after_forward=False, precision="fp32", cpu_offload=False, mesh=fsdp_mesh,
                   blocks=list(stage.model.layers.values()))
    group = mesh["pp"].get_group()
    pipeline_stages = [PipelineStage(stage, s, num_stages, device, group=group) for stage, s in zip(stages, stage_ids)]
    cls = getattr(pp_schedules, row.class_name)
    single = issubclass(cls, pp_schedules.PipelineScheduleSingle)
    runner = cls(pipeline_stages[0] if single else pipeline_stages, n_microbatches=num_microbatches,
                 loss_fn=loss_fn, scale_grads=True)
    return Pipeline(stages=stages, pipeline_stages=pipeline_stages, schedule=runner, rank_model=rank_model,
                    mesh=mesh, stage_ids=stage_ids, num_stages=num_stages)

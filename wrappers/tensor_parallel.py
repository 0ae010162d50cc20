"""Tensor parallelism (``parallelize_module``) and the context-parallel step context.

The TP plan, in order of preference:

1. the model's own: transformers puts one on the config (``config.base_model_tp_plan``, keys relative
   to the base model, e.g. ``layers.*.self_attn.q_proj: colwise``) and one on the head class
   (``model._tp_plan``, e.g. ``lm_head: colwise_gather_output``). Their string styles are
   transformers' names; we translate the ones with a plain PyTorch equivalent to
   ``torch.distributed.tensor.parallel`` styles and refuse the rest (``ValueError`` naming them);
2. otherwise a plan derived from the linear layers' names (Megatron-LM's split, Shoeybi et al. 2019,
   section 3): q/k/v/gate/up column-wise (each rank owns whole heads and a slice of the MLP width),
   o/down row-wise (partial sums all-reduced).

What stays replicated over the TP dimension: norms (no sequence parallelism here, so norm inputs are
whole on every TP rank and their gradients agree without a reduction), the embedding in the derived
plan, and the embedding and head when their weight is tied (one parameter cannot be placed twice).
transformers' plan splits the embedding by vocabulary (``embedding_rowwise``) and the head by
vocabulary with the logits gathered (``colwise_gather_output``: the loss sees whole logits; a
vocabulary-parallel loss is not implemented).

Attention modules: transformers >= 5 reshape with ``-1`` heads (``view(*shape, -1, head_dim)``) and
keep ``num_key_value_groups`` as a ratio, which TP leaves unchanged, so no module attribute needs
editing. A module that still stores ``num_heads`` / ``num_key_value_heads`` gets them divided by tp.

Context parallelism is not a module transform in PyTorch: ``context_parallel(cp_mesh, buffers=...)``
is entered around each step's forward and backward, shards the sequence buffers and replaces SDPA
with ring attention. Its ring kernels are CUDA's flash / memory-efficient SDPA
(``torch.distributed.tensor.experimental._context_parallel._attention``); on CPU ``context_parallel_step``
raises ``ValueError`` instead of pretending. The step's buffers come from
``prepare_context_parallel_input`` (torchtitan's ``prepare_context_parallel_input`` in
``torchtitan/distributed/context_parallel/api.py``: positions sharded with the tokens, labels shifted
before sharding): a rank holds chunks of the sequence that are not contiguous (the head-tail split),
so a model left to shift labels would pair a chunk's last token with the next chunk held by the rank,
and default positions would restart at 0 in every shard.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

# transformers' style names with a plain PyTorch equivalent (transformers.integrations.tensor_parallel).
_STYLES = {
    "colwise": lambda: ColwiseParallel(),
    "rowwise": lambda: RowwiseParallel(),
    "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
    # Vocabulary split of an embedding: token ids whole on every rank, partial outputs all-reduced.
    "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
}
# Leaf names of the derived plan (Llama, Mistral, Qwen, Gemma and most decoders name them so).
_COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROWWISE = ("o_proj", "down_proj")
# Attributes an attention module may hold as head counts (older transformers, custom code).
_HEAD_ATTRS = ("num_heads", "num_key_value_heads", "num_attention_heads")


def _tied_head(model: nn.Module) -> bool:
    """The head's weight is the input embedding's (one parameter)."""
    head = getattr(model, "get_output_embeddings", lambda: None)()
    embed = getattr(model, "get_input_embeddings", lambda: None)()
    return head is not None and embed is not None and head.weight is embed.weight


def transformers_plan(model: nn.Module) -> dict[str, str]:
    """The model's own transformers TP plan as ``{module pattern: style name}``, full names; empty if none.

    transformers >= 5 composes it on the instance (``model._tp_plan``: the head's plan plus the base
    model's, prefixed); older versions keep the base part on the config only.
    """
    plan = dict(getattr(model, "_tp_plan", None) or {})
    config = getattr(model, "config", None)
    base = dict(getattr(config, "base_model_tp_plan", None) or {})
    prefix = getattr(model, "base_model_prefix", "")
    if prefix and hasattr(model, prefix):
        base = {f"{prefix}.{key}": style for key, style in base.items()}
    plan = {**base, **plan}
    if not base and not any(style != "colwise_gather_output" for style in plan.values()):
        return {}  # only a head plan: not enough to split the blocks
    if _tied_head(model):
        # One parameter cannot be placed twice: a tied embedding and head stay replicated over TP.
        head, embed = model.get_output_embeddings(), model.get_input_embeddings()
        tied = {name for name, module in model.named_modules() if module is head or module is embed}
        plan = {key: style for key, style in plan.items() if key not in tied}
    return plan


def derived_plan(model: nn.Module) -> dict[str, str]:
    """A plan from the linear layers' names: q/k/v/gate/up column-wise, o/down row-wise."""
    plan = {}
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, nn.Linear) and leaf in _COLWISE + _ROWWISE:
            plan[name] = "colwise" if leaf in _COLWISE else "rowwise"
    return plan


def resolve_plan(model: nn.Module) -> tuple[dict[str, ParallelStyle], str]:
    """The PyTorch styles for every module the plan names, and where the plan came from."""
    named, source = transformers_plan(model), "the model's transformers TP plan"
    if not named:
        named, source = derived_plan(model), "a plan derived from the linear layer names"
    unknown = sorted({style for style in named.values() if style not in _STYLES})
    if unknown:
        raise ValueError(f"tensor parallelism: {source} uses styles with no plain PyTorch equivalent here: "
                         f"{', '.join(unknown)}")
    modules = [name for name, _ in model.named_modules()]
    styles = {}
    for pattern, style in named.items():
        for name in fnmatch.filter(modules, pattern):
            styles[name] = _STYLES[style]()
    if not styles:
        raise ValueError(f"tensor parallelism: {source} matches no module of {type(model).__name__}")
    return styles, source


def _divide_head_counts(model: nn.Module, styles: dict[str, ParallelStyle], tp: int) -> None:
    """Divide stored head counts of modules whose projections were split (see the module docstring)."""
    parents = {name.rsplit(".", 1)[0] for name in styles if "." in name}
    for name in parents:
        module = model.get_submodule(name)
        for attr in _HEAD_ATTRS:
            count = getattr(module, attr, None)
            if isinstance(count, int) and not isinstance(count, bool):
                if count % tp:
                    raise ValueError(f"tensor parallelism {tp} does not divide {name}.{attr} = {count}")
                setattr(module, attr, count // tp)


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, *,
                          plan_of: nn.Module | None = None) -> tuple[str, tuple[str, ...]]:
    """Split ``model``'s layers over ``tp_mesh`` in place; returns where the plan came from and the
    names of the modules it split.

    ``plan_of``: the whole model when ``model`` is a part of it whose submodules keep the whole
    model's names (a pipeline stage, ``wrappers.pipeline.DecoderStage``): the plan is the whole
    model's (its transformers plan lives on the head class and the config, not on the part),
    restricted to the modules the part holds.
    """
    if tp_mesh.size() == 1:
        return "no tensor parallelism", ()
    whole = model if plan_of is None else plan_of
    config = getattr(whole, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    for what, count in (("attention heads", heads), ("key/value heads", kv_heads)):
        if count is not None and count % tp_mesh.size():
            raise ValueError(f"tp {tp_mesh.size()} does not divide the model's {count} {what}")
    styles, source = resolve_plan(whole)
    if plan_of is not None:
        held = {name for name, _ in model.named_modules()}
        styles = {name: style for name, style in styles.items() if name in held}
        if not styles:
            return source, ()
    parallelize_module(model, tp_mesh, styles)
    _divide_head_counts(model, styles, tp_mesh.size())
    return source, tuple(styles)


def context_parallel_step(cp_mesh: DeviceMesh, buffers: Sequence[torch.Tensor],
                          seq_dims: Sequence[int]) -> contextlib.AbstractContextManager:
    """The context to run one step's forward and backward under CP (a no-op for cp == 1).

    ``buffers`` are the sequence-shaped tensors of the step, sharded in place along ``seq_dims``: pass
    ``prepare_context_parallel_input(...).buffers`` and ``.seq_dims`` (ids, positions and labels shifted
    before sharding; see the module docstring for why raw labels are wrong). The model must use SDPA with a causal mask and no
    explicit attention mask. ``ValueError`` on a CPU mesh: PyTorch's ring attention is CUDA-only.
    """
    if cp_mesh.size() == 1:
        return contextlib.nullcontext()
    if cp_mesh.device_type != "cuda":
        raise ValueError(f"context parallelism (cp {cp_mesh.size()}) needs CUDA: PyTorch's ring attention "
                         "(torch.distributed.tensor.experimental.context_parallel) dispatches only the CUDA "
                         "flash / memory-efficient / cuDNN SDPA kernels; on a "
                         f"{cp_mesh.device_type} mesh use cp=1")
    from torch.distributed.tensor.experimental import context_parallel

    return context_parallel(cp_mesh, buffers=list(buffers), buffer_seq_dims=list(seq_dims))


class ContextParallelInput(NamedTuple):
    """One step's sequence tensors for CP, all ``(batch, seq)``, aligned token by token: ``buffers`` for
    ``context_parallel_step`` (sharded together, in place), ``model_kwargs`` for the model's forward."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    shift_labels: torch.Tensor  # what each position predicts: labels shifted left by one, -100 last
    num_items_in_batch: torch.Tensor  # counted targets of the whole (unsharded) batch / cp

    @property
    def buffers(self) -> list[torch.Tensor]:
        return [self.input_ids, self.position_ids, self.shift_labels]

    @property
    def seq_dims(self) -> list[int]:
        return [1, 1, 1]

    @property
    def model_kwargs(self) -> dict[str, torch.Tensor]:
        """transformers' ``ForCausalLMLoss`` takes ``shift_labels`` as they are (``labels`` only switches
        the loss on) and divides the summed loss by ``num_items_in_batch``; so does ``wrappers.losses``."""
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "labels": self.shift_labels,
                "shift_labels": self.shift_labels, "num_items_in_batch": self.num_items_in_batch}


def prepare_context_parallel_input(input_ids: torch.Tensor, labels: torch.Tensor | None = None, *, cp: int,
                                   position_ids: torch.Tensor | None = None) -> ContextParallelInput:
    """The step's tensors, ready for ``cp``-way sharding: explicit positions (``0 .. seq-1`` unless
    given), labels (``input_ids`` unless given) shifted here, before any shard boundary exists, and
    the loss's divisor: each CP rank sums its shard's losses and FSDP averages gradients over the
    ``cp`` ranks, so dividing by ``count / cp`` gives the mean over the whole sequence (also when a
    shard holds more ``-100`` than another). New tensors: ``context_parallel`` resizes them in place."""
    from wrappers.losses import causal_targets

    if input_ids.ndim != 2:
        raise ValueError(f"prepare_context_parallel_input: input_ids must be (batch, seq), not {tuple(input_ids.shape)}")
    labels = input_ids if labels is None else labels
    if position_ids is None:
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    shift_labels = causal_targets(labels).contiguous()
    count = (shift_labels != -100).sum().clamp(min=1)
    return ContextParallelInput(input_ids.clone(), position_ids.clone(), shift_labels, count / cp)

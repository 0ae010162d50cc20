"""Recipes: the training stacks users run (``profiles/recipes.json``), one validated row each.

A recipe holds the facts of a stack that change memory and time and that the user does not spell
out: the optimizer's implementation (fused / foreach / for-loop, and so its step temporaries), the
dtype a LoRA/QLoRA frozen base is held in, the default loss, the engine it runs on. Every fact cites
the framework source it was read from (the JSON's ``sources``). ``--recipe NAME`` picks a row;
``TrainingConfig.recipe`` carries it to the estimators, the simulator and ``wrap()``, which read its
fields instead of branching on framework names.

This module is the edge where the file is read (as ``advisor.calibration``); the Literal types the
rows use live here so ``advisor.training`` and the rows agree on one spelling.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from advisor.precision import Precision
from profiles import PROFILES_DIR

# A device mesh's dimensions (advisor.mesh.ParallelDims), in torchtitan's order.
MeshDim = Literal["pp", "dp_replicate", "dp_shard", "cp", "tp", "ep"]

Engine = Literal["torch", "deepspeed"]
LossKernel = Literal["hf", "chunked", "fused"]
OptimizerImpl = Literal["fused", "foreach", "for-loop"]
FrozenBase = Literal["compute", "param"]
ZeroGrad = Literal["before_forward", "before_backward"]
AccumulationSync = Literal["every_micro_batch", "last_micro_batch"]
ReduceDtype = Literal["fp32", "compute"]
RecipeName = Literal["torch", "trainer", "lightning", "torchtitan", "deepspeed", "torchtune"]
ChunkedLogits = Literal["loss", "model", "checkpointed"]
DEFAULT_RECIPE: RecipeName = "torch"
ZeroDefaultsSource = Literal["deepspeed", "accelerate", "lightning"]
_FACTS = ("optimizer_impl", "frozen_base", "loss", "engine", "kv_cache")
_ZERO_FACTS = ("ipg_buffers_overlap_comm", "ipg_buffers_stage3", "partition_grads_in_backward", "step_grad_copies",
               "sub_group_size", "stage3_grad_buffer")


class ZeroSettings(BaseModel):
    """DeepSpeed ``zero_optimization`` values a user's own config fixes (``advisor plan --from`` a DeepSpeed
    JSON or an accelerate file: ``advisor.planning.config_formats``). A field left None takes the
    planner's value, the one our DeepSpeed export writes (``advisor.estimate.buckets``: accelerate's
    ``"auto"`` fill, ``overlap_comm`` on). What a launcher's file runs when it writes none of them:
    ``zero_config_defaults``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reduce_bucket_size: int | None = Field(default=None, gt=0, description="Elements reduced per IPG bucket.")
    allgather_bucket_size: int | None = Field(default=None, gt=0, description="Elements all-gathered at a time "
                                              "(ZeRO-1/2).")
    stage3_prefetch_bucket_size: int | None = Field(default=None, ge=0, description="Elements prefetched (ZeRO-3).")
    stage3_max_live_parameters: int | None = Field(default=None, gt=0, description="Gathered elements kept "
                                                   "(ZeRO-3).")
    sub_group_size: int | None = Field(default=None, gt=0, description="Elements the ZeRO-3 step takes at once.")
    overlap_comm: bool | None = Field(default=None, description="ZeRO-1/2: a second IPG buffer overlaps the "
                                      "reduce with backward.")


class ZeroFacts(BaseModel):
    """What DeepSpeed's ZeRO optimizers allocate beyond the ZeRO paper's 2 + 2 + 12 bytes a parameter
    (``advisor.estimate.zero_buffers`` turns them into bytes). Bucket sizes are not here: the export
    writes them and ``advisor.estimate.buckets.deepspeed_buckets`` owns them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ipg_buffers_overlap_comm: int = Field(ge=1, description="ZeRO-1/2 IPG buffers of reduce_bucket_size elements "
                                          "in backward with overlap_comm on (our export's setting).")
    ipg_buffers_stage3: int = Field(ge=1, description="ZeRO-3 IPG buffers of reduce_bucket_size elements, "
                                    "held from initialisation on.")
    partition_grads_in_backward: bool = Field(description="ZeRO-2 holds the rank's gradient partition flat "
                                              "(contiguous gradients) from its first gradient in backward.")
    step_grad_copies: bool = Field(description="The step flattens the gradient partition into a new tensor "
                                   "and casts it to fp32, and the optimizer steps that one flat tensor.")
    sub_group_size: int = Field(gt=0, description="ZeRO-3 steps the partition in sub-groups of this many "
                                "elements (DeepSpeed's default; our export leaves it unset).")
    stage3_grad_buffer: bool = Field(description="ZeRO-3 holds the gradient partition in one flat buffer "
                                     "allocated at initialisation (never freed).")
    sources: dict[str, str] = Field(description="Fact name -> the DeepSpeed source it was read from.")

    @model_validator(mode="after")
    def _cited(self) -> "ZeroFacts":
        missing = [fact for fact in _ZERO_FACTS if not self.sources.get(fact)]
        if missing:
            raise ValueError(f"zero facts: no source for {', '.join(missing)}")
        return self


class Recipe(BaseModel):
    """One training stack's facts (see the module docstring); each one has a cited source."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: RecipeName
    summary: str = Field(description="One line: what the stack is.")
    engine: Engine = Field(description="The engine it runs on unless --engine says otherwise.")
    engines: tuple[Engine, ...] = Field(min_length=1, description="Engines the stack can drive.")
    optimizer_impl: OptimizerImpl = Field(description="How its AdamW/Adam steps: fused (one kernel, in place), "
                                          "foreach (one state-sized temporary), for-loop (per-tensor temporaries).")
    frozen_base: FrozenBase = Field(description="dtype of a LoRA/QLoRA frozen base under mixed precision: compute "
                                    "(loaded in bf16/fp16, as from_pretrained's dtype='auto' does) or param "
                                    "(the precision's parameter dtype, fp32). Adapters stay in the parameter dtype.")
    loss: LossKernel = Field(description="The loss kernel it runs unless --loss says otherwise.")
    sources: dict[str, str] = Field(description="Fact name -> the framework source it was read from.")
    zero: ZeroFacts | None = Field(default=None, description="DeepSpeed ZeRO's own buffers, read from its source "
                                   "(the deepspeed row; they are the engine's, so every recipe on --engine deepspeed "
                                   "plans with them: recipes.deepspeed_zero_facts).")
    zero_grad: ZeroGrad = Field(default="before_forward", description="When the loop frees the previous step's "
                                "gradients: before the forward (after the optimizer step, or first thing in the "
                                "step), or only before the backward, so they live through the forward and the loss.")
    accumulation_sync: AccumulationSync = Field(
        default="every_micro_batch", description="How its loop accumulates gradients over micro-batches: "
        "every_micro_batch (gradients reduced, FSDP's shards accumulated, after each backward) or last_micro_batch "
        "(FSDP's gradient sync switched off until the last micro-batch, so each unit keeps its unsharded gradient "
        "in the compute dtype; DDP's no_sync holds what it holds anyway). advisor.estimate.accumulation.")
    fsdp_reduce_dtype: ReduceDtype = Field(
        default="fp32", description="The dtype FSDP2 reduce-scatters gradients in under mixed precision "
        "(MixedPrecisionPolicy.reduce_dtype): fp32 (wrap()'s and torchtitan's policy) or compute (bf16/fp16, "
        "accelerate's); the shards are then cast to the parameters' fp32. Sizes the reduce-scatter input and its "
        "traffic (advisor.estimate.strategy_buffers.fsdp2_reduce_bytes).")
    tp_sequence_parallel: bool = Field(default=False, description="Its tensor parallelism shards the norms and the "
                                       "residual stream along the sequence (Korthikanti et al. 2022); False: the "
                                       "norms and block inputs are whole on every TP rank (transformers' TP plans).")
    tp_loss_parallel: bool = Field(default=False, description="Its TP head keeps the logits vocabulary-sharded into "
                                   "a vocabulary-parallel cross-entropy; False: gathered over the vocabulary "
                                   "(transformers' colwise_gather_output head).")
    autocast_cache: bool = Field(default=True, description="Its autocast keeps the bf16 copy of each weight that "
                                 "requires grad until the autocast region ends (torch.autocast's default "
                                 "cache_enabled=True); False: a copy lives only where autograd saved it.")

    shard_experts_on_dim1: bool = Field(default=False, description="Its FSDP2 shards a MoE layer's stacked routed "
                                        "experts on dim 1 when the shard world exceeds their number (torchtitan's "
                                        "rule; advisor.estimate.strategy_buffers.expert_shard_padding); False: "
                                        "fully_shard's dim 0, padded to world x ceil(E / world) rows.")
    compile_loss: bool = Field(default=False, description="Under --compile it compiles the loss function too, so "
                               "inductor fuses the cross-entropy (advisor.estimate.activations_loss.compiled_loss_bytes); "
                               "False: only the blocks are compiled, the loss runs eager.")
    precisions: tuple[Precision, ...] | None = Field(
        default=None, min_length=1, description="The precisions the stack can train in, its default first (torchtune "
        "builds the whole model in cfg.dtype and has no autocast: bf16 or fp32); None: every one, bf16-mixed by "
        "default.")
    chunked_logits: ChunkedLogits | None = Field(
        default=None, description="Its own chunked cross-entropy, run for --loss chunked: loss (the loss projects "
        "each chunk of hidden states through the head and computes its cross-entropy, torchtune's "
        "LinearCrossEntropyLoss) or model (the model returns every chunk's logits, which the loss then reads, "
        "torchtune's CEWithChunkedOutputLoss before May 2025); under --compile with compile_loss each chunk's "
        "cross-entropy is compiled (advisor.estimate.activations_loss.chunked_loss_bytes); checkpointed (the loss "
        "projects each 256-token chunk through the whole head under torch.utils.checkpoint, recomputed in backward: "
        "TRL SFTTrainer's loss_type chunked_nll, advisor.estimate.activations_loss.chunked_nll_bytes). None: the "
        "stack has no chunked loss of its own; --loss chunked is wrappers.losses' kernel, run eager.")
    kv_cache: bool = Field(default=False, description="Its loop leaves a Hugging Face model's KV cache on in "
                           "training (config.use_cache, under a checkpointing that does not turn it off); the "
                           "estimate then counts it (advisor.estimate.kv_cache). False: the stack turns it off.")

    mesh_dims: tuple[MeshDim, ...] | None = Field(
        default=None, min_length=1, description="The mesh dimensions (a degree above 1) its own loop runs beside "
        "plain data parallelism, as its configuration expresses them; the planner searches and accepts no other. None: "
        "every one (the planner's own layouts: wrap() runs dp_replicate, dp_shard, cp and tp; pipeline and expert "
        "meshes are torchtitan's, written with --format torchtitan).")

    def runs_mesh_dim(self, dim: MeshDim) -> bool:
        """Whether its loop runs ``dim`` above 1 (``mesh_dims``)."""
        return self.mesh_dims is None or dim in self.mesh_dims

    torch_strategies: tuple[str, ...] | None = Field(
        default=None, min_length=1, description="The data-parallel strategies (advisor.strategies) its own loop runs "
        "on the torch engine across GPUs, as its configuration expresses them; the others are unavailable in its "
        "plans (one GPU runs the plain model under every stack; DeepSpeed's stages come from the strategy table). "
        "None: every one (wrap() applies them all).")
    kbit_upcast: bool = Field(default=True, description="QLoRA: its loop runs PEFT's prepare_model_for_kbit_training, "
                              "which casts the unquantised base to fp32 (TRL then casts the embeddings and head of a "
                              "4-bit model back to bf16 and keeps the norms fp32), so under mixed precision the norms' "
                              "outputs, the 4-bit linears' outputs (bitsandbytes' Linear4bit returns its input's "
                              "dtype) and the residual stream from the first block's MLP on are fp32. False: the base "
                              "rests in the bf16 it was loaded in, and so does the residual stream.")
    fsdp_root_reshards: bool = Field(default=True, description="Under ZeRO-3 the unit that holds the head (FSDP2's "
                                     "root, with the embedding and final norm, where the stack wraps them together) "
                                     "is asked to reshard after forward too, which torch >= 2.8 honours "
                                     "(library_releases.json fsdp2_root_reshards_after_forward): the loss backward "
                                     "gathers it again. False: it stays unsharded from its forward to its backward "
                                     "(torchtune's root; torchtitan's norm + head unit under its default policy).")
    fsdp_outer_units: bool = Field(default=False, description="FSDP2: the token embedding is a unit of its own, "
                                   "resharded after its forward as the blocks are, and the final norm with the head "
                                   "another (torchtitan's apply_fsdp), which FSDP2 reshards at its post-backward, "
                                   "before the blocks' backward: neither is held through the blocks. False: the root "
                                   "unit holds the embedding, norm and head (wrap(), accelerate, torchtune).")
    pure_adapters_fp32: bool = Field(default=False, description="Under a pure precision (bf16) it never casts the "
                                     "model, so a LoRA model's adapters stay in the fp32 PEFT gives them "
                                     "(get_peft_model's autocast_adapter_dtype) beside the bf16 base, and with no "
                                     "autocast each adapter computes in fp32: PEFT casts its input to lora_A's dtype "
                                     "and autograd saves that copy (or its dropout output). False: the stack casts the "
                                     "whole module, adapters included (wrap()'s model.to, Lightning's bf16-true, "
                                     "DeepSpeed, torchtune's default dtype).")
    fused_loss_in_place: bool = Field(
        default=False, description="Its --loss fused is Liger's fused linear cross-entropy (the Trainer's "
        "use_liger_kernel): a trained head's gradient accumulated in the head's own dtype (torch.zeros_like(weight), "
        "addmm in place) and backward scaling the kept gradients in place. False: wrappers.losses' kernel (an fp32 "
        "accumulator, then a copy in the head's dtype, scaled out of place in backward).")
    trl_kbit: bool = Field(
        default=False, description="It prepares a 4-bit / 8-bit LoRA model as TRL's SFTTrainer does, which changed in "
        "TRL 0.26 (library_releases.json trl_sft_keeps_kbit_base_in_bf16): --trl-release 0.26 or later keeps the base "
        "in bf16 and trains bf16 adapters (TrainingConfig.trl_bf16_trainables); otherwise the preparation this row's "
        "kbit_upcast and kbit_casts_copies cite. False: the stack's own preparation on every release.")
    kbit_casts_copies: bool = Field(
        default=False, description="Over a 4-bit base under bf16 its loop casts PEFT's modules_to_save copies of the "
        "embedding and head to bf16 with the originals (TRL's peft_module_casting_to_bf16 after get_peft_model, on a "
        "base it does not shard), so they train in bf16 with bf16 gradients and AdamW state; the adapters stay fp32. "
        "False: the copies keep PEFT's dtype (the parameters' under mixed precision).")
    checkpoints_via_transformers: bool = Field(
        default=False, description="Its activation checkpointing is transformers' gradient_checkpointing_enable() "
        "with no kwargs, reentrant before transformers 5.0.0 (library_releases.json "
        "gradient_checkpointing_non_reentrant; TrainingConfig.reentrant_checkpointing). False: torch's non-reentrant "
        "checkpoint whatever the release (wrappers.checkpointing, torchtitan, torchtune, Lightning's FSDP wrapper).")
    adapter_units: bool = Field(default=False, description="Under FSDP its LoRA adapters get FSDP units of their "
                                "own (PEFT's fsdp_auto_wrap_policy), so a block's unit holds only the frozen base: "
                                "FSDP1 gives it no gradient and leaves it in its loaded dtype. False: a block's "
                                "unit holds its adapters too (advisor.estimate.fsdp1_buffers).")

    def __hash__(self) -> int:  # rows are unique by name (RecipeTable); ``sources`` is a dict
        return hash(self.name)

    @model_validator(mode="after")
    def _cited(self) -> "Recipe":
        missing = [fact for fact in _FACTS if not self.sources.get(fact)]
        if self.zero_grad != "before_forward" and not self.sources.get("zero_grad"):
            missing.append("zero_grad")
        if self.accumulation_sync != "every_micro_batch" and not self.sources.get("accumulation_sync"):
            missing.append("accumulation_sync")
        if self.fsdp_reduce_dtype != "fp32" and not self.sources.get("fsdp_reduce_dtype"):
            missing.append("fsdp_reduce_dtype")
        if not self.autocast_cache and not self.sources.get("autocast_cache"):
            missing.append("autocast_cache")
        if not self.fsdp_root_reshards and not self.sources.get("fsdp_root_reshards"):
            missing.append("fsdp_root_reshards")
        if not self.kbit_upcast and not self.sources.get("kbit_upcast"):
            missing.append("kbit_upcast")
        missing += [fact for fact in ("tp_sequence_parallel", "tp_loss_parallel", "shard_experts_on_dim1", "fsdp_outer_units",
                                      "adapter_units", "pure_adapters_fp32", "chunked_logits", "compile_loss", "precisions",
                                      "torch_strategies", "checkpoints_via_transformers", "kbit_casts_copies", "trl_kbit",
                                      "fused_loss_in_place", "mesh_dims")
                    if getattr(self, fact) and not self.sources.get(fact)]
        if missing:
            raise ValueError(f"recipe {self.name}: no source for {', '.join(missing)}")
        if self.engine not in self.engines:
            raise ValueError(f"recipe {self.name}: engine {self.engine} is not among its engines {self.engines}")
        return self


class RecipeTable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    description: str
    recipes: tuple[Recipe, ...]

    @model_validator(mode="after")
    def _every_name_once(self) -> "RecipeTable":
        names = [r.name for r in self.recipes]
        if sorted(names) != sorted(get_args(RecipeName)):
            raise ValueError(f"recipes.json must hold each of {get_args(RecipeName)} once, holds {names}")
        return self


@lru_cache(maxsize=1)
def load_recipes() -> dict[str, Recipe]:
    """Every recipe by name, validated (``profiles/recipes.json``)."""
    table = RecipeTable.model_validate(json.loads((PROFILES_DIR / "recipes.json").read_text()))
    return {r.name: r for r in table.recipes}


def deepspeed_zero_facts() -> ZeroFacts | None:
    """What DeepSpeed's ZeRO optimizers allocate: the deepspeed row's ``zero`` facts, which are the engine's, so
    they hold under any recipe on ``--engine deepspeed`` (``advisor.estimate.zero_buffers``)."""
    return load_recipes()["deepspeed"].zero


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; ValueError naming the choices otherwise."""
    recipes = load_recipes()
    key = name.strip().lower()
    if key not in recipes:
        raise ValueError(f"unknown recipe '{name[:40]}'; choose one of {', '.join(recipes)}")
    return recipes[key]


@lru_cache(maxsize=None)
def zero_config_defaults(source: ZeroDefaultsSource) -> ZeroSettings:
    """The ZeRO values a run gets from ``source`` when its file fixes none (profiles/zero_defaults.json):
    DeepSpeed's own config defaults, what accelerate's inline ``deepspeed_config`` leaves to them, or
    Lightning's ``DeepSpeedStrategy`` keyword defaults."""
    rows = json.loads((PROFILES_DIR / "zero_defaults.json").read_text())["defaults"]
    return ZeroSettings(**rows[source]["values"])

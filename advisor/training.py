"""``TrainingConfig``: how the model will be trained (optimizer, precision, batch, checkpointing).

One validated object; the estimators read it and never see CLI options. Byte sizes that follow
from these choices (bytes per parameter, per gradient, per optimizer state) are properties here,
so every estimator agrees on them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator, model_validator

from advisor.calibration import Margin, allocator_overhead
from advisor.model.block_profile import CheckpointMode
from advisor.model.lora import LoraConfig
from advisor.model.releases import behaviour_in, is_release
from advisor.precision import FP32, Precision, PrecisionInfo, precision_info
from advisor.recipes import (DEFAULT_RECIPE, AccumulationSync, Engine, FrozenBase, LossKernel, OptimizerImpl, Recipe,
                             ZeroSettings, get_recipe)
from advisor.units import GIB

# adamw-8bit-paged: bitsandbytes' PagedAdamW8bit, its 8-bit moments in CUDA managed memory (advisor.estimate.in_backward).
Optimizer = Literal["adamw", "adam", "sgd", "sgd-momentum", "adafactor", "adamw-8bit", "adamw-8bit-paged"]
Checkpointing = Literal["auto", CheckpointMode]  # the request: auto lets the planner choose the mode
Attention = Literal["sdpa", "eager"]
Policy = Literal["thresholds", "fastest"]
Quantization = Literal["nf4", "fp4", "int8"]
MAX_SEQ_LEN = 1 << 22  # the longest --seq-len accepted (4M tokens)
# The largest --global-batch accepted, in samples: a thousand times the largest published (Llama 3 405B's 16M tokens a
# step are 2,048 samples of 8,192), so it refuses only a typo (1e12 accumulation steps planned a 10^11-second step)
MAX_GLOBAL_BATCH = 1 << 24
MAX_MICRO_BATCH = 1 << 16  # the largest --micro-batch accepted


# --activation-offload is planned under checkpointing only (advisor.estimate.activation_offload).
OFFLOAD_NEEDS_CHECKPOINTING = (
    "--activation-offload is planned under activation checkpointing (torchtune refuses it without: "
    "enable_activation_offloading needs enable_activation_checkpointing); without checkpointing every saved tensor "
    "crosses PCIe and a node's own (an eager attention's s x s probabilities) comes back whole, which is not "
    "modelled: use --activation-checkpointing on, selective or auto")


def _release_field(description: str):
    """An optional library release (``--torch-release 2.7.1``), left out of the JSON unless set."""
    return Field(default=None, exclude_if=lambda release: release is None, description=description)


class TrainingConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    optimizer: Optimizer = Field(default="adamw", description="Optimizer; decides optimizer-state bytes.")
    precision: Precision = Field(default="bf16-mixed", description="Parameter and compute dtypes.")
    seq_len: int = Field(default=2048, ge=1, le=MAX_SEQ_LEN, description="Tokens per sample.")
    micro_batch_size: int | None = Field(default=None, ge=1, le=MAX_MICRO_BATCH, description="Per-GPU batch; None: largest that fits.")
    global_batch_size: int | None = Field(default=None, ge=1, le=MAX_GLOBAL_BATCH, description="Samples per optimizer step (gradient accumulation).")
    activation_checkpointing: Checkpointing = Field(default="auto", description="Per-block recompute: "
                                                 "on (full), selective (keep attention and every other matmul), off, auto.")
    engine: Engine = Field(default="torch", description="What runs the strategy: torch or deepspeed.")
    attention: Attention = Field(default="sdpa", description="SDPA/flash (no s^2 term) or eager.")
    # Defaults calibrated on real H100 runs (profiles/allocator_overhead.json, advisor.calibration).
    reserve_gib: float = Field(default_factory=lambda: allocator_overhead().allocator_constant_gib, ge=0, le=1024,
                               description="Fixed runtime overhead per GPU (default: the allocator's calibrated constant).")
    fragmentation: float = Field(default_factory=lambda: allocator_overhead().fragmentation, ge=0, le=1,
                                 description="Reserved over allocated - 1 (default: calibrated; more under "
                                             "checkpointing, checkpointing_fragmentation, unless given).")
    checkpointing_fragmentation: float = Field(default_factory=lambda: allocator_overhead().checkpointing_fragmentation,
                                               ge=0, le=1, description="Added to fragmentation where a plan recomputes "
                                               "its blocks (default: calibrated); none where fragmentation is given.")
    fit_fragmentation: float | None = Field(default=None, ge=0, le=1, exclude_if=lambda share: share is None,
                                            description="The part of fragmentation that must fit; the allocator frees "
                                            "the rest, cached blocks, before an allocation fails (allocator_cache, in "
                                            "reserved only). None: all of it.")
    context_gib: float | None = Field(default=None, ge=0, le=64, description="CUDA context, cuBLAS/NCCL workspaces and "
                                      "communicator buffers per GPU, outside PyTorch's caching allocator "
                                      "(max_memory_reserved() does not see it, the GPU's memory does; measured on an "
                                      "H100 at world size 1, assumed for other GPUs). "
                                      "None: by the GPU count (profiles/allocator_overhead.json: the CUDA context "
                                      "alone on one GPU, with NCCL's buffers on more).")
    margin: Margin = Field(default="expected", description="Which end of the estimate's measured range decides "
                           "whether a plan fits: low, expected or high.")
    policy: Policy = Field(default="thresholds", description="How to choose among candidates that fit.")
    headroom: float = Field(default=0.10, ge=0, lt=1, description="Share of GPU memory a comfortable plan leaves "
                            "free. Not a fit test (a plan fits when peak + runtime overhead <= memory): among plans "
                            "as fast as the chosen one, one that leaves this headroom is preferred.")
    cpu_memory_gib: float | None = Field(default=None, gt=0, le=2**20, allow_inf_nan=False,
                                         description="CPU RAM per node (offload check).")
    cpu_step_rate: float | None = Field(default=None, ge=1e3, le=1e13, allow_inf_nan=False, exclude_if=lambda r: r is None,
                                        description="Parameters a second one process's optimizer steps on the CPU "
                                                    "(offload), as measured on the user's host (benchmarks/"
                                                    "cpu_optimizer.py); None: the measured default "
                                                    "(profiles/efficiency.json).")
    target_len: int | None = Field(default=None, ge=1, le=MAX_SEQ_LEN, description="Decoder tokens per sample "
                                   "(encoder-decoder models); None: equal to seq_len.")
    images_per_sample: int = Field(default=0, ge=0, le=4096, description="Images in each sample (vision-language "
                                   "models): their tokens join the language model's sequence.")
    image_size: int = Field(default=448, ge=1, le=16384, description="Assumed image side in pixels: tokens per "
                            "image = (image_size / pixels per image token)^2.")
    lora: LoraConfig | None = Field(default=None, description="LoRA/DoRA adapters train, the base is frozen.")
    loss: LossKernel = Field(default="hf", description="hf: full logits and an fp32 copy; chunked: head and "
                             "cross-entropy over 8 chunks; fused: linear + cross-entropy, no logits kept.")
    quantize: Quantization | None = Field(default=None, description="bitsandbytes base weights (QLoRA): nf4 or fp4 "
                                          "(4-bit, bnb_4bit_quant_type) or int8 (LLM.int8); needs lora.")
    double_quant: bool = Field(default=True, description="4-bit: quantise the absmax too "
                               "(bnb_4bit_use_double_quant, QLoRA's default).")
    # The default recipe is left out of the JSON so plans made before recipes existed read the same.
    recipe: Recipe = Field(default_factory=lambda: get_recipe(DEFAULT_RECIPE),
                           exclude_if=lambda recipe: recipe.name == DEFAULT_RECIPE,
                           description="The training stack (profiles/recipes.json): its optimizer implementation, "
                                       "frozen-base dtype, default loss and engine.")
    zero: ZeroSettings | None = Field(default=None, exclude_if=lambda zero: zero is None,
                                      description="DeepSpeed bucket sizes and overlap a user's config fixes; None: "
                                                  "the planner's (what advisor export writes).")
    # FSDP2 (fully_shard) is the default and left out of the JSON, so every plan made before reads the same.
    fsdp_version: Literal[1, 2] = Field(default=2, exclude_if=lambda version: version == 2,
                                        description="Which FSDP a sharded torch strategy runs: 2 (fully_shard, "
                                                    "per-parameter DTensor shards) or 1 (FullyShardedDataParallel "
                                                    "with flat parameters, as accelerate's fsdp_version: 1 runs it); "
                                                    "wrap() and the exports apply FSDP2 either way.")
    # Off by default and left out of the JSON, so plans made before it read the same (advisor.estimate.kv_cache).
    use_cache: bool = Field(default=False, exclude_if=lambda keep: not keep,
                            description="The model builds its KV cache in training (config.use_cache left on) under "
                                        "a checkpointing that does not turn it off: torch's checkpoint_wrapper as "
                                        "Lightning's and accelerate's FSDP activation checkpointing apply it. False: "
                                        "the cache is off or costs nothing (advisor.estimate.kv_cache).")
    # Off by default and left out of the JSON, so plans made before it read the same (advisor.estimate.compile_time).
    compile: bool = Field(default=False, exclude_if=lambda on: not on,
                          description="torch.compile (inductor) on each decoder block: its fused elementwise "
                                      "kernels move fewer HBM bytes (advisor.estimate.compile_time); a block "
                                      "without checkpointing (bf16, or under autocast) saves fewer activations "
                                      "(advisor.estimate.compile_memory), other memory is estimated as eager.")
    optimizer_impl: OptimizerImpl | None = Field(default=None, exclude_if=lambda impl: impl is None,
                                                 description="fused, foreach or for-loop; None: the recipe's "
                                                             "(optimizer_implementation).")
    frozen_base: FrozenBase | None = Field(default=None, exclude_if=lambda held: held is None,
                                           description="The dtype a LoRA model's frozen base is loaded in under mixed "
                                                       "precision: compute (bf16 / fp16) or param (fp32: TRL's "
                                                       "ModelConfig dtype default float32); None: the recipe's "
                                                       "(frozen_base_dtype).")
    accumulation_sync: AccumulationSync | None = Field(
        default=None, exclude_if=lambda sync: sync is None,
        description="How gradients are accumulated over micro-batches: every_micro_batch (reduced after each "
                    "backward; the Trainer with accelerator_config's gradient_accumulation_kwargs sync_each_batch) "
                    "or last_micro_batch (FSDP sync off until the last; the Trainer's default); None: the recipe's "
                    "(accumulation_mode, advisor.estimate.accumulation).")
    # Off by default and left out of the JSON, so plans made before them read the same (advisor.estimate.float8_time).
    float8: bool = Field(default=False, exclude_if=lambda on: not on,
                         description="torchao float8 training (Float8Linear, tensorwise dynamic scaling) on the blocks' "
                                     "linear layers: their three GEMMs at the GPU's fp8 peak, plus the casts.")
    float8_all_gather: bool = Field(default=False, exclude_if=lambda on: not on,
                                    description="With float8: FSDP all-gathers the converted weights in fp8 "
                                                "(torchao enable_fsdp_float8_all_gather), 1 byte a weight.")
    # Off by default and left out of the JSON, so plans made before it read the same (advisor.estimate.in_backward).
    optimizer_in_backward: bool = Field(default=False, exclude_if=lambda on: not on,
                                        description="Each parameter is stepped by a post-accumulate-grad hook as its "
                                                    "gradient is ready, and the gradient freed (torchtune's "
                                                    "optimizer_in_bwd): no full gradient buffer. One GPU, no "
                                                    "gradient accumulation.")

    # Off by default and left out of the JSON, so plans made before it read the same
    # (advisor.estimate.activation_offload).
    activation_offload: bool = Field(default=False, exclude_if=lambda on: not on,
                                     description="Saved activations go to CPU memory in forward and come back in "
                                                 "backward (torchtune's enable_activation_offloading, TRL's "
                                                 "activation_offloading): each checkpointed block's input (needs "
                                                 "activation checkpointing); the output head's and the loss's stay.")

    # Library releases: each left out of the JSON unless set, so plans made before its option read the same
    # (bitsandbytes: advisor.estimate.optimizer_8bit; the others: profiles/library_releases.json).
    bitsandbytes: str | None = _release_field("The bitsandbytes release an 8-bit optimizer's state is counted for (its "
                                              "absmax block, profiles/bitsandbytes_optimizers.json); None: the "
                                              "installed release, else the newest.")
    torch_release: str | None = _release_field("The torch release the run uses, where a release changes what is "
                                               "allocated (profiles/library_releases.json: FSDP2's root resharded "
                                               "after forward since 2.8.0); None: the newest release's behaviour.")
    transformers_release: str | None = _release_field("The transformers release the run uses, where a release changes "
                                                      "what is allocated (profiles/library_releases.json: "
                                                      "gradient_checkpointing_enable() non-reentrant since 5.0.0); "
                                                      "None: the newest release's behaviour.")
    trl_release: str | None = _release_field("The TRL release the run uses, where a release changes what is allocated "
                                             "(profiles/library_releases.json: SFTTrainer keeps a k-bit base in bf16 "
                                             "and casts the adapters to bf16 since 0.26.0); None: the preparation the "
                                             "trainer recipe cites (prepare_model_for_kbit_training, as TRL before "
                                             "0.26 and PEFT's QLoRA examples run it).")

    @field_validator("bitsandbytes", "torch_release", "transformers_release", "trl_release")
    @classmethod
    def _release_number(cls, value: str | None) -> str | None:
        if value is not None and not is_release(value):
            raise ValueError(f"{value!r} is not a release number (major.minor[.patch], e.g. 2.7.1)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _recipe_defaults(cls, data: object) -> object:
        """A recipe given by name is loaded; it sets the engine, the loss and (where it trains in fixed precisions)
        the precision unless they are given."""
        if not isinstance(data, dict) or data.get("recipe") is None:
            return data
        recipe = data["recipe"] if isinstance(data["recipe"], Recipe) else get_recipe(str(data["recipe"]))
        fixed = {"precision": recipe.precisions[0]} if recipe.precisions else {}
        filled = {"engine": recipe.engine, "loss": recipe.loss, **fixed, **data, "recipe": recipe}
        if filled["engine"] not in recipe.engines:
            raise ValueError(f"recipe {recipe.name} runs on {' or '.join(recipe.engines)}, not --engine {filled['engine']}")
        if recipe.precisions and filled["precision"] not in recipe.precisions:
            raise ValueError(f"recipe {recipe.name} trains in {' or '.join(recipe.precisions)} (the whole model in one "
                             f"dtype, no autocast), not --precision {filled['precision']}")
        return filled

    @field_serializer("recipe")
    def _recipe_name(self, recipe: Recipe) -> str:
        return recipe.name

    @field_validator("activation_checkpointing", mode="before")
    @classmethod
    def _checkpointing_bool(cls, value: object) -> object:
        """``True`` / ``False``: on / off, as ``wrap()`` reads them."""
        return {True: "on", False: "off"}[value] if isinstance(value, bool) else value

    @field_validator("lora", mode="before")
    @classmethod
    def _rank_alone(cls, value: object) -> object:
        """``lora=16``: rank 16 on PEFT's default targets."""
        return LoraConfig(rank=value) if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _check(self) -> "TrainingConfig":
        if self.frozen_base is not None and (self.lora is None or self.quantize is not None):
            raise ValueError("--frozen-base sets the dtype of a LoRA model's frozen base: give it with --lora and "
                             "without --quantize (a quantised base has its own bytes)")
        if self.float8_all_gather and not self.float8:
            raise ValueError("--float8-all-gather needs --float8")
        clash = [flag for flag, bad in (("--lora", self.lora is not None), ("--quantize", self.quantize is not None),
                                        (f"--engine {self.engine}", self.engine != "torch"),
                                        (f"--precision {self.precision}", self.precision not in ("bf16-mixed", "bf16")))
                 if bad and self.float8]
        if clash:
            raise ValueError("--float8 is modelled for full training in bf16 or bf16-mixed on the torch engine "
                             f"(torchao float8 training as torchtitan runs it), not with {' or '.join(clash)}")
        if self.activation_offload and self.activation_checkpointing == "off":
            raise ValueError(OFFLOAD_NEEDS_CHECKPOINTING)
        if self.activation_offload and self.engine != "torch":
            raise ValueError("--activation-offload is modelled on the torch engine (torchtune's and TRL's saved-tensor "
                             "hooks); DeepSpeed offloads activations only through its own checkpointing "
                             "(cpu_checkpointing), which is not modelled")
        if self.global_batch_size is not None and self.micro_batch_size is not None:
            if self.global_batch_size < self.micro_batch_size:
                raise ValueError(
                    f"--global-batch {self.global_batch_size} is smaller than --micro-batch {self.micro_batch_size}"
                )
        return self

    @property
    def accumulation_mode(self) -> AccumulationSync:
        """How gradients are accumulated: ``accumulation_sync`` when given, else the recipe's."""
        return self.accumulation_sync or self.recipe.accumulation_sync

    @property
    def optimizer_implementation(self) -> OptimizerImpl:
        """How the optimizer steps: ``optimizer_impl`` when given, else the recipe's."""
        return self.optimizer_impl or self.recipe.optimizer_impl

    @property
    def frozen_base_dtype(self) -> FrozenBase:
        """The dtype a LoRA model's frozen base is held in: ``frozen_base`` when given, else the recipe's."""
        return self.frozen_base or self.recipe.frozen_base

    @property
    def keeps_kv_cache(self) -> bool:
        """The model's KV cache is built in training: ``--use-cache``, or a recipe whose loop leaves it on
        (``Recipe.kv_cache``; every row turns it off, profiles/recipes.json)."""
        return self.use_cache or self.recipe.kv_cache

    @property
    def fsdp_root_regathered(self) -> bool:
        """FSDP2's unit that holds the head is resharded after forward and gathered again as the loss backward
        begins: the stack asks for it (``Recipe.fsdp_root_reshards``) and the torch release honours it for the root
        (profiles/library_releases.json ``fsdp2_root_reshards_after_forward``, torch >= 2.8)."""
        return self.recipe.fsdp_root_reshards and behaviour_in("fsdp2_root_reshards_after_forward", self.torch_release)

    @property
    def trl_prepares_kbit(self) -> bool:
        """TRL's SFTTrainer prepares this model (``Recipe.trl_kbit``): a 4-bit or 8-bit base with LoRA."""
        return self.recipe.trl_kbit and self.quantize is not None and self.lora is not None

    @property
    def trl_bf16_trainables(self) -> bool:
        """TRL 0.26 or later prepares this k-bit LoRA model (``Recipe.trl_kbit``, --trl-release): the base stays in the
        bf16 it was loaded in and every trainable parameter is cast to bf16 (profiles/library_releases.json
        ``trl_sft_keeps_kbit_base_in_bf16``); modelled under bf16-mixed on the torch engine."""
        return (self.trl_prepares_kbit and self.trl_release is not None and behaviour_in("trl_sft_keeps_kbit_base_in_bf16", self.trl_release)
                and self.precision == "bf16-mixed" and self.engine == "torch")

    @property
    def kbit_upcast(self) -> bool:
        """The stack upcasts a k-bit model's unquantised base to fp32 (``Recipe.kbit_upcast``), unless TRL 0.26 or
        later prepares it (``trl_bf16_trainables``)."""
        return self.recipe.kbit_upcast and not self.trl_bf16_trainables

    @property
    def copies_in_compute_dtype(self) -> bool:
        """PEFT's modules_to_save copies of the embedding and head train in the compute dtype: the recipe casts them
        over a 4-bit base under bf16-mixed (``Recipe.kbit_casts_copies``: TRL's peft_module_casting_to_bf16); only
        where the base is not sharded (TRL skips the cast for FSDP / ZeRO-3 QLoRA: checked by the states)."""
        return (self.recipe.kbit_casts_copies and self.quantize in ("nf4", "fp4") and self.precision == "bf16-mixed"
                and self.engine == "torch" and self.lora is not None and bool(self.lora.modules_to_save)
                and not self.trl_bf16_trainables)  # TRL 0.26+: every trainable parameter in bf16 already

    @property
    def reentrant_checkpointing(self) -> bool:
        """Activation checkpointing runs reentrant: the stack checkpoints through transformers'
        gradient_checkpointing_enable() (``Recipe.checkpoints_via_transformers``) and the transformers release is
        before 5.0.0 (profiles/library_releases.json ``gradient_checkpointing_non_reentrant``)."""
        return (self.recipe.checkpoints_via_transformers
                and not behaviour_in("gradient_checkpointing_non_reentrant", self.transformers_release))

    @property
    def grads_kept_as_zeros(self) -> bool:
        """The loop's zero_grad() fills the gradients with zeros instead of freeing them, so every gradient stays
        allocated through the next step's forward and backward: torch before 2.0 (profiles/library_releases.json
        ``zero_grad_sets_to_none``) on the torch engine; a gradient stepped and freed in its backward hook
        (``optimizer_in_backward``) is never kept."""
        return (self.engine == "torch" and not self.optimizer_in_backward
                and not behaviour_in("zero_grad_sets_to_none", self.torch_release))

    @property
    def low_precision_base(self) -> bool:
        """A LoRA model's frozen base is held in the compute dtype (bf16 under bf16-mixed), the adapters in
        the parameter dtype: the recipe loads the base as the checkpoint's dtype (``frozen_base: compute``)
        and PEFT upcasts only the adapters. The torch engine under mixed precision; a quantised base
        has its own bytes (``advisor.estimate.quantized``) and DeepSpeed casts the whole module. FSDP1 flattens
        each unit's parameters into one tensor of one dtype (torch/distributed/fsdp/_flat_param.py
        ``_validate_tensors_to_flatten``: "Must flatten tensors with uniform dtype") and accelerate upcasts a
        16-bit flat parameter that requires grad to fp32 under mixed precision (accelerate/accelerator.py
        ``prepare_model``): where a block's unit holds its adapters too, the base rests in fp32 there; where the
        recipe gives the adapters units of their own (``Recipe.adapter_units``: the Trainer's PEFT wrap policy),
        the base's units require no grad and stay as loaded."""
        return self.base_dtype_counts and self.frozen_base_dtype == "compute"

    @property
    def base_dtype_counts(self) -> bool:
        """The dtype a LoRA base is loaded in decides its bytes (``frozen_base_dtype``; see ``low_precision_base``):
        adapters on an unquantised base, mixed precision on the torch engine, and no FSDP1 unit flattening the base
        with its adapters (which accelerate upcasts to fp32 whatever the base was loaded in)."""
        return (self.lora is not None and self.mixed and self.quantize is None and self.engine == "torch"
                and (self.fsdp_version == 2 or self.recipe.adapter_units))

    @property
    def base_dtype_ignored(self) -> str | None:
        """Why a ``frozen_base`` that was given changes nothing in this plan, else None."""
        if self.frozen_base is None or self.base_dtype_counts:
            return None
        if self.engine == "deepspeed":
            return "DeepSpeed casts the whole module to the compute dtype"
        if not self.mixed:
            return f"the plan holds every weight in {self.precision_info.param_dtype}"
        return "FSDP1 flattens each block's base with its adapters and accelerate upcasts the unit to fp32"

    @property
    def keeps_peft_fp32_adapters(self) -> bool:
        """A LoRA model trained in a pure 16-bit precision by a stack that never casts the model
        (``Recipe.pure_adapters_fp32``): PEFT's fp32 adapters stay fp32, whether or not the estimate models them
        (``fp32_adapters``)."""
        return (self.lora is not None and not self.mixed and self.precision != "fp32"
                and self.recipe.pure_adapters_fp32)

    @property
    def fp32_adapters(self) -> bool:
        """A LoRA model trained in a pure 16-bit precision by a stack that never casts the model
        (``Recipe.pure_adapters_fp32``: HF Trainer): PEFT's adapters stay fp32 beside the 16-bit base and compute in
        fp32 (no autocast), so their weights, gradients and optimizer state are fp32 and each saves an fp32 copy of
        its input. Not modelled (counted as bf16 adapters, which the LoRA note says): a quantised base
        (``advisor.estimate.quantized``) and PEFT's ``modules_to_save`` copies, which PEFT does not upcast."""
        return (self.keeps_peft_fp32_adapters and self.quantize is None and not self.lora.modules_to_save
                and self.engine == "torch")

    @property
    def trainable_param_bytes(self) -> int:
        """Bytes of one trainable parameter (and of its gradient): fp32 for ``fp32_adapters``, the compute dtype's
        where TRL 0.26+ casts them (``trl_bf16_trainables``), else ``param_bytes``."""
        if self.trl_bf16_trainables:
            return self.compute_bytes
        return FP32 if self.fp32_adapters else self.param_bytes

    @property
    def frozen_param_bytes(self) -> int:
        """Bytes of one frozen base parameter of a LoRA model on the torch engine (see ``low_precision_base``)."""
        return self.compute_bytes if self.low_precision_base else self.param_bytes

    @property
    def precision_info(self) -> PrecisionInfo:
        """The precision table's row: bytes, dtypes and every framework's spelling."""
        return precision_info(self.precision)

    @property
    def mixed(self) -> bool:
        return self.precision_info.mixed

    @property
    def chunked_nll(self) -> bool:
        """--loss chunked is TRL's chunked_nll here (``Recipe.chunked_logits`` "checkpointed": the trainer recipe):
        each 256-token chunk of the head and its cross-entropy under torch.utils.checkpoint, recomputed in backward
        (``advisor.estimate.activations_loss.chunked_nll_bytes``)."""
        return self.loss == "chunked" and self.recipe.chunked_logits == "checkpointed"

    @property
    def param_bytes(self) -> int:
        """Bytes of one stored parameter (mixed precision keeps fp32 parameters in the torch recipe)."""
        return self.precision_info.param_bytes

    @property
    def compute_bytes(self) -> int:
        """Bytes of one activation element in matmuls (bf16/fp16 unless fp32)."""
        return self.precision_info.compute_bytes

    @property
    def reserve_bytes(self) -> int:
        return int(self.reserve_gib * GIB)

    def gap_fraction(self, checkpointing: bool) -> float:
        """The allocator's gap over the peak in reserved, as a fraction of it: ``fragmentation``, and under
        checkpointing ``checkpointing_fragmentation`` more (a recomputed block's tensors are allocated again between
        gradients of other sizes; profiles/allocator_overhead.json), at most 1; unless ``fragmentation`` was given
        without it: then as given (a configuration read back from a plan's JSON carries both, and keeps the term)."""
        given = self.model_fields_set
        if not checkpointing or ("fragmentation" in given and "checkpointing_fragmentation" not in given):
            return self.fragmentation
        return min(1.0, self.fragmentation + self.checkpointing_fragmentation)

    def fit_fraction(self) -> float:
        """The part of ``fragmentation`` that must fit: ``fit_fragmentation`` (at most ``fragmentation``), the caching
        allocator freeing the rest, cached blocks (``allocator_cache``), before an allocation fails; all of it where
        not given (profiles/allocator_overhead.json capped_fit_fragmentation: what runs under a cap support)."""
        if self.fit_fragmentation is None:
            return self.fragmentation
        return min(self.fragmentation, self.fit_fragmentation)

    def recompute_fraction(self, checkpointing: bool) -> float:
        """The part of ``gap_fraction`` that is the cache around recomputation (``recompute_cache``: in reserved,
        not in what must fit); 0 where ``gap_fraction`` is ``fragmentation`` alone."""
        return self.gap_fraction(checkpointing) - self.fragmentation

    def context_gib_at(self, world: int, gpu: str = "") -> float:
        """What sits outside the caching allocator per GPU: --context-gib when given; else, on one GPU (one
        process, no NCCL communicator) the CUDA context alone, on more the context and NCCL's buffers
        (profiles/allocator_overhead.json: measured for the GPU kinds in its measured_context, NCCL's buffers at
        world size 1 only; assumed for the others)."""
        if self.context_gib is not None:
            return self.context_gib
        return allocator_overhead().context_for(gpu, nccl=world > 1)

    def context_bytes_at(self, world: int, gpu: str = "") -> int:
        return int(self.context_gib_at(world, gpu) * GIB)

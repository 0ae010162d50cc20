"""``ModelSpec``: what the estimators need to know about a model, validated once.

Counts are exact parameter counts (shared parameters once), split into components so that the
memory model can place them: input embeddings, one transformer block (all blocks are identical in
the supported families), the output head (0 when tied to the embeddings), and everything else
(final norm, position embeddings, pooler). Shape fields drive the activation model; they are
``None`` when only a size is known (``--params 7.5B``) or when the model lacks them: no
``vocab_size`` for a model without token embeddings (ViT, ResNet, Wav2Vec2, CLIP, any plain
``nn.Module``), no attention heads for Mamba. ``advisor.estimate.activations.shape_of`` decides
from what is present how activations are modelled, and its note says what is assumed or left out.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from advisor.frozen import validated_copy
from advisor.model.block_profile import BlockProfile
from advisor.model.heads import TaskHead
from advisor.model.kinds import EncDecFacts, SsmFacts, VisionFacts
from advisor.model.linear_layout import LinearLayout
from advisor.model.llava import ClipTowerFacts
from advisor.model.hybrid import HybridFacts
from advisor.model.moe import MlaFacts, MoeFacts

MAX_PARAMS = 10**15  # a thousand times the largest published models: a bound, so no count overflows a float
Source = Literal["bundled", "local", "hub", "params", "module"]
CountMethod = Literal["formula", "meta_device", "module", "given"]


class ModelSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Hub id, path or label the user gave.")
    source: Source = Field(description="Where the description came from.")
    count_method: CountMethod = Field(description="How the counts were obtained.")
    architecture: str | None = Field(default=None, description="Model class, e.g. Qwen2ForCausalLM.")
    model_type: str | None = Field(default=None, description="Hugging Face model_type.")
    total_params: int = Field(gt=0, le=MAX_PARAMS, description="All parameters, shared ones counted once.")
    trainable_params: int = Field(ge=0, description="Parameters that receive gradients.")
    embedding_params: int | None = Field(default=None, ge=0, description="Input token embeddings.")
    layer_params: int | None = Field(default=None, ge=0, description="One transformer block.")
    head_params: int | None = Field(default=None, ge=0, description="Output head; 0 when tied.")
    other_params: int | None = Field(default=None, ge=0, description="Final norm, positions, pooler.")
    tied_embeddings: bool | None = Field(default=None, description="Head shares the embedding matrix.")
    num_layers: int | None = Field(default=None, ge=1, description="Transformer blocks.")
    hidden_size: int | None = Field(default=None, ge=1, description="Model width.")
    num_attention_heads: int | None = Field(default=None, ge=1, description="Query heads.")
    num_kv_heads: int | None = Field(default=None, ge=1, description="Key/value heads (GQA).")
    head_dim: int | None = Field(default=None, ge=1, description="Width of one attention head.")
    intermediate_size: int | None = Field(default=None, ge=1, description="MLP inner width (one expert).")
    vocab_size: int | None = Field(default=None, ge=1, description="Vocabulary size.")
    gated_mlp: bool | None = Field(default=None, description="SwiGLU/GeGLU-style MLP (3 matrices).")
    num_experts: int | None = Field(default=None, ge=1, description="MoE experts per layer; None: dense.")
    num_experts_per_token: int | None = Field(default=None, ge=1, description="Experts active per token.")
    expert_params: int | None = Field(default=None, ge=0, description="One expert in one layer.")
    moe: MoeFacts | None = Field(default=None, description="Dense layers, shared experts, router kind (MoE).")
    mla: MlaFacts | None = Field(default=None, description="Multi-head latent attention widths (DeepSeek).")
    image_token_pixels: int | None = Field(default=None, ge=1, description="Side in pixels of one image token "
                                           "(vision-language: patch x spatial merge); None: no images.")
    tokens_per_image: int | None = Field(default=None, ge=1, description="Language-model tokens of one image "
                                         "whatever its size (Llava: images resized to the tower's side); None: "
                                         "image_token_pixels decides.")
    vision: VisionFacts | ClipTowerFacts | None = Field(default=None, description="Vision tower widths "
                                                        "(Qwen2.5-VL; Llava's CLIP tower and projector).")
    ssm: SsmFacts | None = Field(default=None, description="State-space mixer widths (Mamba).")
    encdec: EncDecFacts | None = Field(default=None, description="Encoder and decoder depths, feed-forward kind (T5).")
    hybrid: HybridFacts | None = Field(default=None, description="Per-layer attention / Mamba and MoE / MLP pattern (Jamba).")
    max_position_embeddings: int | None = Field(default=None, ge=1, description="Longest context.")
    learned_positions: bool = Field(default=False, exclude_if=lambda learned: not learned,
                                    description="Absolute positions from a learned table of max_position_embeddings "
                                                "rows (GPT-2, BERT, BART): no longer input runs.")
    sliding_window: int | None = Field(default=None, ge=1, exclude_if=lambda window: window is None,
                                       description="Sliding-window attention span of every layer (tokens); "
                                                   "None: full causal attention.")
    one_op_mlp_act: bool = Field(default=False, exclude_if=lambda one_op: not one_op,
                                 description="GPT-2 family: the MLP activation is one torch op that saves a "
                                             "single intermediate-wide tensor ('gelu', 'gelu_pytorch_tanh', "
                                             "'relu'); False: GPT-2's default gelu_new (Python ops).")
    no_residual_dropout: bool = Field(default=False, exclude_if=lambda none: not none,
                                      description="GPT-2 family: resid_pdrop is 0, so the blocks' two dropouts "
                                                  "return their input and save no mask.")
    no_embedding_dropout: bool = Field(default=False, exclude_if=lambda none: not none,
                                       description="GPT-2 family: embd_pdrop is 0, so the embeddings' dropout "
                                                   "saves no mask.")
    attn_softcap: bool = Field(default=False, exclude_if=lambda capped: not capped,
                               description="Attention scores soft-capped, cap * tanh(scores / cap) (Gemma 2).")
    logit_softcap: bool = Field(default=False, exclude_if=lambda capped: not capped,
                                description="Output logits soft-capped, cap * tanh(logits / cap) (Gemma 2).")
    sequential_residual: bool = Field(default=False, exclude_if=lambda sequential: not sequential,
                                      description="GPT-NeoX with use_parallel_residual false: the MLP's LayerNorm "
                                                  "reads the attention output added to the residual, a tensor of "
                                                  "its own (the default parallel block reads the block input).")
    loss_kernel_refusal: str | None = Field(default=None, exclude_if=lambda why: why is None,
                                            description="Why wrappers.losses cannot run --loss chunked|fused on "
                                                        "this causal LM, as it words it (advisor.model.loss_kernels); "
                                                        "None: it can, or not known.")
    kv_cache_values_own_dtype: str | None = Field(default=None, exclude_if=lambda release: release is None,
                                                  description="The release ('transformers 5.24.0') whose KV cache "
                                                              "keeps the values in their own dtype (bf16 under "
                                                              "autocast) where older ones cast them to the keys' "
                                                              "fp32 (profiles/library_releases.json, "
                                                              "kv_cache_values_keep_their_dtype); None: the older "
                                                              "behaviour.")
    block_classes: tuple[str, ...] = Field(default=(), description="Block classes FSDP wraps, one unit each; "
                                           "empty when unknown (wrap by size).")
    dtype: str | None = Field(default=None, description="Checkpoint dtype from the config.")
    defaulted: tuple[str, ...] = Field(default=(), exclude_if=lambda keys: not keys,
                                       description="Shape keys the config leaves out, planned at transformers' "
                                                   "defaults for its model_type (a note says so).")
    head: TaskHead | None = Field(default=None, exclude_if=lambda head: head is None,
                                  description="Task head in place of the causal-LM head (advisor.model.heads); "
                                              "None: the vocabulary head.")
    traced: tuple[BlockProfile, ...] = Field(
        default=(), exclude=True, description="Activation profiles measured by tracing the model (families "
        "with no activation formula; advisor.simulate.profile), one per recipe and shape.")
    linears: LinearLayout | None = Field(
        default=None, exclude=True, description="The model's linear layers, recorded on the meta device for LoRA "
        "on a family whose layers no formula lists (advisor.simulate.linears); None: not recorded.")

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.trainable_params > self.total_params:
            raise ValueError(
                f"trainable parameters ({self.trainable_params:,}) exceed total ({self.total_params:,})"
            )
        parts = (self.embedding_params, self.layer_params, self.head_params, self.other_params)
        if self.num_layers is not None and None not in parts:
            summed = parts[0] + self.num_layers * parts[1] + parts[2] + parts[3] - self.dense_layer_saving
            if summed != self.total_params:
                raise ValueError(f"components sum to {summed:,}, not the total {self.total_params:,}")
        if (self.num_experts is None) != (self.num_experts_per_token is None):
            raise ValueError("num_experts and num_experts_per_token go together")
        return self

    @property
    def num_sparse_layers(self) -> int | None:
        """Layers with experts (all of them unless ``moe`` names dense ones)."""
        if self.num_layers is None:
            return None
        return self.num_layers - (self.moe.num_dense_layers if self.moe else 0)

    @property
    def dense_layer_saving(self) -> int:
        """How many fewer parameters the dense layers hold than if they were MoE layers like ``layer_params``
        (Jamba: every block against the largest)."""
        if self.hybrid is not None and self.layer_params is not None:
            return len(self.hybrid.block_params) * self.layer_params - sum(self.hybrid.block_params)
        if self.moe is None or not self.moe.num_dense_layers or self.layer_params is None:
            return 0
        return self.moe.num_dense_layers * (self.layer_params - self.moe.dense_layer_params)

    @property
    def frozen_params(self) -> int:
        return self.total_params - self.trainable_params

    @property
    def has_architecture(self) -> bool:
        """Enough shape information to model activations."""
        return None not in (self.num_layers, self.hidden_size, self.num_attention_heads, self.vocab_size)

    @property
    def active_params(self) -> int:
        """Parameters one token passes through (MoE: only the routed experts)."""
        if self.num_experts is None or self.expert_params is None or self.num_layers is None:
            return self.total_params
        idle = (self.num_experts - (self.num_experts_per_token or 0)) * self.expert_params
        return self.total_params - (self.num_sparse_layers or 0) * idle

    def with_trainable(self, trainable_params: int) -> "ModelSpec":
        """The same model with only ``trainable_params`` receiving gradients (frozen backbone, LoRA)."""
        return validated_copy(self, {"trainable_params": trainable_params})


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmbt]?)\s*$", re.IGNORECASE)
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def validation_problem(err: ValidationError) -> str:
    """The first problem of a pydantic ``ValidationError`` as one short line: where, what, and the value."""
    problem = err.errors()[0]
    where = ".".join(str(part) for part in problem["loc"]) or "value"
    more = f"; and {len(err.errors()) - 1} more" if len(err.errors()) > 1 else ""
    return f"{where}: {problem['msg']} (got {repr(problem.get('input'))[:40]}){more}"


def parse_count(text: str, *, what: str = "--params") -> int:
    """``7.5B`` -> 7_500_000_000; ``350M``, ``1.2T``, ``125000``."""
    match = _SIZE.match(text or "")
    if match is None:
        raise ValueError(f"cannot read {what} '{(text or '')[:40]}': expected a number like 7.5B, 350M or 125000")
    number = float(match.group(1)) * _SCALE[match.group(2).lower()]
    if not number <= MAX_PARAMS:  # also inf, from a mantissa of 400 digits
        raise ValueError(f"{what} '{text.strip()[:40]}' is more than {MAX_PARAMS:.0e} parameters")
    value = round(number)
    if value < 1:
        raise ValueError(f"{what} must be at least 1")
    return value


def size_label(total_params: int) -> str:
    """``7.62B``, ``405B``, ``100T``, ``1,000T``: three significant figures in billions, in trillions from a thousand
    billion, and whole trillions with a thousands separator from a thousand trillion (``.3g`` printed 100T in
    billions as ``1e+05B``, and a thousand trillion as ``1e+03T``)."""
    if total_params >= 999.5e12:  # MAX_PARAMS is 10**15: at most 1,000T
        return f"{total_params / 1e12:,.0f}T"
    if total_params >= 999.5e9:
        return f"{total_params / 1e12:.3g}T"
    return f"{total_params / 1e9:.3g}B"


def spec_from_size(total_params: int, *, name: str | None = None) -> ModelSpec:
    """A model known only by its size: no architecture, so activations are an assumption later."""
    return ModelSpec(
        name=name or f"{size_label(total_params)} parameters",
        source="params",
        count_method="given",
        total_params=total_params,
        trainable_params=total_params,
    )

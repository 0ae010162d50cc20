"""What ``--compile`` changes in the activations a Llama-like block saves for backward: the tensors
AOTAutograd's min-cut partitioner recomputes in backward instead of saving (profiles/compile_saved.json).

What belongs here: the bytes a token of one block the partitioner drops, from the profile's list of
tensors (by the op that makes each, so they scale with the block's hidden and intermediate widths), and
the rule for where that list was measured. What does not: the time compile saves
(``advisor.estimate.compile_time``), the eager count itself (``advisor.estimate.activations_blocks``).

Where it applies (the profile's ``applies_to``): a bf16 block without autocast (FSDP2's MixedPrecisionPolicy,
a pure bf16 model, DeepSpeed) or fp32 weights under bf16 autocast (DDP, ZeRO-1/2 under bf16-mixed), SDPA, no
checkpointing (or, bf16 only, torchtitan's selective op checkpointing: the profile's ``selective`` list, down_proj's
output, which eager's checkpoint cache keeps and the compiled graph never saves), LoRA only on a frozen bf16 base
without adapter dropout or DoRA (the profile's ``lora`` list), the plain Llama block (no q/k norms, sandwich norms,
fp32 norm scales, fused qkv), on the
single-mesh path (``advisor.estimate.memory``; tensor, context and pipeline parallel plans keep the eager count).
Everywhere else the plan keeps the eager count and says so.
Only the saved tensors move (the end-of-forward moment, and the block that backward frees); the moment
inside a block's backward (its gradients) is left as eager: not measured.

Reads one bundled JSON file once (as ``advisor.estimate.float8_time``); no torch import.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from advisor.estimate.compile_time import LLAMA_LIKE
from advisor.frozen import validated_copy
from advisor.precision import FP32
from profiles import PROFILES_DIR

if TYPE_CHECKING:
    from advisor.estimate.activations import ActivationEstimate, ActivationShape, Adapters, Dtypes

COMPILE_SAVED_FILE = PROFILES_DIR / "compile_saved.json"


class SavedTensor(BaseModel):
    """One kind of tensor a block saves, a token: ``per_block`` tensors of ``width`` features in ``dtype``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tensor: str
    width: Literal["hidden", "intermediate"]
    dtype: Literal["fp32", "compute", "residual"]
    per_block: int = Field(ge=1)


class SavedChange(BaseModel):
    """What the partitioner changes in one recipe's block."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dropped: tuple[SavedTensor, ...] = Field(description="Saved eager, recomputed by the compiled backward.")
    added: tuple[SavedTensor, ...] = Field(description="Saved by the compiled block, not by the eager one.")


class SelectiveSavedFacts(BaseModel):
    """What the partitioner changes under selective (torchtitan op-level) checkpointing, bf16 only."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    applies_to: str
    bf16: SavedChange


class LoraSavedFacts(SavedChange):
    """What the partitioner changes in a LoRA block on a frozen low-precision base (the adapters' inputs aside:
    ``adapter_copies_dropped``)."""

    source: str
    applies_to: str


class CompileSavedFacts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    applies_to: str
    recipes: dict[Literal["bf16", "autocast"], SavedChange]
    lora: LoraSavedFacts
    selective: SelectiveSavedFacts


@functools.lru_cache(maxsize=1)
def load_compile_saved() -> CompileSavedFacts:
    """The bundled facts (read once; the file is immutable package data)."""
    raw = json.loads(COMPILE_SAVED_FILE.read_text())
    raw.pop("_doc", None)
    return CompileSavedFacts(**raw)


def compile_saves_less(shape: ActivationShape, dt: Dtypes, *, checkpointing: bool, eager_attention: bool,
                       lora: bool, selective: bool = False, adapters: Adapters | None = None,
                       quantized: bool = False) -> bool:
    """Whether a measured list applies to this block and recipe (module docstring): without checkpointing either
    recipe's, under selective checkpointing the bf16 one's; with LoRA the profile's ``lora`` list, where the
    adapters are known, without dropout or DoRA, on a frozen base held in the compute dtype (not a quantised one:
    bitsandbytes' 4-bit matmuls were not measured compiled)."""
    plain = not (shape.qk_norm or shape.sandwich_norms or shape.fp32_norm_scale or shape.fused_qkv)
    if lora:
        measured = (adapters is not None and not adapters.dropout and not adapters.dora_outputs and not quantized
                    and dt.residual == dt.compute == 2 and not checkpointing)
    else:
        measured = _recipe(dt) == "bf16" if selective else _recipe(dt) is not None and not checkpointing
    return (measured and not eager_attention
            and plain and shape.kind in LLAMA_LIKE and shape.family == "decoder" and shape.num_experts is None
            and shape.mla is None and shape.hybrid is None)


def _recipe(dt: Dtypes) -> str | None:
    """The measured recipe these widths are: bf16 weights without autocast, or fp32 weights under bf16 autocast."""
    if dt.residual == dt.compute == 2 and not dt.input_casts:
        return "bf16"
    if dt.residual == FP32 and dt.compute == 2 and dt.input_casts:
        return "autocast"
    return None


def _bytes(tensor: SavedTensor, shape: ActivationShape, dt: Dtypes) -> int:
    width = shape.hidden_size if tensor.width == "hidden" else shape.intermediate_size
    return tensor.per_block * width * {"fp32": FP32, "compute": dt.compute, "residual": dt.residual}[tensor.dtype]


def compile_dropped_per_token(shape: ActivationShape, dt: Dtypes) -> int:
    """Bytes a token of one block the partitioner no longer saves (dropped less added), a measured recipe only
    (``compile_saves_less``). Llama-3.1-8B in bf16: 2 x 4 x 4096 + 2 x 2 x 4096 + 2 x 14336 - 2 x 2 x 4096 = 61,440
    (8h + 2f); under autocast: 2 x 4h + 2 x 4h + 5 x 2h + 2f - (4h + 2h + 2 x 2h) = 16h + 2f = 94,208."""
    return _net_bytes(load_compile_saved().recipes[_recipe(dt)], shape, dt)


def adapter_copies_dropped(dt: Dtypes, adapters: Adapters) -> int:
    """Bytes a token of one block's adapter inputs the compiled block does not keep: under autocast PEFT's fp32 cast
    and autocast's cast back give each adapter its own copy of its input (``frozen_adapters_per_token``); the
    compiled block keeps one per input read (the first norm's output for q, k and v; the second's for gate and up;
    SDPA's output for o; the gated product for down). All seven on Llama-3.1-8B: 2 x (6 x 4096 + 14336) -
    2 x (3 x 4096 + 14336) = 24,576. Without autocast the adapters share their input eager too: 0."""
    if not dt.input_casts:
        return 0
    read = {source: fan_in for fan_in, source in adapters.inputs}
    return dt.compute * (sum(fan_in for fan_in, _ in adapters.inputs) - sum(read.values()))


def lora_dropped_per_token(shape: ActivationShape, dt: Dtypes, adapters: Adapters) -> int:
    """Bytes a token of one LoRA block on a frozen bf16 base the partitioner no longer saves (the profile's ``lora``
    list and ``adapter_copies_dropped``). Llama-3.2-1B (h 2048, f 8192), q and v under autocast:
    2 x 4 x 2048 + 2 x 8192 - 2 x 2 x 2048 + 2 x 2048 = 28,672."""
    return _net_bytes(load_compile_saved().lora, shape, dt) + adapter_copies_dropped(dt, adapters)


def selective_dropped_per_token(shape: ActivationShape, dt: Dtypes) -> int:
    """Bytes a token of one block the compiled graph does not keep under selective checkpointing that eager's
    cache does (the profile's ``selective`` list): Llama-3.1-8B in bf16, down_proj's output, 2 x 4096 = 8,192."""
    return _net_bytes(load_compile_saved().selective.bf16, shape, dt)


def _net_bytes(change: SavedChange, shape: ActivationShape, dt: Dtypes) -> int:
    """Bytes a token of one block ``change`` drops, less those it adds."""
    return sum(_bytes(t, shape, dt) for t in change.dropped) - sum(_bytes(t, shape, dt) for t in change.added)


def compiled_activations(est: ActivationEstimate, shape: ActivationShape, dt: Dtypes, *, tokens: int,
                         checkpointing: bool, eager_attention: bool, lora: bool,
                         selective: bool = False, adapters: Adapters | None = None,
                         quantized: bool = False) -> ActivationEstimate:
    """``est`` with each block's saved tensors those of the compiled block, where a list applies
    (``compile_saves_less``); ``est`` unchanged elsewhere. ``tokens``: a micro-batch's. Under selective
    checkpointing only the kept tensors move (the recomputation stays eager: ``layer_bytes`` unchanged)."""
    if not compile_saves_less(shape, dt, checkpointing=checkpointing, eager_attention=eager_attention, lora=lora,
                              selective=selective, adapters=adapters, quantized=quantized):
        return est
    if selective:
        kept = tokens * selective_dropped_per_token(shape, dt)
        return validated_copy(est, {"saved_bytes": est.saved_bytes - shape.num_layers * kept,
                                    "block_kept_bytes": est.block_kept_bytes - kept})
    per_token = lora_dropped_per_token(shape, dt, adapters) if lora else compile_dropped_per_token(shape, dt)
    block = tokens * per_token
    return validated_copy(est, {"saved_bytes": est.saved_bytes - shape.num_layers * block,
                                "layer_bytes": est.layer_bytes - block, "block_kept_bytes": est.block_kept_bytes - block})

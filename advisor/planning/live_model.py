"""What ``advisor.plan`` reads off the model it is handed beyond its config (``advisor.planning.api``):
a live PEFT model's LoRA config, a model bitsandbytes loaded, the linear layers LoRA needs for a family
with no formula, and whether a quantised base can run the asked strategy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from advisor.estimate.quantized import quantization_unavailable, quantized_base
from advisor.frozen import validated_copy
from advisor.model.lora import LoraConfig, block_linears, lora_of, target_names
from advisor.model.spec import ModelSpec
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig
from advisor.units import GIB


def live_lora(model: Any, spec: ModelSpec, notes: list[str]) -> LoraConfig | None:
    """A PEFT model's LoRA config when its targets are block linears this planner knows; otherwise
    None, and its adapters are planned as any frozen-base model (by ``requires_grad``)."""
    live = lora_of(model)
    if live is None:
        return None
    try:
        target_names(spec, live)
    except ValueError:
        notes.append("PEFT adapters on layers the activation model does not know: planned as a partly frozen "
                     "model (trainable parameters by requires_grad)")
        return None
    return live


def live_frozen_base(model: Any) -> str | None:
    """The dtype a live model's frozen base is held in, as ``TrainingConfig.frozen_base`` names it: "param" for
    fp32 weights (loaded without a dtype, as TRL's SFTTrainer does by default), "compute" for bf16 / fp16 ones; None
    for a name or config, or a model with no frozen floating-point weight (read off its first one)."""
    if isinstance(model, (str, dict, ModelSpec)) or not hasattr(model, "parameters"):
        return None
    for param in model.parameters():
        if not param.requires_grad and param.is_floating_point():
            return {"torch.float32": "param", "torch.bfloat16": "compute", "torch.float16": "compute"}.get(
                str(param.dtype))  # another dtype (float64, float8): the recipe's, as before
    return None


def with_recorded_linears(spec: ModelSpec, config: dict, *, cache_dir: Path | None, trust_remote_code: bool) -> ModelSpec:
    """The spec with its linear layers recorded on the meta device (``advisor.simulate.linears``) when no
    formula lists its family's, so LoRA can count its adapters; unchanged otherwise."""
    try:
        block_linears(spec)
        return spec
    except ValueError:
        if not spec.has_architecture or (trust_remote_code and config.get("auto_map")):
            raise  # a size only, or a model that ships its own code: not built here
    from advisor.simulate.linears import recorded_linears  # imports torch on a cache miss only

    return validated_copy(spec, {"linears": recorded_linears(config, cache_dir=cache_dir)})


def live_quantization(model: Any) -> tuple[str, bool] | None:
    """``(scheme, double_quant)`` of a live model transformers loaded with bitsandbytes (duck-typed on
    ``config.quantization_config``, a ``BitsAndBytesConfig`` or its dict; a PEFT model forwards
    ``config`` to its base), or None."""
    if isinstance(model, (str, dict, ModelSpec)) or not hasattr(getattr(model, "config", None), "to_dict"):
        return None
    found = getattr(model.config, "quantization_config", None)
    if found is None:
        return None
    read = found.get if isinstance(found, dict) else lambda key, default=None: getattr(found, key, default)
    if read("load_in_8bit", False):
        return "int8", True
    if read("load_in_4bit", False):
        return str(read("bnb_4bit_quant_type", "fp4")), bool(read("bnb_4bit_use_double_quant", False))
    return None


# Checkpoints saved in 8-bit floats (DeepSeek-V3's released config, the *-FP8 Qwen checkpoints): a fine-tune loads
# them dequantised (or trains them as --float8 says), so the architecture is planned as it is, with a note.
FLOAT_CHECKPOINTS = ("fp8", "fbgemm_fp8")


def config_quantization(config: dict | None, notes: list[str] | None = None) -> tuple[str, bool] | None:
    """``(scheme, double_quant)`` of a checkpoint whose config.json carries bitsandbytes' ``quantization_config``
    (``load_in_4bit`` / ``load_in_8bit``, as ``BitsAndBytesConfig.to_dict`` saves it, or the private ``_load_in_*``
    keys older releases saved), None without one; an fp8 checkpoint is None too, with a line in ``notes``; a
    ValueError for another method (GPTQ, AWQ, ...), whose packed layout is not modelled."""
    found = (config or {}).get("quantization_config")
    if found is None:
        return None
    if not isinstance(found, dict):
        raise ValueError(f"config.json's quantization_config must be a mapping, got {str(found)[:40]!r}")
    method = str(found.get("quant_method", "bitsandbytes")).lower()
    if method in FLOAT_CHECKPOINTS:
        if notes is not None:
            notes.append(f"the checkpoint is saved in {method} (config.json's quantization_config): planned as the "
                         "unquantised architecture at the precision asked, as transformers loads it with "
                         "dequantize=True (or on GPUs below sm_89); loaded in fp8 it trains only adapters, and "
                         "--float8 plans fp8 matmuls)")
        return None
    if method == "bitsandbytes" and (found.get("load_in_8bit") or found.get("_load_in_8bit")):
        return "int8", True
    if method == "bitsandbytes" and (found.get("load_in_4bit") or found.get("_load_in_4bit")):
        return str(found.get("bnb_4bit_quant_type", "fp4")), bool(found.get("bnb_4bit_use_double_quant", False))
    raise ValueError(f"the checkpoint is quantised ({method}, config.json's quantization_config): its packed weights "
                     "are not modelled (bitsandbytes 4-bit and 8-bit are); plan the unquantised model's config, with "
                     "--lora and --quantize for a QLoRA run")


def check_quantized(spec: ModelSpec, training: TrainingConfig, strategy: str | None) -> str:
    """ValueError for a quantised base nothing trains on, or a pinned strategy that cannot run it;
    otherwise the assumption line (``advisor.estimate.quantized`` says where the bytes come from)."""
    if training.lora is None:
        raise ValueError(f"--quantize {training.quantize} needs --lora RANK: a quantised base is frozen, so "
                         "without adapters nothing would train")
    q = quantized_base(spec, training.quantize, double_quant=training.double_quant)
    if strategy is not None:
        reason = quantization_unavailable(get_strategy(strategy).on(training.engine), training.quantize)
        if reason is not None:
            raise ValueError(f"--quantize {training.quantize} with --strategy {strategy} on {training.engine}: {reason}")
    constants = ("double-quantised absmax, 0.127 bits/weight" if training.double_quant else "fp32 absmax, 0.5 bits/weight"
                 ) if training.quantize != "int8" else "one fp32 scale per output row"
    return (f"quantised base ({training.quantize}, bitsandbytes): {q.params / 1e9:.2f}B block-linear weights packed "
            f"into {q.packed_bytes / GIB:.1f} GiB + {q.constant_bytes / GIB:.2f} GiB of constants ({constants}, kept on "
            f"every GPU); embeddings, norms and head in the compute dtype; FSDP / ZeRO-3 shard the packed weights "
            f"(bnb_4bit_quant_storage=bfloat16), ddp / zero1 / DeepSpeed zero2 keep a whole copy per GPU; one "
            f"dequantised linear ({q.largest_linear_params * training.compute_bytes / GIB:.2f} GiB) in a block's backward")

"""What an export says about a quantised base (``--quantize``, QLoRA): no launcher or DeepSpeed key
quantises a model, so the script must load it with a ``transformers.BitsAndBytesConfig``; these
notes give that call, matched to the plan, and the settings FSDP / ZeRO-3 need around it.

Sources: transformers' ``BitsAndBytesConfig`` (``load_in_4bit``, ``bnb_4bit_quant_type``,
``bnb_4bit_use_double_quant``, ``bnb_4bit_compute_dtype``, ``bnb_4bit_quant_storage``,
``load_in_8bit``); PEFT docs "Use PEFT QLoRA and FSDP" and "... DeepSpeed with ZeRO3" (storage dtype
bf16, ``torch_dtype`` equal to it, ``fsdp_cpu_ram_efficient_loading``, ``fsdp_use_orig_params: false``
for FSDP1, ``zero3_init_flag``); accelerate 1.15 ``fsdp2_prepare_model`` (keeps 4-bit weights out
of the meta-device reload, leaves non-float ``Params4bit`` unsharded, does not upcast them);
``FullyShardedDataParallelPlugin`` (``use_orig_params`` is obsolete under FSDP2).
"""

from __future__ import annotations

from advisor.strategies import Implementation
from advisor.training import Engine, TrainingConfig


def storage_dtype(training: TrainingConfig) -> str:
    """``torch.<dtype>`` the base is loaded in and the 4-bit weights are stored as: the compute dtype,
    but fp32 under fp16 autocast (PEFT docs: fp16 mixed precision is stable with float32 storage)."""
    info = training.precision_info
    fp16_autocast = info.mixed and info.compute_dtype == "float16"
    return f"torch.{info.param_dtype if fp16_autocast else info.compute_dtype}"


def bitsandbytes_config(training: TrainingConfig) -> str:
    """The ``BitsAndBytesConfig(...)`` call (Python source, ``torch`` imported) for the plan's base."""
    if training.quantize == "int8":
        return "BitsAndBytesConfig(load_in_8bit=True)"
    return (f'BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="{training.quantize}", '
            f"bnb_4bit_use_double_quant={training.double_quant}, "
            f"bnb_4bit_compute_dtype=torch.{training.precision_info.compute_dtype}, "
            f"bnb_4bit_quant_storage={storage_dtype(training)})")


def quantization_notes(training: TrainingConfig, *, engine: Engine, impl: Implementation) -> list[str]:
    """One line per thing the script or the launcher must do for the quantised base (none without one)."""
    if training.quantize is None:
        return []
    dtype = storage_dtype(training)
    notes = [f"QLoRA: load the base with AutoModelForCausalLM.from_pretrained(..., quantization_config="
             f"{bitsandbytes_config(training)}, dtype={dtype}); the plan's memory assumes it."]
    if impl.shard_params and training.quantize != "int8":
        notes.append(f"The 4-bit weights shard only because bnb_4bit_quant_storage is {dtype}, the float dtype "
                     "of the other parameters (dtype=): with the default uint8 they stay whole on every GPU.")
    if impl.shard_params and engine == "torch":
        notes.append("fsdp_cpu_ram_efficient_loading: true is what QLoRA needs with FSDP; fsdp_use_orig_params is not "
                     "written: FSDP2 always uses the original parameters (PEFT's FSDP1 recipe sets it false).")
    if impl.shard_params and engine == "deepspeed":
        notes.append("zero3_init_flag: true (accelerate) with the storage dtype above, as PEFT's ZeRO-3 QLoRA recipe.")
    return notes

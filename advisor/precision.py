"""The precision table: one row per ``--precision`` choice with every fact that follows from it.

Bytes per stored parameter and per matmul element, the torch dtypes, and how accelerate,
DeepSpeed, Lightning and the Hugging Face Trainer spell it. Estimators, the simulator, the
exporters and ``wrappers`` read this table instead of branching on precision names. No torch import
(dtypes are named, ``wrappers`` turns a name into ``getattr(torch, name)``).

Sources: the torch recipe keeps fp32 master parameters under mixed precision (``torch.autocast``,
FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``); accelerate's
``mixed_precision`` is ``no|fp16|bf16``; Lightning's precision strings are ``32-true``,
``16-mixed``, ``bf16-mixed``, ``bf16-true``; DeepSpeed enables ``bf16`` or ``fp16`` blocks; the
Hugging Face Trainer sets ``bf16=True`` or ``fp16=True`` (autocast; pure bf16 also loads bf16 weights).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Precision = Literal["fp32", "bf16-mixed", "fp16-mixed", "bf16"]
DtypeName = Literal["float32", "bfloat16", "float16"]


class PrecisionInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Precision
    mixed: bool = Field(description="fp32 parameters, low-precision compute (autocast / MixedPrecisionPolicy).")
    param_dtype: DtypeName = Field(description="dtype of the stored parameters in the torch recipe.")
    compute_dtype: DtypeName = Field(description="dtype of matmul inputs and outputs.")
    peak_rate: Literal["fp32", "bf16", "fp16"] = Field(description="Which datasheet peak times the matmuls.")
    accelerate: Literal["no", "bf16", "fp16"] = Field(description="accelerate's mixed_precision value.")
    lightning: str = Field(description="Lightning's precision string.")
    deepspeed: Literal["bf16", "fp16"] | None = Field(description="The DeepSpeed config block enabled, if any.")
    trainer: Literal["bf16", "fp16"] | None = Field(
        description="The Hugging Face TrainingArguments flag set to true (bf16= or fp16=), if any.")

    @property
    def param_bytes(self) -> int:
        return DTYPE_BYTES[self.param_dtype]

    @property
    def compute_bytes(self) -> int:
        return DTYPE_BYTES[self.compute_dtype]


DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
FP32 = DTYPE_BYTES["float32"]  # bytes of one float32 element: master weights, optimizer moments, fp32 buffers

PRECISIONS: dict[str, PrecisionInfo] = {
    p.name: p
    for p in (
        PrecisionInfo(name="fp32", mixed=False, param_dtype="float32", compute_dtype="float32", peak_rate="fp32",
                      accelerate="no", lightning="32-true", deepspeed=None, trainer=None),
        PrecisionInfo(name="bf16-mixed", mixed=True, param_dtype="float32", compute_dtype="bfloat16",
                      peak_rate="bf16", accelerate="bf16", lightning="bf16-mixed", deepspeed="bf16",
                      trainer="bf16"),
        PrecisionInfo(name="fp16-mixed", mixed=True, param_dtype="float32", compute_dtype="float16",
                      peak_rate="fp16", accelerate="fp16", lightning="16-mixed", deepspeed="fp16",
                      trainer="fp16"),
        PrecisionInfo(name="bf16", mixed=False, param_dtype="bfloat16", compute_dtype="bfloat16", peak_rate="bf16",
                      accelerate="bf16", lightning="bf16-true", deepspeed="bf16", trainer="bf16"),
    )
}


def precision_info(name: str) -> PrecisionInfo:
    try:
        return PRECISIONS[name]
    except KeyError:
        raise ValueError(f"unknown precision '{name[:40]}'; choose from {', '.join(PRECISIONS)}") from None

"""The host floor of a step: the operators a micro-batch launches from Python, and the seconds they take.

What belongs here: the count of ATen operators one micro-batch dispatches (``profiles/host_overhead.json``, counted
on the CPU by ``benchmarks/host_ops.py``: per block and outside the blocks, forward and backward, with and without
autocast's casts and checkpointing's recompute, plus what each LoRA adapter adds) and the floor they put under the
micro-batch's time (read by ``step_time``). Eager PyTorch issues every kernel from the Python thread: where the
GPU's work for a micro-batch is shorter than the host time to launch it, the GPU waits and the micro-batch takes
the host time. Small models at small micro-batches sit on this floor (BERT-large at 2 x 512 tokens on an H200
under the Trainer: 0.087 s a step, where its GPU work is 0.02 s); a 7B model's micro-batch of 2,048 tokens is
far above it.

Model: operators = blocks x (forward + backward of a block) + the embedding, head and loss, each of the family's
variant (autocast over fp32 weights, or not; checkpointed or not), + LoRA's operators x the adapted linears;
floor = operators x ``seconds_per_op`` (fitted on our timed H200 runs: an assumption for another host). Families
without a count of their own take the Llama-like decoder's (said in the plan's note).

Not charged: the optimizer step's operators. Counted on the CPU, a for-loop AdamW issues 9 a trainable tensor and
transformers' Adafactor 24 (fused and foreach AdamW about 10-20 a step), but charged at the blocks' cost they made the
held-out V100 runs of Hugging Face's single-GPU page 12-19% slow in the plan (Adafactor's batch 4 from +10% to -19%)
and our H200 Adafactor run at batch 4 41% slow: the host issues them while the GPU still works through backward's
queue, and they are cheaper ops than a module's. Not counted either: FSDP's and DeepSpeed's per-block hooks,
bitsandbytes' dequantisation calls, DataParallel's threads. Under ``--compile`` no floor is applied: the compiled
blocks launch fused kernels from one call each (not measured).
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from profiles import PROFILES_DIR

if TYPE_CHECKING:
    from advisor.model.spec import ModelSpec
    from advisor.strategies import Implementation
    from advisor.training import TrainingConfig

HOST_FILE = PROFILES_DIR / "host_overhead.json"
_DISABLED: list[bool] = []  # benchmarks/host_ops.py plans without the floor to fit it


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class OpCounts(_Frozen):
    """[forward, backward] operators of one micro-batch, of one block and of what lies outside the blocks."""

    block: tuple[int, int]
    outside: tuple[int, int]
    block_checkpointed: tuple[int, int]
    outside_checkpointed: tuple[int, int]

    def micro_batch(self, blocks: int, *, checkpointing: bool) -> int:
        block, outside = ((self.block_checkpointed, self.outside_checkpointed) if checkpointing
                          else (self.block, self.outside))
        return blocks * sum(block) + sum(outside)


class LoraOps(_Frozen):
    """[forward, backward] operators under PEFT LoRA: a block whose base is frozen, one adapter, the rest."""

    block_frozen: tuple[int, int]
    per_adapter: tuple[float, float]
    outside: tuple[int, int]


class FamilyOps(_Frozen):
    counted_on: str = Field(description="The bundled model the family was counted on.")
    plain: OpCounts = Field(description="No autocast: fp32 weights, or pure bf16/fp16.")
    autocast: OpCounts = Field(description="Autocast over fp32 weights: its casts added.")
    lora: LoraOps


class HostOverhead(_Frozen):
    seconds_per_op: float = Field(gt=0, description="Host seconds an operator costs (fitted; an assumption elsewhere).")
    seconds_per_op_source: str
    families: dict[str, FamilyOps]
    counted_with: str


@functools.cache
def load_host_overhead() -> HostOverhead:
    raw = json.loads(HOST_FILE.read_text())
    raw.pop("_doc", None)
    return HostOverhead(**raw)


@contextlib.contextmanager
def floor_disabled() -> Iterator[None]:
    """Plans made inside have no host floor (``benchmarks/host_ops.py`` fits the floor against the GPU time)."""
    _DISABLED.append(True)
    try:
        yield
    finally:
        _DISABLED.pop()


def _family(spec: "ModelSpec") -> tuple[str, str]:
    """(the family whose count is used, the spec's own): a family with no count takes the Llama-like decoder's."""
    from advisor.model.block_kinds import kind_of

    own = kind_of(spec).family
    return (own if own in load_host_overhead().families else "decoder"), own


def _adapted_linears(spec: "ModelSpec", training: "TrainingConfig") -> int:
    """LoRA adapters inside the blocks, every block counted."""
    assert training.lora is not None
    from advisor.model.lora import adapted_fans, matched_linears, model_linears

    if model_linears(spec) is not None:
        return sum(1 for layer in matched_linears(spec, training.lora) if layer.block)
    return len(adapted_fans(spec, training.lora)) * (spec.num_layers or 0)


def host_ops(spec: "ModelSpec", training: "TrainingConfig", impl: "Implementation", *, checkpointing: bool) -> int:
    """ATen operators one micro-batch launches (module docstring)."""
    from advisor.estimate.activations import shape_of
    from advisor.estimate.memory import recipe_dtypes

    family = load_host_overhead().families[_family(spec)[0]]
    counts = family.autocast if recipe_dtypes(training, impl).input_casts else family.plain
    block, outside = ((counts.block_checkpointed, counts.outside_checkpointed) if checkpointing
                      else (counts.block, counts.outside))
    layers = shape_of(spec).num_layers  # a bare size: the Llama-like shape its FLOPs assume
    if training.lora is None:
        return layers * sum(block) + sum(outside)
    # a frozen base runs no weight gradients: each block less those (autocast's and the recompute's operators
    # kept), the adapters' operators added, nothing outside the blocks trained
    lora = family.lora
    frozen = sum(block) - (sum(family.plain.block) - sum(lora.block_frozen))
    return round(layers * frozen + sum(lora.outside) + _adapted_linears(spec, training) * sum(lora.per_adapter))


def host_floor_s(spec: "ModelSpec", training: "TrainingConfig", impl: "Implementation", *,
                 checkpointing: bool) -> float:
    """Host seconds of one micro-batch's operators; 0 under ``--compile`` (not measured) or while disabled."""
    if training.compile or _DISABLED:
        return 0.0
    return host_ops(spec, training, impl, checkpointing=checkpointing) * load_host_overhead().seconds_per_op


def host_floor_note(spec: "ModelSpec", training: "TrainingConfig", impl: "Implementation", *, checkpointing: bool,
                    gpu_s: float) -> str:
    """The plan's line where the floor decides a micro-batch's time."""
    host = load_host_overhead()
    ops = host_ops(spec, training, impl, checkpointing=checkpointing)
    counted, own = _family(spec)
    assumed = "" if counted == own else f" (counted as a Llama-like decoder's: no count of its own for {own})"
    return (f"host-bound: a micro-batch launches about {ops:,} operators from Python{assumed}, "
            f"{ops * host.seconds_per_op:.3f} s at {host.seconds_per_op * 1e6:.0f} us each (fitted on one H200 host: "
            f"an assumption here), more than its {gpu_s:.3f} s of GPU work; a larger micro-batch, or --compile, "
            "uses the GPU better")


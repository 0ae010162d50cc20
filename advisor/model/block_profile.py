"""``BlockProfile``: a model's activation memory measured by tracing it, as plain data.

For a family with no activation formula (``advisor.model.block_kinds.activation_family`` is
None), ``advisor.simulate.profile`` runs the model with two blocks on fake tensors at the requested
sequence length and recipe dtypes at micro-batch 1 and 2, derives the same steps with one block,
and so has, at four (layers, micro-batch) points, the bytes that are live beyond parameters, their
gradients and autocast's weight copies at the moments the memory model composes (``advisor.estimate.memory``). Each moment is a ``Bilinear`` in the number
of blocks and the micro-batch, solved exactly from the four points. The estimator reads these
numbers as it reads the formula's (``advisor.estimate.traced``); nothing here imports torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# How a step checkpoints its blocks: "on" (full recompute), "off", "selective" (attention outputs and every
# other matmul kept; torchtitan's per-op policy). The one spelling: TrainingConfig's request adds "auto", and
# every plan, export target and wrap() decision stores one of these (their two booleans are read from it).
CheckpointMode = Literal["on", "off", "selective"]


class CheckpointFlags:
    """The two booleans read from a ``checkpointing: CheckpointMode`` field, for the models that store the
    mode (an export target, ``wrap()``'s decision); the plan's models expose them as computed fields."""

    @property
    def activation_checkpointing(self) -> bool:
        """Blocks are recomputed in backward (fully or selectively)."""
        return self.checkpointing != "off"

    @property
    def selective_checkpointing(self) -> bool:
        return self.checkpointing == "selective"


class Bilinear(BaseModel):
    """Bytes as ``const + per_sample * b + per_layer * L + per_layer_sample * L * b`` for ``L`` blocks and
    micro-batch ``b``, solved exactly from steps at L, b in {1, 2}. Most of it grows with the batch; a
    part may not (rotary tables, a mask a kernel builds once per block), and a kernel may take another
    path at batch 1 than above it (Falcon's SDPA with its explicit mask), which the ``per_layer`` term
    absorbs: exact at batch 1 and 2, linear beyond (checked at batch 4 by benchmarks/accuracy_heldout.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    const: int = Field(description="Bytes independent of the blocks and the batch.")
    per_sample: int = Field(description="Bytes per sample outside the blocks (embedding, head, loss).")
    per_layer: int = Field(description="Bytes per block independent of the batch.")
    per_layer_sample: int = Field(description="Bytes per sample and block.")

    def at(self, *, num_layers: int, micro_batch_size: int) -> int:
        b, n = micro_batch_size, num_layers
        return self.const + self.per_sample * b + self.per_layer * n + self.per_layer_sample * n * b

    @classmethod
    def solve(cls, v11: int, v21: int, v12: int, v22: int) -> "Bilinear":
        """From the values at (L, b) = (1, 1), (2, 1), (1, 2) and (2, 2)."""
        per_layer_sample = v22 - v21 - v12 + v11
        per_layer = v21 - v11 - per_layer_sample
        per_sample = v12 - v11 - per_layer_sample
        return cls(const=v11 - per_sample - per_layer - per_layer_sample, per_sample=per_sample,
                   per_layer=per_layer, per_layer_sample=per_layer_sample)


class AdapterKey(BaseModel):
    """The LoRA / DoRA adapters a traced profile ran with (PEFT's own, on the frozen model)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(gt=0)
    targets: tuple[str, ...] | None = Field(description="PEFT's target_modules ('all-linear' as the one name); "
                                            "None: PEFT's default for the model_type.")
    dora: bool = Field(default=False)
    dropout: float = Field(default=0.0, ge=0, lt=1)


class ProfileKey(BaseModel):
    """What a traced profile depends on besides the config: the recipe's dtypes and the step's shape."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    residual_bytes: int = Field(description="Bytes of the residual stream (parameter dtype).")
    compute_bytes: int = Field(description="Bytes of matmul outputs.")
    input_casts: bool = Field(description="Autocast over fp32 weights.")
    checkpointing: CheckpointMode
    seq_len: int = Field(ge=1)
    attention: str = Field(description="sdpa or eager.")
    loss: str = Field(description="Loss kernel (hf, chunked, fused).")
    adapters: AdapterKey | None = Field(default=None, description="LoRA on a frozen base; None: every weight "
                                        "trains. Left out of the cache key when None (profiles cached before it).")


class BlockProfile(BaseModel):
    """Measured activation bytes of one model under one ``ProfileKey`` (see module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: ProfileKey
    saved: Bilinear = Field(description="Live when the top block's backward begins, less its incoming "
                                        "gradient: every block's saved tensors and what the embedding keeps.")
    forward_peak: Bilinear = Field(description="Highest live bytes during forward (the logits and loss path).")
    loss_peak: Bilinear = Field(description="Highest live bytes in backward before the blocks' backward.")
    block_peak: Bilinear = Field(description="Highest live bytes during the blocks' backward (recomputation, "
                                             "backward temporaries).")
    recompute: Bilinear = Field(description="Saved bytes one checkpointed block recreates in backward "
                                            "(0 without checkpointing).")
    layer_saved_per_sample: int = Field(ge=0, description="One block's saved tensors per sample, without "
                                        "checkpointing (saved_tensors_hooks, storages counted once).")

"""Time torch.compile saves a Llama-like decoder block, by the HBM bytes its fusion removes (``--compile``).

What belongs here: the bytes a token of one block's elementwise and reduction kernels move in eager
mode and after inductor fuses them, and the seconds the difference is worth. What does not: matmuls
and the attention kernel (the same kernels in both modes, timed by ``step_time``'s utilisation), memory
(a compiled block saves fewer activations: ``advisor.estimate.compile_memory``, for a block without checkpointing, bf16
or fp32 under bf16 autocast; other recipes and every other memory moment are estimated as eager), the loss
(torchtitan at the benchmarked commit 9dec370 leaves it eager, its ``torch.compile(loss_fn)`` commented out in
train.py; torchtune's ``compile_loss`` compiles a chunked loss in place, and the full fine-tune recipe at
1814feb1 drops its result for any other loss; newer torchtitan compiles it: not counted), launch gaps (not
modelled anywhere).

Why bytes: step time is FLOPs / (peak x utilisation), the utilisation fitted on eager runs, so the
eager elementwise kernels are inside it. Compiling changes those kernels only: each fused group reads its
inputs and writes its outputs once instead of once per eager op. The time saved is
(eager bytes - compiled bytes) / (HBM bandwidth x the optimizer step's ``hbm_efficiency``), per block,
per token, per pass (forward, backward, and the recompute of a checkpointed block, which reruns the
forward's elementwise ops under full and selective checkpointing alike).

The op lists (a = activation bytes, the compute dtype's width; h hidden, q = heads x head_dim,
kv = kv heads x head_dim, hd head_dim, f intermediate; fp32 = 4; ``cast`` = a + 4, 0 when a = 4) are
those of transformers' ``LlamaDecoderLayer`` (``models/llama/modeling_llama.py``, 5.23.0: ``LlamaRMSNorm``,
``apply_rotary_pos_emb`` with ``rotate_half``, ``LlamaMLP``), traced op by op (benchmarks/compile_bytes.py,
a TorchDispatchMode over forward and backward, torch 2.13, bf16, SDPA); torchtitan's block
(torchtitan 9dec370 ``torchtitan/models/llama/model.py``, the code of the benchmarked runs, and
b5bcd76 ``torchtitan/models/llama3/model.py``) runs the same pattern, its RMSNorm the same eager ops
(``x.float()``, ``pow(2).mean``, ``rsqrt``, ``type_as``, ``* weight``) and its complex RoPE the same bytes
at a = 2 (an fp32 upcast a + 4, a complex product 8, a downcast 4 + a: 2a + 16 = 10a a feature, and its
cos/sin table 4hd = 2a hd). Eager, a token:

- RMSNorm forward (two a block): cast in, ``pow`` 8h, ``mean`` 4h + 4, ``+ eps`` 8, ``rsqrt`` 8, ``mul``
  8h + 4, cast out, ``* weight`` 2a h: 2 cast h + 20h + 2a h + 24.
- RoPE forward, q and k each (width w): ``x * cos`` 2a w + a hd, ``-x2`` a w, ``cat`` 2a w, ``* sin``
  2a w + a hd, ``+`` 3a w: 10a w + 2a hd.
- residual adds 2 x 3a h; MLP ``silu`` 2a f, ``* up`` 3a f.
- backward: MLP 3 x 3a f (two products, ``silu_backward``); five gradient accumulations 3a h (the two MLP
  input gradients, the two residuals, q/k/v's three input gradients in two adds); each RMSNorm
  6a h + 2 cast h + 68h + 40 (``* weight`` 2a h, the weight gradient's product 3a h and sum a h, the
  casts' gradients, the fp32 chain: two products 12h and 8h + 4, a sum 4h + 4, ``mean``'s division 4h + 4,
  ``pow``'s three kernels 8h + 8h + 12h, their sum 12h, scalars 28); RoPE 11a w + 2a hd each; q's and
  k's gradients copied to the projections' layout 2a (q + kv).

Compiled (the kernels inductor scheduled for this block, benchmarks/compile_bytes.py; its own count of
each kernel's reads and writes): forward: norm 2a h + 4 (x in, output and 1/rms out); RoPE 5a w + 2a hd
each (two half-width kernels write ``rotate_half`` into ``cat``'s buffer, one kernel combines); residual
+ norm 3a h + 4 (the sum is not stored: the last kernel recomputes it); ``silu(gate) * up`` 3a f; the
last residual reads three and writes one, 4a h. Backward: MLP 5a f; the second norm's input gradient
with the residual 6a h + 4; the two weight gradients 7a h + 8; the first norm's 6a h + 4; RoPE 2a w +
2a hd each. At a = 2 a block saves, a token, forward 66h + 10 (q + kv) + 4f + 40 bytes and backward
176h + 22 (q + kv) + 8f + 64.

Which blocks: the Llama-like decoder (RMSNorm, RoPE, gated MLP): the kinds ``decoder``, ``size`` and
``guessed``. Extra elementwise ops of a variant (Qwen3's q/k norms, Gemma's fp32 (1 + weight) scales and
sandwich norms, soft-capping) are not counted (the saving is a lower bound there; the plan says so).
Other kinds (MoE, encoder-decoder, vision-language, SSM, GPT-2 style) are refused: ValueError.
Under autocast (fp32 parameters, ``torch.autocast``) the residual stream is fp32 and every linear casts
its input, more eager bytes that compile fuses: counted as activations of the compute dtype (a lower
bound); FSDP2's MixedPrecisionPolicy and a pure bf16 model hold them in the compute dtype, as counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from advisor.estimate.activations import shape_of
from advisor.precision import FP32

if TYPE_CHECKING:
    from advisor.estimate.step_time import FlopCount
    from advisor.hardware.cluster import Hardware
    from advisor.hardware.efficiency import EfficiencyProfile
    from advisor.model.spec import ModelSpec
    from advisor.training import TrainingConfig

LLAMA_LIKE = ("decoder", "size", "guessed")  # block kinds (advisor.model.block_kinds) counted here


class BlockBytes(BaseModel):
    """HBM bytes a token of one block's elementwise and reduction kernels move (module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    eager_forward: int = Field(ge=0)
    eager_backward: int = Field(ge=0)
    compiled_forward: int = Field(ge=0)
    compiled_backward: int = Field(ge=0)

    @property
    def eager(self) -> int:
        return self.eager_forward + self.eager_backward

    @property
    def compiled(self) -> int:
        return self.compiled_forward + self.compiled_backward

    @property
    def saved_forward(self) -> int:
        return self.eager_forward - self.compiled_forward

    @property
    def saved_backward(self) -> int:
        return self.eager_backward - self.compiled_backward


def block_bytes(*, hidden: int, intermediate: int, q_width: int, kv_width: int, head_dim: int,
                activation_bytes: int, norm_weight_grads: bool = True) -> BlockBytes:
    """Bytes a token of one Llama-like block, eager and compiled (the op lists of the module docstring).
    ``norm_weight_grads`` False: the norms' weights are frozen (a LoRA base), so neither mode runs their weight
    gradients: eager loses each norm's product and sum (4a h), compiled its two weight-gradient kernels (7a h + 8)
    (benchmarks/compile_bytes.py, the LoRA section's frozen block)."""
    a, h, f, hd = activation_bytes, hidden, intermediate, head_dim
    widths = q_width + kv_width
    cast = a + FP32 if a < FP32 else 0  # x.float() and .to(input_dtype): no kernel when already fp32
    norm_fwd = 2 * cast * h + 20 * h + 2 * a * h + 24
    norm_bwd = 6 * a * h + 2 * cast * h + 68 * h + 40
    eager_fwd = 2 * norm_fwd + 2 * 3 * a * h + 10 * a * widths + 2 * 2 * a * hd + 5 * a * f
    eager_bwd = 9 * a * f + 5 * 3 * a * h + 2 * norm_bwd + 11 * a * widths + 2 * 2 * a * hd + 2 * a * widths
    compiled_fwd = (2 * a * h + 4) + 5 * a * widths + 2 * 2 * a * hd + (3 * a * h + 4) + 3 * a * f + 4 * a * h
    compiled_bwd = 5 * a * f + (6 * a * h + 4) + 2 * a * widths + 2 * 2 * a * hd + (7 * a * h + 8) + (6 * a * h + 4)
    if not norm_weight_grads:
        eager_bwd -= 2 * 4 * a * h
        compiled_bwd -= 7 * a * h + 8
    return BlockBytes(eager_forward=eager_fwd, eager_backward=eager_bwd,
                      compiled_forward=compiled_fwd, compiled_backward=compiled_bwd)


def check_compile(spec: ModelSpec) -> None:
    """ValueError when ``--compile`` meets a block this module has not counted (module docstring)."""
    shape = shape_of(spec)
    if shape.kind not in LLAMA_LIKE or shape.family != "decoder" or shape.moe is not None or shape.mla is not None:
        raise ValueError(f"--compile: only Llama-like decoder blocks are modelled (RMSNorm, RoPE, gated MLP); "
                         f"{spec.name} is a {shape.kind} model")


def spec_block_bytes(spec: ModelSpec, training: TrainingConfig) -> BlockBytes:
    """``block_bytes`` over the spec's shape, activations in the compute dtype."""
    shape = shape_of(spec)
    return block_bytes(hidden=shape.hidden_size, intermediate=shape.intermediate_size,
                       q_width=shape.num_attention_heads * shape.head_dim, kv_width=shape.num_kv_heads * shape.head_dim,
                       head_dim=shape.head_dim, activation_bytes=training.compute_bytes,
                       norm_weight_grads=training.lora is None)


def compile_saving_s(spec: ModelSpec, hardware: Hardware, training: TrainingConfig, eff: EfficiencyProfile, *,
                     tokens: int, checkpointing: bool, flops: FlopCount, rate: float, peak: float,
                     shifted: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float]:
    """(forward, backward + recompute) seconds ``--compile`` saves on a micro-batch of ``tokens`` tokens
    whose ``flops`` run at ``rate`` FLOP/s (0, 0 when it is off); the caller divides by its model-parallel
    split. Capped so the matmuls left never run above the datasheet ``peak`` (FLOP/s): on a narrow model
    the fitted eager utilisation can leave less time than the bytes are worth. ``shifted``: seconds already
    added to that time (``advisor.estimate.bandwidth_time``; negative on faster HBM), which the cap counts."""
    if not training.compile:
        return 0.0, 0.0
    check_compile(spec)
    block = spec_block_bytes(spec, training)
    per_pass = shape_of(spec).num_layers * tokens / (hardware.gpu.hbm_bandwidth_gbps * 1e9
                                                     * eff.optimizer_step.hbm_efficiency)
    recompute = block.saved_forward if checkpointing else 0
    return (max(0.0, min(block.saved_forward * per_pass, flops.forward * (1 / rate - 1 / peak) + shifted[0])),
            max(0.0, min((block.saved_backward + recompute) * per_pass,
                         flops.hardware_backward * (1 / rate - 1 / peak) + shifted[1])))


def compile_notes(spec: ModelSpec, saved_s: float) -> list[str]:
    """What the compiled estimate assumed (plan notes)."""
    shape = shape_of(spec)
    notes = [f"--compile: inductor's fusion of each block's norms, RoPE, SiLU x up and residual adds saves "
             f"{saved_s * 1e3:.1f} ms a step (HBM bytes, advisor.estimate.compile_time); memory: where measured, what "
             f"the partitioner saves (advisor.estimate.compile_memory), else eager"]
    extra = [name for name, on in (("q/k norms", shape.qk_norm), ("sandwich norms", shape.sandwich_norms),
                                   ("fp32 (1 + weight) norm scales", shape.fp32_norm_scale),
                                   ("soft-capping", shape.attn_softcap or shape.logit_softcap)) if on]
    if extra:
        notes.append(f"--compile: this block's {', '.join(extra)} are not counted (the saving is a lower bound)")
    return notes

"""Time of the LoRA adapters' own memory traffic, per micro-batch on one GPU (read by ``step_time``).

What belongs here: the HBM bytes PEFT's adapter ops move beyond their FLOPs, and their seconds. What
does not: the adapters' FLOPs, which ``step_time.count_flops`` already counts (the adapters are in the
spec's parameters: 2 x tokens x r x (in + out) a target in forward, input and weight gradients in
backward, one forward more in the recompute), at the large GEMMs' utilisation.

Why a separate charge: PEFT's ``Linear.forward`` (``peft/tuners/lora/layer.py``, peft 0.21) runs, for
every adapted linear ``in -> out`` of rank r, ``result = result + lora_B(lora_A(dropout(x))) * scaling``
after the base layer, with ``x = self._cast_input_dtype(x, lora_A.weight.dtype)`` first. Each is its own
eager kernel over the tokens: a skinny product (r FLOPs a byte of ``x`` read, under the ridge point of
every GPU in the catalogue) or an elementwise op, so each is bound by the bytes it moves, which the
matmul utilisation never sees. torchtune's ``LoRALinear.forward`` (``torchtune/modules/peft/lora.py``:
``out + (alpha / rank) * lora_b(lora_a(dropout(x)))``) runs the same kernels, without the input cast. Bytes a token of one adapted linear, c the compute dtype's width:

forward: lora_A reads x (c x in) and writes r; lora_B reads r and writes out; ``* scaling`` reads and
  writes out; ``result +`` reads two and writes one out: c x (in + 2r + 6 out).
  Dropout (p > 0, ``nn.Dropout``: ``native_dropout``) reads and writes the input and writes a 1-byte
  mask: (2a + 1) x in, a the adapter input's width (4 where it was cast to fp32, else c).
  Autocast over fp32 adapters (``input_casts``: a bf16 base under bf16-mixed, PEFT's
  ``autocast_adapter_dtype``): ``x.to(float32)`` reads c and writes 4 a feature, and autocast's cast
  of lora_A's input back reads 4 and writes c: 2 x (c + 4) x in.
backward: ``* scaling``'s gradient reads and writes out; lora_B's input and weight gradients each read
  the gradient of out (and read or write r); lora_A's input gradient writes in, its weight gradient
  reads the saved input; autograd adds the adapter's input gradient to the base layer's (reads two,
  writes one in): c x (5 in + 4 out + 4r). The dropout's and the casts' backward move what their
  forward moved.
fp32 adapters without autocast (``TrainingConfig.fp32_adapters``: PEFT's fp32 adapters under pure bf16 where the
  stack never casts the model): the adapter path's tensors are fp32 and the input and output are cast
  (``_fp32_adapter_bytes``).
checkpointing: the recompute runs the forward again (also under selective checkpointing, which keeps
  some adapter products but recomputes the elementwise ops: a slight over-charge there).

Under ``--compile`` (inductor), the two skinny products stay cuBLAS calls (extern kernels: the same bytes)
and the elementwise ops fuse into their neighbours (the norms, RoPE, ``silu(gate) * up``, the residual adds), so
what an adapter adds to the block's fused kernels depends on where its output goes. Measured with inductor's
own count of each scheduled kernel's reads and writes (benchmarks/compile_bytes.py, the LoRA section: a Llama
block with a frozen bf16 base, PEFT adapters on one target at a time, differenced against the block without
them), an adapter's elementwise bytes a token are ``COMPILED_ELEMENTWISE``: forward k_f x out, backward
in + k_b x out (times c), against eager's 5 out and 3 in + 2 out. The same rule predicts every target together
at another width and rank exactly (the benchmark's check). Dropout and the autocast input casts keep their eager
bytes (inductor fuses them too: an over-charge, not measured); a target outside the table (a fused qkv_proj)
keeps the eager count.

Time = bytes / (HBM bandwidth x ``lora_adapters.hbm_efficiency``, profiles/efficiency.json: a copy
kernel's measured share of the datasheet bandwidth, so the time is a lower bound). Not charged: the
adapters' weight casts and gradient accumulation (parameter-sized, not token-sized), DoRA's own
products (charged as LoRA's), a Llava tower's adapters, kernel launch gaps (no published per-launch
figure; they hide behind kernels this long).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from advisor.model.lora import LoraConfig, adapted_block_linears, block_linears, target_names
from advisor.model.spec import ModelSpec

if TYPE_CHECKING:
    from advisor.hardware.cluster import Hardware
    from advisor.hardware.efficiency import EfficiencyProfile
    from advisor.strategies import Implementation
    from advisor.training import TrainingConfig

FP32 = 4
MASK_BYTES = 1  # native_dropout's bool mask


# (k_f, k_b) by target: a compiled adapter's elementwise bytes a token are c x k_f x out in forward and
# c x (in + k_b x out) in backward (module docstring; benchmarks/compile_bytes.py measures them). q and k feed
# RoPE, v the attention kernel, o the residual add whose sum the next norm and the last add recompute,
# gate and up the fused silu(gate) * up, down the block's last residual add.
COMPILED_ELEMENTWISE: dict[str, tuple[int, int]] = {
    "q_proj": (2, 2), "k_proj": (2, 2), "v_proj": (3, 2), "o_proj": (2, 3),
    "gate_proj": (2, 1), "up_proj": (2, 1), "down_proj": (1, 2),
}


def adapter_bytes_per_token(fan_in: int, fan_out: int, rank: int, *, compute_bytes: int, input_casts: bool,
                            dropout: bool, compiled_as: str | None = None,
                            fp32_adapters: bool = False) -> tuple[int, int]:
    """(forward, backward) HBM bytes a token of one adapted ``fan_in -> fan_out`` linear (module docstring);
    ``compiled_as``: the target's name when inductor compiles the block (its ``COMPILED_ELEMENTWISE`` row;
    a name outside the table keeps the eager count). ``fp32_adapters``: PEFT's fp32 adapters without autocast
    (``TrainingConfig.fp32_adapters``), counted eager, compiled or not."""
    c = compute_bytes
    if fp32_adapters:
        return _fp32_adapter_bytes(fan_in, fan_out, rank, compute_bytes=c, dropout=dropout)
    products = (c * (fan_in + 2 * rank + fan_out), c * (2 * fan_in + 2 * fan_out + 4 * rank))  # the skinny GEMMs
    k = COMPILED_ELEMENTWISE.get(compiled_as or "")
    if k is None:  # eager: * scaling and + in forward; the scaling's and the input gradient's sums in backward
        elementwise = (5 * c * fan_out, c * (3 * fan_in + 2 * fan_out))
    else:
        elementwise = (c * k[0] * fan_out, c * (fan_in + k[1] * fan_out))
    forward, backward = products[0] + elementwise[0], products[1] + elementwise[1]
    adapter_input = FP32 if input_casts else c
    extra = (2 * adapter_input + MASK_BYTES) * fan_in if dropout else 0
    if input_casts:
        extra += 2 * (c + FP32) * fan_in
    return forward + extra, backward + extra


def _fp32_adapter_bytes(fan_in: int, fan_out: int, rank: int, *, compute_bytes: int, dropout: bool) -> tuple[int, int]:
    """``adapter_bytes_per_token`` for fp32 adapters without autocast, a = 4 bytes, c the base's width: PEFT casts x
    to fp32 ((c + a) in), the skinny products read and write fp32 (a x the eager count's elements); in forward
    ``* scaling`` (2a out), ``result +`` the bf16 base output and the fp32 product into fp32 ((c + 2a) out) and
    ``result.to(c)`` ((a + c) out); in backward the scaling's gradient (2a out), the cast back of ``result.to``'s
    gradient ((c + a) out) and of the add's promoted base-output gradient ((a + c) out), the input cast's ((a + c)
    in) and the sum with the base layer's input gradient (3c in); dropout on the fp32 input as under autocast."""
    a, c = FP32, compute_bytes
    forward = a * (fan_in + 2 * rank + fan_out) + (5 * a + 2 * c) * fan_out + (c + a) * fan_in
    backward = a * (2 * fan_in + 2 * fan_out + 4 * rank) + (4 * a + 2 * c) * fan_out + (a + 4 * c) * fan_in
    extra = (2 * a + MASK_BYTES) * fan_in if dropout else 0
    return forward + extra, backward + extra


def adapter_bytes(spec: ModelSpec, lora: LoraConfig, *, tokens: int, compute_bytes: int,
                  input_casts: bool, compiled: bool = False, fp32_adapters: bool = False) -> tuple[int, int]:
    """(forward, backward) HBM bytes of one micro-batch of ``tokens`` tokens through every block's adapters;
    ``compiled``: inductor compiles the blocks (``--compile``)."""
    listed = adapted_block_linears(spec, lora)  # unlike blocks (T5, Jamba): each adapted linear once
    if listed is None:
        linears = block_linears(spec)
        every = tuple((name, *shape) for name in target_names(spec, lora) for shape in linears[name])
        tokens *= spec.num_layers or 0  # every block as block 0
    else:
        every = tuple((None, *shape) for shape in listed)
    per_token = [adapter_bytes_per_token(fan_in, fan_out, lora.rank, compute_bytes=compute_bytes,
                                         input_casts=input_casts, dropout=lora.dropout > 0,
                                         compiled_as=name if compiled else None, fp32_adapters=fp32_adapters)
                 for name, fan_in, fan_out in every]
    return tokens * sum(f for f, _ in per_token), tokens * sum(b for _, b in per_token)


def adapter_s(spec: ModelSpec, hw: "Hardware", training: "TrainingConfig", impl: "Implementation",
              eff: "EfficiencyProfile", *, tokens: int, checkpointing: bool) -> tuple[float, float]:
    """(forward, backward + recompute) seconds of one micro-batch's adapter traffic; (0, 0) without LoRA."""
    if training.lora is None or not spec.num_layers:
        return 0.0, 0.0
    from advisor.estimate.memory import recipe_dtypes  # memory.py is heavy; only LoRA plans need it here

    dt = recipe_dtypes(training, impl)
    forward, backward = adapter_bytes(spec, training.lora, tokens=tokens, compute_bytes=dt.compute,
                                      input_casts=dt.input_casts, compiled=training.compile,
                                      fp32_adapters=dt.adapter is not None)
    bandwidth = hw.gpu.hbm_bandwidth_gbps * 1e9 * eff.lora_adapters.hbm_efficiency
    return forward / bandwidth, (backward + (forward if checkpointing else 0)) / bandwidth


def adapter_note(seconds: float, hw: "Hardware", eff: "EfficiencyProfile", *, compiled: bool = False) -> str:
    fused = " (their elementwise ops fused as inductor fuses them)" if compiled else ""
    return (f"LoRA adapters: their skinny products and elementwise ops are memory-bound{fused}, {seconds:.3f} s a "
            f"micro-batch at {eff.lora_adapters.hbm_efficiency:.0%} of {hw.gpu.hbm_bandwidth_gbps:,.0f} GB/s")

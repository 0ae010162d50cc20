"""Time of torchao float8 training (``--float8``), per micro-batch on one rank (read by ``step_time`` and
``mesh_time``).

What belongs here: which matrix products run in fp8, the seconds they save at the fp8 peak, the bytes the
dynamic casts move, and the bytes a float8 FSDP all-gather saves. What does not: memory (not modelled:
estimated as the bf16 run, ``profiles/float8.json`` ``memory_note``), torch.compile, rowwise recipes,
MoE experts' grouped GEMMs (not ``nn.Linear``: left bf16, as torchao's ``Float8Linear`` leaves them).
Every fact is cited in ``profiles/float8.json``. The model:

- Which products: torchtitan converts every ``nn.Linear`` of the blocks whose in and out features are
  multiples of 16, not the output head (``fqn != "output"``); the lookup, SDPA's score and value products
  and the head stay bf16. A converted linear ``K -> N`` on ``T`` tokens runs its three GEMMs in fp8
  (tensorwise recipe): ``2 T K N`` FLOPs in forward (output), ``4 T K N`` in backward (grad_input and
  grad_weight), and the recomputed forward's share under checkpointing (full: all of it; selective: the
  products the policy does not keep, ``advisor.model.selective``).
- Their time: a GEMM's own time is its FLOPs / (peak x ``gemm_utilisation``), the share of the peak a large
  GEMM reaches (0.78 on H100, torchao's roofline, measured on large inputs), or the step's end-to-end
  utilisation (``profiles/efficiency.json``) where that is higher. The end-to-end utilisation also carries the
  elementwise kernels, norms and launch gaps, which fp8 does not speed up, so only the GEMMs' own time
  changes: ``fp8 FLOPs x (1 / fp8 rate - 1 / bf16 rate)``, negative, with the fp8 rate at the GPU's dense
  fp8 peak (``profiles/gpus.json`` ``fp8_tflops``) times the same share times ``gemm_utilisation_ratio``
  (1.0: published H100 GEMM measurements put fp8 at 1.9-2.6x bf16 on these models' shapes).
- The casts, memory-bound, per micro-batch (bytes an element, by hand from ``float8_linear.py``): the input
  (T x K) 6 in forward, grad_output (T x N) 6 in backward, the weight (K x N) 5 in forward and 3 in
  backward; a recompute casts the input (6) and the weight (5) again, in the share recomputed. With float8
  all-gather the weight arrives in fp8: its shard (``1 / S`` of it) is cast before each all-gather (3) and
  its amax taken once a step (2, charged each micro-batch), and the gathered weight is copied to the
  column-major layout grad_input's GEMM needs (2). Seconds = bytes / (HBM bandwidth x the optimizer
  step's ``hbm_efficiency``).
- Communication: a float8 all-gather moves 1 byte a converted weight instead of 2, plus one fp32 scale a
  converted linear (``float8_gather_saving_bytes``); tensor-parallel all-gathers move fp8 activations
  (``mesh_time.tp_comm_s``).

Worked example (tests/estimate/test_float8_time.py): a one-block Llama of width 64 (4 heads of 16,
intermediate 128, vocabulary 256), 32 tokens, no checkpointing, weights whole (one GPU). Converted
linears q, k, v, o 64 -> 64, gate, up 64 -> 128, down 128 -> 64: 4 x 4,096 + 3 x 8,192 = 40,960
weights. fp8 FLOPs: forward 2 x 40,960 x 32 = 2,621,440, backward 5,242,880. Input features
6 x 64 + 128 = 512, output features 4 x 64 + 2 x 128 + 64 = 576. Cast bytes: forward 6 x 32 x 512
+ 5 x 40,960 = 98,304 + 204,800 = 303,104; backward 6 x 32 x 576 + 3 x 40,960 = 110,592 + 122,880
= 233,472. (The head, 64 x 256, stays bf16.)
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from advisor.model.block_kinds import kind_of
from advisor.model.lora import block_linears
from advisor.model.selective import selective_kept
from advisor.model.spec import ModelSpec
from advisor.training import TrainingConfig
from advisor.units import GB, TFLOPS
from profiles import PROFILES_DIR

if TYPE_CHECKING:
    from advisor.hardware.cluster import Hardware
    from advisor.strategies import Implementation

FLOAT8_FILE = PROFILES_DIR / "float8.json"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CastBytes(_Frozen):
    """HBM bytes an element moves in the dynamic casts of one micro-batch (``cast_source``)."""

    input_forward: int = Field(ge=0, description="Input: amax, cast to both GEMM layouts.")
    grad_output_backward: int = Field(ge=0, description="grad_output: amax, cast to both GEMM layouts.")
    weight_forward: int = Field(ge=0, description="Weight: amax and the forward cast.")
    weight_backward: int = Field(ge=0, description="Weight: the backward cast for grad_input's GEMM.")
    input_recompute: int = Field(ge=0, description="Input, cast again by a recomputed forward.")
    weight_recompute: int = Field(ge=0, description="Weight, amax and cast again by a recomputed forward.")


class AllGatherBytes(_Frozen):
    shard_cast: int = Field(ge=0, description="Bytes a shard element moves to cast it before an all-gather.")
    shard_amax: int = Field(ge=0, description="Bytes a shard element moves for its amax, once a step.")
    gathered_relayout: int = Field(ge=0, description="Bytes a gathered fp8 element moves to change layout.")
    scale_bytes: int = Field(ge=0, description="The fp32 scale gathered with each converted weight.")
    source: str


class Float8Facts(_Frozen):
    recipe: str
    recipe_source: str
    dim_multiple: int = Field(ge=1, description="A linear is converted when in and out features are multiples of it.")
    skip_output_head: bool
    filter_source: str
    gemm_utilisation: float = Field(gt=0, le=1, description="Share of its peak a large GEMM reaches (torchao).")
    gemm_share_source: str
    gemm_utilisation_ratio: float = Field(gt=0, le=2, description="An fp8 GEMM's share of the fp8 peak over a bf16 "
                                                                  "GEMM's share of the bf16 peak.")
    gemm_utilisation_source: str
    gemm_utilisation_note: str
    cast_bytes_per_element: CastBytes
    cast_source: str
    all_gather: AllGatherBytes
    tensor_parallel_source: str
    memory_note: str


@functools.lru_cache(maxsize=1)
def load_float8_facts() -> Float8Facts:
    """The bundled float8 facts (read once; the file is immutable package data)."""
    raw = json.loads(FLOAT8_FILE.read_text())
    raw.pop("_doc", None)
    return Float8Facts(**raw)


class Float8Work(_Frozen):
    """What float8 changes in one micro-batch on one rank: fp8 FLOPs and the casts' HBM bytes."""

    forward_flops: float = Field(ge=0)
    backward_flops: float = Field(ge=0, description="grad_input and grad_weight GEMMs.")
    recompute_flops: float = Field(ge=0, description="The converted products checkpointing recomputes.")
    forward_bytes: float = Field(ge=0, description="Cast bytes in forward.")
    backward_bytes: float = Field(ge=0, description="Cast bytes in backward, the recompute's included.")


def float8_linears(spec: ModelSpec) -> tuple[tuple[int, int], ...]:
    """(in, out) of one block's linear layers torchao converts: both sizes multiples of ``dim_multiple``."""
    multiple = load_float8_facts().dim_multiple
    return tuple((k, n) for shapes in block_linears(spec).values() for k, n in shapes
                 if k % multiple == 0 and n % multiple == 0)


def check_float8(spec: ModelSpec, gpu_name: str, fp8_tflops: float | None, training: TrainingConfig, *,
                 pp: int | None = None) -> None:
    """ValueError (one line, exit 2) where ``--float8`` cannot be planned: no fp8 tensor cores, a model
    family whose blocks are not decoder blocks, or a pinned pipeline (its step time is not modelled)."""
    if not training.float8:
        return
    if fp8_tflops is None:
        raise ValueError(f"--float8: the {gpu_name} has no fp8 tensor cores (profiles/gpus.json); torchao float8 "
                         "training needs Ada, Hopper, Blackwell or MI300")
    if kind_of(spec).family != "decoder" or kind_of(spec).name == "jamba":  # Jamba: first block != the others
        raise ValueError(f"--float8 is modelled for decoder-only language models, not {spec.model_type or spec.name}")
    if pp is not None and pp > 1:
        raise ValueError("--float8 with --pp: the pipeline step time does not model float8; leave out one of them")
    if spec.source == "params":  # torchao converts the linears whose sizes it divides: a size alone names none
        raise ValueError("--float8 needs the model's linear layers: give --model (a bundled id or a config), not "
                         "--params alone")
    float8_linears(spec)  # a family whose linear layers are not known: ValueError now


def float8_work(spec: ModelSpec, *, tokens: int, checkpointing: bool, selective: bool, tp: int = 1, cp: int = 1,
                shards: int = 1, fp8_gathers: int = 0) -> Float8Work:
    """fp8 FLOPs and cast bytes of one micro-batch of ``tokens`` tokens (one replica's) on a rank of a
    ``tp`` x ``cp`` split, weights sharded over ``shards`` ranks; ``fp8_gathers``: float8 all-gathers a
    micro-batch (0: weights gathered in bf16 or not sharded, cast in the linear; 1 or 2 with resharding)."""
    facts = load_float8_facts()
    linears = float8_linears(spec)
    layers = spec.num_layers or 0
    weights = sum(k * n for k, n in linears) * layers  # the whole model's converted weights
    forward = 2 * weights * tokens / (tp * cp)
    share = 0.0
    if checkpointing:
        share = 1.0
        kept = selective_kept(spec, None) if selective else None
        if kept is not None and weights:  # the policy keeps these products: not recomputed
            multiple = facts.dim_multiple
            kept_weights = sum(k * n for k, n in kept.linears if k % multiple == 0 and n % multiple == 0) * layers
            share = max(0.0, 1 - kept_weights / weights)
    rank_tokens = tokens / cp
    inputs = rank_tokens * sum(k for k, _ in linears) * layers / tp  # elements on this rank
    outputs = rank_tokens * sum(n for _, n in linears) * layers / tp
    local = weights / tp
    cast = facts.cast_bytes_per_element
    if fp8_gathers:
        ag = facts.all_gather
        weight_fwd = (ag.shard_amax + ag.shard_cast) * local / shards
        weight_bwd = ag.shard_cast * local / shards * (fp8_gathers - 1) + ag.gathered_relayout * local
        weight_again = 0.0  # the recompute reads the gathered fp8 weight
    else:
        weight_fwd, weight_bwd = cast.weight_forward * local, cast.weight_backward * local
        weight_again = cast.weight_recompute * local
    return Float8Work(
        # grad_input always; grad_weight where the weight trains (--trainable-params freezes some: count_flops)
        forward_flops=forward, backward_flops=forward * (1 + spec.trainable_params / spec.total_params),
        recompute_flops=share * forward,
        forward_bytes=cast.input_forward * inputs + weight_fwd,
        backward_bytes=(cast.grad_output_backward * outputs + weight_bwd
                        + share * (cast.input_recompute * inputs + weight_again)),
    )


def float8_gather_saving_bytes(spec: ModelSpec, training: TrainingConfig, *, tp: int = 1) -> float:
    """Bytes one full all-gather of the (TP rank's) parameters moves less under float8 all-gather: 1 byte a
    converted weight instead of the compute dtype's, plus each converted weight's fp32 scale."""
    if not training.float8_all_gather:
        return 0.0
    linears = float8_linears(spec)
    layers = spec.num_layers or 0
    weights = sum(k * n for k, n in linears) * layers / tp
    return weights * (training.compute_bytes - 1) - load_float8_facts().all_gather.scale_bytes * len(linears) * layers


def float8_step_s(work: Float8Work, *, bf16_rate: float, fp8_rate: float,
                  hbm_bytes_per_s: float) -> tuple[float, float]:
    """(forward, backward) seconds float8 adds to one micro-batch timed at ``bf16_rate`` FLOP/s: the fp8
    products' saving at ``fp8_rate`` (negative) plus the casts at ``hbm_bytes_per_s``."""
    gain = 1 / fp8_rate - 1 / bf16_rate
    return (work.forward_flops * gain + work.forward_bytes / hbm_bytes_per_s,
            (work.backward_flops + work.recompute_flops) * gain + work.backward_bytes / hbm_bytes_per_s)


def float8_rates(fp8_tflops: float, bf16_tflops: float, *, utilisation: float, hbm_bandwidth_gbps: float,
                 hbm_efficiency: float) -> tuple[float, float, float]:
    """(bf16 GEMM FLOP/s, fp8 GEMM FLOP/s, cast bytes/s) on a GPU whose step reaches ``utilisation`` of its bf16
    peak end to end: the GEMMs alone at ``gemm_utilisation`` (or the step's utilisation where higher)."""
    facts = load_float8_facts()
    gemm = max(utilisation, facts.gemm_utilisation)
    return (bf16_tflops * TFLOPS * gemm, fp8_tflops * TFLOPS * gemm * facts.gemm_utilisation_ratio,
            hbm_bandwidth_gbps * GB * hbm_efficiency)


def float8_note(work: Float8Work, *, total_flops: float, fp8_tflops: float, seconds: float,
                all_gather: bool) -> str:
    """What the estimate assumed for float8 (one line of the plan's notes)."""
    facts = load_float8_facts()
    fp8 = work.forward_flops + work.backward_flops + work.recompute_flops
    gather = ("; FSDP all-gathers the converted weights in fp8 (1 byte a weight and its scale)" if all_gather
              else "")
    share = fp8 / max(total_flops, 1)
    return (f"float8 (torchao {facts.recipe}): the blocks' linear layers, {share:.0%} of the FLOPs, "
            f"their GEMMs at {facts.gemm_utilisation:.0%} of the {fp8_tflops:,.0f} TFLOPS fp8 peak instead of the "
            f"bf16 one (torchao's large-GEMM share; profiles/float8.json); attention and the head in bf16; the "
            f"dynamic casts move "
            f"{(work.forward_bytes + work.backward_bytes) / GB:.2f} GB a micro-batch; net {seconds * 1e3:+.1f} ms a "
            f"micro-batch{gather}; memory is estimated as the bf16 run (not modelled for float8); MFU is against "
            "the bf16 peak")


def float8_seconds(spec: ModelSpec, hw: Hardware, training: TrainingConfig, impl: Implementation, *, tokens: int,
                   checkpointing: bool, utilisation: float, bf16_tflops: float, hardware_flops: float,
                   hbm_efficiency: float, tp: int = 1, cp: int = 1,
                   shards: int | None = None) -> tuple[float, float, str]:
    """(forward s, backward s, note) ``--float8`` adds to one micro-batch of ``tokens`` tokens (one replica's)
    on a rank whose step reaches ``utilisation`` of ``bf16_tflops`` end to end; ``hardware_flops``: that rank's
    FLOPs of the micro-batch (for the note); ``shards``: ranks the parameters are sharded over (default: all
    GPUs when the strategy shards parameters). (0, 0, "") without ``--float8``."""
    if not training.float8:
        return 0.0, 0.0, ""
    fp8_tflops = hw.gpu.fp8_tflops
    assert fp8_tflops is not None, "the planner refuses --float8 on a GPU with no fp8 peak (check_float8)"
    sharded = shards if shards is not None else (hw.world_size if impl.shard_params else 1)
    # torchtitan enables the float8 all-gather only where FSDP shards the parameters
    gathers = (2 if impl.reshard_after_forward else 1) if training.float8_all_gather and impl.shard_params else 0
    work = float8_work(spec, tokens=tokens, checkpointing=checkpointing,
                       selective=training.activation_checkpointing == "selective", tp=tp, cp=cp, shards=sharded,
                       fp8_gathers=gathers)
    bf16_rate, fp8_rate, bytes_s = float8_rates(fp8_tflops, bf16_tflops, utilisation=utilisation,
                                                hbm_bandwidth_gbps=hw.gpu.hbm_bandwidth_gbps,
                                                hbm_efficiency=hbm_efficiency)
    fwd, bwd = float8_step_s(work, bf16_rate=bf16_rate, fp8_rate=fp8_rate, hbm_bytes_per_s=bytes_s)
    note = float8_note(work, total_flops=hardware_flops, fp8_tflops=fp8_tflops, seconds=fwd + bwd,
                       all_gather=gathers > 0)
    return fwd, bwd, note

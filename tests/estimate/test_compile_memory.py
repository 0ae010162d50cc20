"""``--compile``'s saved activations (advisor.estimate.compile_memory): the estimate's per-layer count of a
compiled block against AOTAutograd's partitioner (inductor's partition_fn) run on fake tensors, one block by
hand, where the list applies, and a plan that moves (and one that must not)."""

from __future__ import annotations

import pytest

from advisor.estimate.activations import ActivationShape, Dtypes, estimate_activations
from advisor.estimate.compile_memory import compile_dropped_per_token, compile_saves_less, compiled_activations

pytest.importorskip("transformers")
import functorch.compile  # noqa: E402,F401  (imported here, at collection, as the other modules import torch)
import transformers.models.llama.modeling_llama  # noqa: E402,F401

from tests.saved_tensors import compiled_saved  # noqa: E402

SMALL = dict(hidden_size=256, intermediate_size=704, num_attention_heads=8, num_key_value_heads=2)
BF16 = Dtypes(residual=2, compute=2, input_casts=False)
AUTOCAST = Dtypes(residual=4, compute=2, input_casts=True)  # fp32 weights under bf16 autocast
RSQRT = 2 * 4  # the two fp32 rsqrt outputs a token, saved in both modes and left out of the estimate


def _shape(h=256, f=704, heads=8, kv=2, **extra) -> ActivationShape:
    return ActivationShape(num_layers=2, hidden_size=h, num_attention_heads=heads, num_kv_heads=kv, head_dim=h // heads,
                           intermediate_size=f, vocab_size=128, family="decoder", kind="decoder", **extra)


def test_dropped_by_hand():
    """h = 8, f = 16, bf16: two norms drop x.float() 4h = 32 and the normalised cast 2h = 16 each (96), silu(gate)
    2f = 32; they save their bf16 input 2h = 16 each instead (32): 96 + 32 - 32 = 96 bytes a token.
    Autocast: two norms drop their fp32 input 4h and x * rsqrt 4h (128), five input casts 5 x 2h = 80, silu 32;
    the block input 4h = 32, o_proj's output 2h = 16 and a cast per norm 2 x 2h = 32 are saved: 240 - 80 = 160."""
    assert compile_dropped_per_token(_shape(h=8, f=16, heads=2, kv=1), BF16) == 96
    assert compile_dropped_per_token(_shape(h=8, f=16, heads=2, kv=1), AUTOCAST) == 160


@pytest.mark.parametrize("autocast", [False, True])
def test_layer_matches_the_partitioner_on_fake_tensors(autocast):
    """A 256-wide LlamaDecoderLayer (704 MLP, 8 / 2 heads), bf16, SDPA, 1 x 128 tokens, through aot_function and
    min_cut_rematerialization_partition(compiler="inductor") (inductor's own partition_fn and decompositions save
    the same tensors here: benchmarks/compile_saved.py, 7,592 bytes a token, 8,104 under autocast, its weight casts
    left out): what its forward graph saves for
    backward, a token of the layer, equals the estimate's compiled layer (plus the two rsqrt outputs it ignores)."""
    tokens, dt = 128, AUTOCAST if autocast else BF16
    measured = sum(row[3] for row in compiled_saved(SMALL, batch=1, seq=tokens, inductor=False, autocast=autocast))
    eager = estimate_activations(_shape(), dt, micro_batch_size=1, seq_len=tokens, checkpointing=False, eager=False)
    compiled = compiled_activations(eager, _shape(), dt, tokens=tokens, checkpointing=False, eager_attention=False,
                                    lora=False)
    assert compiled.layer_bytes + tokens * RSQRT == measured
    assert eager.saved_bytes - compiled.saved_bytes == 2 * (eager.layer_bytes - compiled.layer_bytes)


@pytest.mark.parametrize("case", [
    dict(dt=Dtypes(residual=2, compute=2, input_casts=True)),  # autocast over a bf16 base (LoRA): not measured
    dict(dt=Dtypes(residual=4, compute=4, input_casts=False)),  # fp32: x.float() is the residual itself
    dict(checkpointing=True), dict(eager_attention=True), dict(lora=True),
    dict(shape=_shape(qk_norm=True)), dict(shape=_shape(fp32_norm_scale=True)),
])
def test_eager_count_kept_where_not_measured(case):
    args = dict(shape=_shape(), dt=BF16, checkpointing=False, eager_attention=False, lora=False) | case
    assert not compile_saves_less(args.pop("shape"), args.pop("dt"), **args)


@pytest.mark.parametrize("h,f,measured", [(256, 704, 3_104), (512, 1408, 6_176)])
def test_selective_block_keeps_what_the_compiled_graph_saves(h, f, measured):
    """Under torchtitan's selective op checkpointing a compiled bf16 block saved, a token, the block input, q's and
    v's projections, SDPA's output and logsumexp and gate's projection: 3,104 bytes at h 256, f 704 and 6,176 at
    h 512, f 1408 (8 / 2 heads; benchmarks/compile_saved_sac.py on real CPU tensors, compile_saved.md). Eager keeps
    down_proj's output too (kept width q + kv + f + h): 2h + 2 (q + q + kv + f + h) + 4 x 8 = 3,616 at h 256."""
    tokens, shape = 128, _shape(h=h, f=f)
    q, kv = h, 2 * (h // 8)
    eager = estimate_activations(shape, BF16, micro_batch_size=1, seq_len=tokens, checkpointing=True, eager=False,
                                 selective=True, kept_width=q + kv + f + h, kept_tail_width=h)
    compiled = compiled_activations(eager, shape, BF16, tokens=tokens, checkpointing=True, eager_attention=False,
                                    lora=False, selective=True)
    assert compiled.block_kept_bytes == tokens * measured
    assert eager.block_kept_bytes - compiled.block_kept_bytes == tokens * 2 * h
    assert compiled.layer_bytes == eager.layer_bytes  # the recomputation inside the compiled backward: not measured


@pytest.mark.parametrize("case", [dict(dt=AUTOCAST), dict(eager_attention=True), dict(lora=True),
                                  dict(shape=_shape(qk_norm=True))])
def test_selective_eager_where_not_measured(case):
    args = dict(shape=_shape(), dt=BF16, checkpointing=True, eager_attention=False, lora=False, selective=True) | case
    assert not compile_saves_less(args.pop("shape"), args.pop("dt"), **args)


def test_selective_plan_by_hand():
    """Llama-3.1-8B, torchtitan's recipe (FSDP2, bf16 blocks), zero3 on 8 x H100, micro-batch 2 x 8192, selective
    checkpointing, the chunked loss (so the recipe's compiled cross-entropy, tests/estimate/test_compile_loss.py, stays
    out): compiled, each of 32 blocks keeps down_proj's output less, 16,384 tokens x 2 B x 4096 = 134,217,728 bytes:
    the end of forward and the loss backward 4,294,967,296 less."""
    import advisor
    from advisor.hardware.cluster import parse_gpus

    moments = [advisor.plan("meta-llama/Llama-3.1-8B", parse_gpus("8xH100-80GB-SXM"), strategy="zero3",
                            micro_batch_size=2, seq_len=8192, activation_checkpointing="selective", recipe="torchtitan",
                            loss="chunked", compile=compiled).candidate("zero3").memory_bytes.moments
               for compiled in (False, True)]
    assert moments[0]["end_of_forward"] - moments[1]["end_of_forward"] == 4_294_967_296
    assert moments[0]["loss_backward"] - moments[1]["loss_backward"] == 4_294_967_296


def _adapters(*targets: str, h: int = 8, f: int = 16, **extra):
    from advisor.estimate.activations import Adapters

    inputs = {"q_proj": (h, "attn_norm"), "k_proj": (h, "attn_norm"), "v_proj": (h, "attn_norm"),
              "o_proj": (h, "attention"), "gate_proj": (h, "mlp_norm"), "up_proj": (h, "mlp_norm"),
              "down_proj": (f, "mlp_act")}
    return Adapters(**{"rank": 4, "dropout": False, "inputs": tuple(inputs[t] for t in targets), **extra})


ALL_SEVEN = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BF16_BASE_AUTOCAST = Dtypes(residual=2, compute=2, input_casts=True)  # the torch recipe's LoRA under DDP


def test_lora_dropped_by_hand():
    """A frozen bf16 base, h = 8, f = 16: the two norms' fp32 input 2 x 4h = 64 and silu 2f = 32 dropped, each norm's
    bf16 input 2 x 2h = 32 kept instead: 64 bytes a token. Under autocast each adapter also casts its own copy of
    its input (2 bytes a feature), the compiled block one per input read: q, v share the first norm's output, one
    copy of 2h = 16 dropped (80); all seven read four inputs (h, h, h, f) for seven copies (6h + f): 2 x 3h = 48
    dropped (112). Without autocast the adapters share their input eager too: 64."""
    from advisor.estimate.compile_memory import lora_dropped_per_token

    shape = _shape(h=8, f=16, heads=2, kv=1)
    assert lora_dropped_per_token(shape, BF16_BASE_AUTOCAST, _adapters("q_proj", "v_proj")) == 80
    assert lora_dropped_per_token(shape, BF16_BASE_AUTOCAST, _adapters(*ALL_SEVEN)) == 112
    assert lora_dropped_per_token(shape, BF16, _adapters(*ALL_SEVEN)) == 64


@pytest.mark.parametrize("targets,bf16,measured", [
    (("q_proj", "v_proj"), False, 2_944), (ALL_SEVEN, False, 3_968), (("o_proj",), False, 2_432),
    (("q_proj", "v_proj"), True, 2_432),
])
def test_lora_matches_the_partitioner(targets, bf16, measured):
    """benchmarks/compile_saved_lora.py on real CPU tensors (a 256-wide LlamaDecoderLayer, 704 MLP, 8 / 2 heads, SDPA,
    PEFT LoRA r16 on a frozen bf16 base, 128 tokens; fp32 adapters under bf16 autocast, or bf16 adapters without
    autocast as FSDP2 gathers them): eager - compiled saved bytes a token, run here, equal the estimate's (the
    figures in the parameters are that script's output, compile_saved.md)."""
    pytest.importorskip("peft")
    import torch

    from benchmarks.compile_saved_lora import lora_block, saved
    from advisor.estimate.compile_memory import lora_dropped_per_token

    tokens, totals = 128, []
    for compiled in (False, True):
        layer = lora_block(hidden=256, intermediate=704, heads=8, kv_heads=2, targets=targets, rank=16,
                           bf16_adapters=bf16)
        totals.append(sum(r[3] for r in saved(layer, hidden=256, heads=8, seq=tokens, compiled=compiled,
                                              autocast=not bf16)))
    torch._dynamo.reset()
    dt = BF16 if bf16 else BF16_BASE_AUTOCAST
    assert (totals[0] - totals[1]) // tokens == measured
    assert lora_dropped_per_token(_shape(), dt, _adapters(*targets, h=256, f=704)) == measured


def test_lora_plan_against_the_h100():
    """Llama-3.2-1B's config (h 2048, f 8192, 16 blocks), LoRA r16 on q and v, DDP x2 under bf16 autocast, micro-batch
    2 x 2048 tokens, each block compiled: the H100 allocated 14,393,595,904 bytes eager and 12,531,324,928 compiled
    (benchmarks/gpu_compile.py, 2026-11-27, results/gpu_compile.jsonl): 1,862,270,976 saved. The estimate: 28,672
    bytes a token and block (lora_dropped_per_token's docstring) x 4096 x 16 = 1,879,048,192, within 1% of it."""
    import advisor
    from advisor.hardware.cluster import parse_gpus

    peaks = [advisor.plan("meta-llama/Llama-3.2-1B", parse_gpus("2xH100"), strategy="ddp", micro_batch_size=2,
                          seq_len=2048, activation_checkpointing="off", lora=16, compile=compiled)
             .candidate("ddp").memory_bytes.peak_allocated for compiled in (False, True)]
    assert peaks[0] - peaks[1] == 28_672 * 4096 * 16
    assert abs((peaks[0] - peaks[1]) / 1_862_270_976 - 1) < 0.01


@pytest.mark.parametrize("extra", [dict(dropout=True), dict(dora_outputs=(8, 8))])
def test_lora_eager_where_not_measured(extra):
    adapters = _adapters("q_proj", "v_proj", **extra)
    assert not compile_saves_less(_shape(), BF16_BASE_AUTOCAST, checkpointing=False, eager_attention=False, lora=True,
                                  adapters=adapters)
    assert not compile_saves_less(_shape(), Dtypes(residual=4, compute=2, input_casts=True), checkpointing=False,
                                  eager_attention=False, lora=True, adapters=_adapters("q_proj", "v_proj"))
    assert not compile_saves_less(_shape(), BF16_BASE_AUTOCAST, checkpointing=True, eager_attention=False, lora=True,
                                  adapters=_adapters("q_proj", "v_proj"))
    assert not compile_saves_less(_shape(), BF16_BASE_AUTOCAST, checkpointing=False, eager_attention=False, lora=True,
                                  adapters=_adapters("q_proj", "v_proj"), quantized=True)  # QLoRA: not measured

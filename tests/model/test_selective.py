"""Which matrix products selective checkpointing keeps with LoRA / DoRA (advisor.model.selective): worked by
hand for small blocks, read off the real policy on a PEFT model, and the planned peak against the simulated step.

Found by issue 20's sweep: the policy's counter runs over every ``aten.mm`` of a block, so PEFT's lora_A / lora_B
and DoRA's products take turns with the base layers'. Before this was modelled the estimate counted the base
layers' turns only: -11.0% (4c5b18eb500c, Qwen3, LoRA on q and v, fp32), -14.2% (e790b1973646, Mistral, DoRA
all-linear: its kept ``in x out`` weight products)."""

from __future__ import annotations

import warnings

import pytest
import torch

from advisor.model.lora import LoraConfig
from advisor.model.selective import block_products, selective_kept
from advisor.model.sources import spec_from_config

LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=160,
             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, vocab_size=256,
             max_position_embeddings=1024, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
             eos_token_id=2, _name_or_path="small-llama")
QWEN2 = dict(LLAMA, model_type="qwen2", architectures=["Qwen2ForCausalLM"], _name_or_path="small-qwen2")


def _spec(cfg):
    return spec_from_config(cfg, name=cfg["_name_or_path"], source="local")


def test_lora_on_q_and_v_by_hand():
    """Llama block (h 64, q 64, k/v 32, MLP 160), LoRA r 4 on q and v: the products run q, q.A, q.B, k, v, v.A,
    v.B, o, gate, up, down (11 mm). The policy keeps the 1st, 3rd, ...: q (64), q.B (64), v (32), v.B (32), gate
    (160), down (64) = 416 features a token; down is the block's last product, past the recomputation's stop."""
    kept = selective_kept(_spec(LLAMA), LoraConfig(rank=4, targets=("q_proj", "v_proj")))
    assert kept.width == 64 + 64 + 32 + 32 + 160 + 64 and kept.elements == 0 and kept.tail_width == 64
    assert kept.linears == ((64, 64), (64, 32), (64, 160), (160, 64))  # q, v, gate, down: as without LoRA


def test_dora_with_dropout_on_q_by_hand():
    """DoRA r 4 on q with dropout: q, eye.A (64 x 4), eye.B (64 x 64), x.A, x.B, F.linear(dropout(x), W), then
    k, v, o, gate, up, down (12 mm). Kept: q (64), eye.B (4,096 elements), x.B (64), k (32), o (64), up (160):
    every base layer after q loses its turn to the one beside it; 12 products, so down is not kept (no tail)."""
    kept = selective_kept(_spec(LLAMA), LoraConfig(rank=4, targets=("q_proj",), dora=True, dropout=0.1))
    assert kept.width == 64 + 64 + 32 + 64 + 160 and kept.elements == 64 * 64 and kept.tail_width == 0
    assert kept.linears == ((64, 64), (64, 32), (64, 64), (64, 160))  # q, k, o, up


def test_biased_projections_skip_the_count_by_hand():
    """Qwen2's q, k and v have a bias (addmm, not counted): LoRA on q and v counts q.A, q.B, v.A, v.B, o, gate,
    up, down; kept q.A (4), v.A (4), o (64), up (160); 8 products, no tail."""
    kept = selective_kept(_spec(QWEN2), LoraConfig(rank=4, targets=("q_proj", "v_proj")))
    assert (kept.width, kept.elements, kept.tail_width) == (4 + 4 + 64 + 160, 0, 0)


def _recorded_products(cfg: dict, lora: LoraConfig, monkeypatch) -> list[tuple[str, tuple[int, int], bool]]:
    """(op, output shape, kept) of each mm / addmm one block runs in forward under wrap()'s selective policy."""
    import peft
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint
    from transformers import AutoConfig, AutoModelForCausalLM

    import wrappers.checkpointing as ckpt

    seen = []
    real = ckpt.create_selective_checkpoint_contexts

    def recording(policy):
        def spy(ctx, func, *args, **kwargs):
            decision = policy(ctx, func, *args, **kwargs)
            if not ctx.is_recompute and func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
                a, b = args[-2:]
                seen.append((func.__name__, (a.shape[0], b.shape[1]), decision == CheckpointPolicy.MUST_SAVE))
            return decision
        return real(spy)

    monkeypatch.setattr(ckpt, "create_selective_checkpoint_contexts", recording)
    kwargs = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures", "_name_or_path")}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg["model_type"], **kwargs))
    model = peft.get_peft_model(model, peft.LoraConfig(**lora.peft_kwargs(("q_proj", "v_proj"))))
    model.train()
    inner = model.base_model.model.model
    x = torch.randn(1, 8, cfg["hidden_size"], requires_grad=True)
    positions = torch.arange(8)[None]
    rope = inner.rotary_emb(x, positions)
    checkpoint(lambda t: inner.layers[0](t, position_embeddings=rope, attention_mask=None, position_ids=positions),
               x, use_reentrant=False, context_fn=ckpt.selective_context)
    return seen


@pytest.mark.parametrize("cfg, lora", [
    (LLAMA, LoraConfig(rank=4, targets=("q_proj", "v_proj"))),
    (LLAMA, LoraConfig(rank=4, targets="all-linear", dora=True)),
    (LLAMA, LoraConfig(rank=4, targets=("q_proj", "down_proj"), dora=True, dropout=0.1)),
    (QWEN2, LoraConfig(rank=4, targets="all-linear", dora=True, dropout=0.1)),
], ids=["llama-lora-q-v", "llama-dora-all", "llama-dora-dropout", "qwen2-dora-dropout-all"])
def test_products_are_those_the_policy_sees(cfg, lora, monkeypatch):
    """The model's list, in order, against the products a PEFT block runs under the policy (8 tokens)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seen = _recorded_products(cfg, lora, monkeypatch)
    products = block_products(_spec(cfg), lora)
    expected = [("mm" if p.counted else "addmm", (8, p.width) if p.width else (p.fan_in, p.elements // p.fan_in))
                for p in products]
    assert [(op.split(".")[0], shape) for op, shape, _ in seen] == expected
    counted = [p for p in products if p.counted]
    kept = selective_kept(_spec(cfg), lora)
    assert [s for op, _, s in seen if op.startswith("mm")] == [i % 2 == 0 for i in range(len(counted))]
    assert sum(shape[1] for op, shape, s in seen if s and shape[0] == 8) == kept.width
    assert sum(shape[0] * shape[1] for op, shape, s in seen if s and shape[0] != 8) == kept.elements


# Two of the sweep's rows at fewer blocks (2) and, for the first, a shorter sequence: the peaks of the step the
# simulator runs (advisor.simulate.step, fake tensors, torch 2.13, transformers 5.23, PEFT 0.21). The estimate
# counting the base layers' turns only: 25,388,544 (-5.86%) and 3,418,784 (-8.89%: the kept weight products).
QWEN3 = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=192, intermediate_size=416,
             head_dim=64, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=3, vocab_size=1472,
             max_position_embeddings=8192, tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2,
             _name_or_path="sweep/qwen3-h192-l2-v1472")
MISTRAL = dict(model_type="mistral", architectures=["MistralForCausalLM"], hidden_size=64, intermediate_size=160,
               num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1, vocab_size=1472, sliding_window=None,
               max_position_embeddings=8192, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
               eos_token_id=2, _name_or_path="sweep/mistral-h64-l2-v1472")


@pytest.mark.parametrize("cfg, gpus, strategy, options, simulated", [
    (QWEN3, "1xH100", "zero2", dict(seq_len=512, precision="fp32", optimizer="adamw",
                                    lora=LoraConfig(rank=64, targets=("q_proj", "v_proj"))), 26_967_848),
    (MISTRAL, "4xH100", "zero2", dict(seq_len=128, precision="bf16", optimizer="adam",
                                      lora=LoraConfig(rank=16, targets="all-linear", dora=True)), 3_752_528),
], ids=["qwen3-lora-q-v-fp32", "mistral-dora-all-linear"])
def test_selective_lora_matches_the_simulated_step(cfg, gpus, strategy, options, simulated):
    from advisor.planning.api import plan

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = plan(dict(cfg), gpus=gpus, strategy=strategy, micro_batch_size=1, loss="hf",
                      activation_checkpointing="selective", **options)
    peak = result.candidate(strategy).memory_bytes.peak_allocated
    assert abs(peak - simulated) <= 0.01 * simulated, (peak, simulated)


# What selective checkpointing holds beyond full checkpointing, planned and simulated, at a peak in the top block's
# backward (a 128-wide Mistral, 2 blocks, vocabulary 256, fp32, one process). The frozen block's backward itself
# is over in both modes alike (+7.2% under full checkpointing: not this module's), so the difference is compared:
# LoRA on down_proj only: 9 products, lora_B's output the tail (2,048 x 128 x 4 bytes held through the backward);
# DoRA all-linear: 35 products, the last (down's lora_B) read by the magnitude's gradient, so no tail, and the
# kept weight products (q, v, gate, down: 2 x 16,384 + 2 x 45,056 elements; k, o, up: 3 x 2,048) held throughout.
SMALL_MISTRAL = dict(MISTRAL, hidden_size=128, intermediate_size=352, num_attention_heads=2, num_key_value_heads=2,
                     vocab_size=256, _name_or_path="sweep/mistral-h128-l2-v256")


@pytest.mark.parametrize("seq_len, lora, simulated", [
    (2048, LoraConfig(rank=16, targets=("down_proj",)), (40_013_080, 30_821_656)),
    (1024, LoraConfig(rank=16, targets="all-linear", dora=True), (37_732_528, 29_896_880)),
], ids=["lora-down-tail", "dora-all-linear"])
def test_selective_beyond_full_matches_the_simulated_step(seq_len, lora, simulated):
    from advisor.planning.api import plan

    peaks = []
    for mode in ("selective", "on"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = plan(dict(SMALL_MISTRAL), gpus="1xH100", strategy="zero2", micro_batch_size=1, loss="hf",
                          seq_len=seq_len, precision="fp32", optimizer="adam", activation_checkpointing=mode, lora=lora)
        peaks.append(result.candidate("zero2").memory_bytes.peak_allocated)
    planned, measured = peaks[0] - peaks[1], simulated[0] - simulated[1]
    assert abs(planned - measured) <= 0.01 * measured, (planned, measured)


def test_dora_with_dropout_moves_the_recomputed_flops():
    """Llama-3.1-8B, DoRA on q with dropout: the recompute keeps q, k, o and up (not q, v, gate and down), so it
    recomputes v, gate and down's products again and skips k, o and up's: 2 FLOPs a parameter, token and block."""
    from advisor.estimate.step_time import count_flops
    from advisor.model.lora import with_lora
    from advisor.model.sources import resolve_model

    lora = LoraConfig(rank=16, targets=("q_proj",), dora=True, dropout=0.1)
    spec = with_lora(resolve_model("meta-llama/Llama-3.1-8B"), lora)
    plain = count_flops(spec, tokens=4096, seq_len=4096, checkpointing=True, selective=True)
    moved = count_flops(spec, tokens=4096, seq_len=4096, checkpointing=True, selective=True, lora=lora)
    v, gate, down, k, o, up = 4096 * 1024, 4096 * 14336, 14336 * 4096, 4096 * 1024, 4096 * 4096, 4096 * 14336
    assert moved.recompute - plain.recompute == pytest.approx(2 * 4096 * 32 * ((v + gate + down) - (k + o + up)))

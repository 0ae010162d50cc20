"""A frozen base's first block without checkpointing (``advisor.estimate.activations_frozen``), against the
simulated step and by hand.

Found by issue 20 (truth against the simulator): LoRA on down_proj only was over by +24.3% (128-wide Mistral,
fp32, s 2048, DDP, fused loss, no checkpointing: 122.97 MB estimated, 98.96 MB simulated). The embedding is
frozen, so the first block's input needs no gradient and no op before its first adapter saves anything; the
estimate took off the attention norm's fp32 input alone (right for q, k or v adapted, the default targets).

Simulated peaks (advisor.simulate.step, fake tensors, torch 2.13, transformers 5.23, PEFT 0.21; the peak is the
loss backward, where every block's saved tensors are live). Before the fix: +14.9% (down_proj), +5.1%
(gate_proj, up_proj), +3.2% (o_proj); q and v unchanged."""

from __future__ import annotations


import pytest

from advisor.model.lora import LoraConfig
from advisor.planning.api import plan

MISTRAL = dict(model_type="mistral", architectures=["MistralForCausalLM"], hidden_size=64, intermediate_size=192,
               num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2, vocab_size=1024,
               max_position_embeddings=8192, sliding_window=None, tie_word_embeddings=False, pad_token_id=0,
               bos_token_id=1, eos_token_id=2, _name_or_path="frozen/mistral-h64-l3")


pytestmark = pytest.mark.filterwarnings("ignore")  # transformers / PEFT warnings at model build


@pytest.mark.parametrize("targets,simulated", [
    (("down_proj",), 24_713_120),
    (("gate_proj", "up_proj"), 25_671_608),
    (("o_proj",), 25_204_640),
    (("q_proj", "v_proj"), 26_920_888),
], ids=["down", "gate-up", "o", "q-v"])
def test_first_block_matches_the_simulated_step(targets, simulated):
    result = plan(dict(MISTRAL), gpus="1xH100", strategy="ddp", micro_batch_size=1, seq_len=1024,
                  activation_checkpointing="off", precision="fp32", loss="hf", optimizer="adamw",
                  lora=LoraConfig(rank=8, targets=targets))
    memory = result.candidate("ddp").memory_bytes
    assert memory.peak_moment == "loss_backward"
    assert abs(memory.peak_allocated - simulated) <= 0.002 * simulated, (memory.peak_allocated, simulated)


def test_first_block_unsaved_by_hand():
    """LoRA on down_proj, fp32, the config above (h 64, 2 heads of 32, intermediate 192): before down_proj nothing
    needs a gradient, so the first block does not save the attention norm's fp32 input (4 x 64 = 256), SDPA's
    q, k, v, output and fp32 logsumexp (4 x (64 + 2 x 64 + 64) + 4 x 2 = 1,032), the MLP norm's fp32 input (256)
    and the gated MLP's gate output, its activation and up's output (3 x 4 x 192 = 2,304): 3,848 bytes a token."""
    from advisor.estimate.activations import Adapters, Dtypes, shape_of
    from advisor.estimate.activations_frozen import first_block_unsaved_per_token
    from advisor.model.sources import spec_from_config

    shape = shape_of(spec_from_config(MISTRAL, name="m", source="local"))
    dt = Dtypes(residual=4, compute=4, input_casts=False, buffer=4)
    down = Adapters(rank=8, dropout=False, inputs=((192, "mlp_act"),))
    assert first_block_unsaved_per_token(shape, dt, down, seq_len=1024, eager=False) == 3_848
    # o_proj first: the attention norm's input (256) and SDPA's tensors (1,032), less o_proj's input (4 x 64 =
    # 256), SDPA's output, which SDPA no longer saves and the adapter now saves itself: 1,032.
    o = Adapters(rank=8, dropout=False, inputs=((64, "attention"),))
    assert first_block_unsaved_per_token(shape, dt, o, seq_len=1024, eager=False) == 1_032


@pytest.mark.parametrize("targets,precision,simulated", [
    (("down_proj",), "fp32", 8_619_936),
    (("q_proj", "v_proj"), "fp32", 8_939_448),
    (("down_proj",), "bf16", 4_719_648),
    (("q_proj", "v_proj"), "bf16-mixed", 5_051_448),
], ids=["down-fp32", "q-v-fp32", "down-bf16", "q-v-bf16-mixed"])
def test_checkpointed_block_backward_matches_the_simulated_step(targets, precision, simulated):
    """The top block's backward under full checkpointing (fused loss, its MLP's product rule decides), read op by op
    on the simulated step: three intermediate-wide gradients beside the whole recomputed block (a frozen down_proj
    saves no input, so none of the block's count is freed there), less down_proj's adapter's input and ``x A``
    (their backward ran first); the final norm's fp32 input freed before any block's backward; under fp32 the
    first norm's fp32 input is the block input the checkpoint keeps. Before the fix the fp32 rows were +6.18%
    (down_proj) and -3.12% (q, v); the other two guard the 16-bit paths (now -0.44% and -0.33%)."""
    result = plan(dict(MISTRAL), gpus="1xH100", strategy="ddp", micro_batch_size=1, seq_len=1024,
                  activation_checkpointing="on", precision=precision, loss="fused", optimizer="adamw",
                  lora=LoraConfig(rank=8, targets=targets))
    memory = result.candidate("ddp").memory_bytes
    assert memory.peak_moment == "block_backward"
    assert abs(memory.peak_allocated - simulated) <= 0.005 * simulated, (memory.peak_allocated, simulated)


def test_down_adapter_freed_by_hand():
    """LoRA r8 on down_proj (192 -> 64), fp32: its input (the product act * up, 4 x 192 = 768 bytes a token) and
    ``x A`` (4 x 8 = 32): 800 bytes a token, 819,200 at 1,024 tokens (the simulated step frees 786,432 + 32,768)."""
    from advisor.estimate.activations import Adapters, Dtypes
    from advisor.estimate.activations_frozen import frozen_mlp_freed_per_token

    dt = Dtypes(residual=4, compute=4, input_casts=False, buffer=4)
    ad = Adapters(rank=8, dropout=False, inputs=((64, "attn_norm"), (192, "mlp_act")))
    assert frozen_mlp_freed_per_token(dt, ad) == 800


@pytest.mark.parametrize("targets,dropout,simulated", [
    (("down_proj",), 0.0, 5_690_400),
    (("down_proj",), 0.05, 6_672_416),
    ("all-linear", 0.05, 8_261_808),
], ids=["down", "down-dropout", "all-linear-dropout"])
def test_recompute_end_under_autocast_matches_the_simulated_step(targets, dropout, simulated):
    """bf16-mixed over the frozen bf16 base: the top block's backward peaks as its recomputation stops inside
    down_proj's adapter (``activations_frozen.frozen_recompute_end_per_token``), not at the MLP's product rule.
    Before (the MLP's point only): -11.81% (down_proj) and -17.64% (all-linear with dropout)."""
    result = plan(dict(MISTRAL), gpus="1xH100", strategy="ddp", micro_batch_size=1, seq_len=1024,
                  activation_checkpointing="on", precision="bf16-mixed", loss="fused", optimizer="adamw",
                  lora=LoraConfig(rank=8, targets=targets, dropout=dropout))
    memory = result.candidate("ddp").memory_bytes
    assert memory.peak_moment == "block_backward"
    assert abs(memory.peak_allocated - simulated) <= 0.005 * simulated, (memory.peak_allocated, simulated)


def test_recompute_end_by_hand():
    """LoRA on down_proj with dropout, bf16-mixed over a bf16 base (residual and compute 2 bytes, autocast casts):
    the product act * up (2 x 192), PEFT's fp32 copy of it and its fp32 dropout output (2 x 4 x 192) and five
    residual-wide tensors (5 x 2 x 64): 384 + 1,536 + 640 = 2,560 bytes a token; without a down_proj adapter, 0."""
    from advisor.estimate.activations import Adapters, Dtypes, shape_of
    from advisor.estimate.activations_frozen import frozen_recompute_end_per_token
    from advisor.model.sources import spec_from_config

    shape = shape_of(spec_from_config(MISTRAL, name="m", source="local"))
    dt = Dtypes(residual=2, compute=2, input_casts=True, buffer=4)
    assert frozen_recompute_end_per_token(shape, dt, Adapters(rank=8, dropout=True, inputs=((192, "mlp_act"),))) == 2_560
    assert frozen_recompute_end_per_token(shape, dt, Adapters(rank=8, dropout=True, inputs=((64, "attn_norm"),))) == 0

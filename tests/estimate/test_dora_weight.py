"""DoRA builds each adapter's whole weight in every forward (``activations_blocks.dora_weight_bytes``): what a
DoRA layer holds beyond the block's saved tensors, against real tensors and the simulated step.

The real tensors: PEFT's DoRA on a tiny Llama (hidden 384, three heads of 128, two blocks, vocabulary 2,944,
micro-batch 8 x 128 tokens), run on the CPU under a dispatch mode that counts every tensor a kernel makes until it
is freed; the figure is the highest count during the forward less the count as the last block returns (the
block's saved tensors, which the activation model counts), the blocks alone (no head, no loss)."""

from __future__ import annotations

import contextlib
import weakref

import pytest

from advisor.estimate.activations import Adapters, Dtypes
from advisor.estimate.activations_blocks import dora_weight_bytes

pytest.importorskip("peft")

BF16 = Dtypes(residual=2, compute=2, input_casts=False)
AUTOCAST = Dtypes(residual=4, compute=2, input_casts=True, buffer=4)  # autocast over fp32 weights
LLAMA_TARGETS = (("q_proj", "attn_norm", 384), ("k_proj", "attn_norm", 384), ("v_proj", "attn_norm", 384),
                 ("o_proj", "attention", 384), ("gate_proj", "mlp_norm", None), ("up_proj", "mlp_norm", None),
                 ("down_proj", "mlp_act", 384))


def _adapters(intermediate: int, targets: tuple[str, ...]) -> Adapters:
    rows = [(name, source, out or intermediate) for name, source, out in LLAMA_TARGETS if name in targets]
    fan_in = {"q_proj": 384, "k_proj": 384, "v_proj": 384, "o_proj": 384, "gate_proj": 384, "up_proj": 384,
              "down_proj": intermediate}
    return Adapters(rank=8, dropout=False, inputs=tuple((fan_in[n], s) for n, s, _ in rows),
                    dora_outputs=tuple(o for _, _, o in rows))


def _traced_transient(intermediate: int, targets: tuple[str, ...], *, autocast: bool) -> int:
    """The real-tensor count (module docstring)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=384, intermediate_size=intermediate, num_hidden_layers=2, num_attention_heads=3,
                         num_key_value_heads=3, head_dim=128, vocab_size=2944, tie_word_embeddings=False)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=8, target_modules=list(targets), use_dora=True,
                                                                lora_dropout=0.0))
    if not autocast:
        model = model.to(torch.bfloat16)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    live: dict[int, int] = {}
    count = {"now": 0, "peak": 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if not isinstance(t, torch.Tensor):
                    continue
                storage = t.untyped_storage()
                key, size = storage.data_ptr(), storage.nbytes()
                if key in live or key in params or not size:
                    continue
                live[key] = size
                count["now"] += size

                def freed(key=key, size=size):
                    if live.pop(key, None) is not None:
                        count["now"] -= size

                weakref.finalize(storage, freed)
                count["peak"] = max(count["peak"], count["now"])
            return out

    blocks = model.base_model.model.model
    after: dict[str, int] = {}
    def last_block_done(*_):
        after["last"] = count["now"]

    blocks.layers[1].register_forward_hook(last_block_done)
    mixed = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with Count(), mixed:
        blocks(input_ids=torch.randint(0, 2944, (8, 128)))
    return count["peak"] - after["last"]


@pytest.mark.parametrize("intermediate,targets,autocast,dt", [
    (1344, tuple(n for n, _, _ in LLAMA_TARGETS), False, BF16),  # bf16: the layer's output products decide
    (1344, tuple(n for n, _, _ in LLAMA_TARGETS), True, AUTOCAST),  # autocast: PEFT's fp32 copy of the input too
    (2688, ("down_proj",), False, BF16),  # a wider down projection: the weight's scaled sum decides
])
def test_the_counted_transient_against_real_tensors(intermediate, targets, autocast, dt):
    """bf16, every linear: the in x in identity (1,344^2 x 2 = 3,612,672), lora_A's product (1,344 x 8 x 2 =
    21,504) and the adapter weight (1,344 x 384 x 2 = 1,032,192), then three 1,024 x 384 x 2 products: 7,025,664,
    what the real tensors reach. bf16, down_proj alone at 2,688 in: the identity (14,450,688), lora_A's product
    (43,008), the weight, its scaled copy and their sum (3 x 2,064,384): 20,686,848; real 20,668,160 (-0.09%).
    Autocast over fp32 weights: inside get_lora_weight the fp32 identity and its bf16 cast (1,344^2 x 6 =
    10,838,016), lora_A's and lora_B's bf16 products (21,504 + 1,032,192), beside PEFT's fp32 copy of down_proj's
    input (1,024 x 1,344 x 4 = 5,505,024) and that input itself (2,752,512): 20,149,248, where the real tensors
    peak at the output instead, 18,674,688 (the weight in fp32, three fp32 products and the two inputs): the count
    is 7.9% above, on the side that does not run out of memory."""
    hand = {(1344, False): 7_025_664, (1344, True): 20_149_248, (2688, False): 20_686_848}[(intermediate, autocast)]
    real = {(1344, False): 7_025_664, (1344, True): 18_674_688, (2688, False): 20_668_160}[(intermediate, autocast)]
    assert dora_weight_bytes(dt, _adapters(intermediate, targets), tokens=1024) == hand
    assert _traced_transient(intermediate, targets, autocast=autocast) == real


def test_the_sweeps_fused_loss_row_is_within_the_sweeps_goal():
    """The sweep's 44832abfdd23 (fresh seed 776439000: Qwen3 384 wide, DoRA r8 on every linear, pure bf16, FSDP2
    on one rank, 8 x 128 tokens, the fused loss): the simulated peak, 112,914,344 bytes, is inside the last block's
    forward. The estimate was 3.97% under it before the weight was counted, 2.2% under it now (the goal: 3%); the
    rest is not traced (the real-tensor counts above agree with the formula, to the byte or within 0.1%)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import sweep
    from sweep_cases import draw_case

    _, candidate = sweep.estimate(draw_case(776439000, 0))
    assert candidate.memory_bytes.peak_moment == "end_of_forward"
    assert candidate.memory_bytes.peak_allocated == pytest.approx(112_914_344, rel=0.03)

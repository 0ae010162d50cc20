"""DoRA on a frozen base: what PEFT's ``DoraLinearLayer.forward`` (peft 0.21) saves beyond LoRA, worked by
hand and measured with ``saved_tensors_hooks`` on the real 256-wide Llama of ``test_lora_activations.py``.

``result_dora = (m / ||W + sBA|| - 1) * base_result + (m / ||W + sBA||) * lora_result * s``: the magnitude m
trains, so both products save their tensor operand, the base layer's output and the adapter's, each
out_features wide. The weight norm is detached and computed from weight-sized temporaries that die in
forward. Per token and block: 2 x compute bytes x the adapted linears' out_features.
"""

from __future__ import annotations

import pytest

from advisor.estimate.activations import Adapters, Dtypes
from advisor.estimate.activations_blocks import frozen_decoder_layer_per_token
from advisor.model.lora import LoraConfig, adapter_inputs, dora_outputs
from advisor.model.sources import spec_from_config

from tests.estimate.test_lora_activations import CONFIG, FP32_WEIGHTS, SHAPE

BF16 = Dtypes(residual=2, compute=2, input_casts=False)
QV = ("q_proj", "v_proj")
# Out features: q 256, k 64, v 64, o 256, gate 704, up 704, down 256.
BY_HAND = {(QV, 4): 2 * 4 * (256 + 64), ("all-linear", 4): 2 * 4 * 2304,
           (QV, 2): 2 * 2 * (256 + 64), ("all-linear", 2): 2 * 2 * 2304}


def _saved_per_token(targets, *, dora: bool, bf16: bool) -> float:
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    import warnings

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in CONFIG.items() if k != "architectures"},
                                         attn_implementation="sdpa"))
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=targets if targets == "all-linear"
                                                       else list(targets), use_dora=dora)).base_model.model
    if bf16:
        model = model.to(torch.bfloat16)
    inside = [False]
    block = model.model.layers[1]
    block.register_forward_pre_hook(lambda *args: inside.__setitem__(0, True))
    block.register_forward_hook(lambda *args: inside.__setitem__(0, False))

    def saved(batch: int) -> int:
        storages: dict[int, int] = {}
        held = []  # every packed tensor kept alive: DoRA's weight-norm graph dies in forward, and a freed

        def pack(tensor):  # storage's address reused by a later saved tensor would be counted once
            if inside[0]:
                held.append(tensor)
                storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
            return tensor

        ids = torch.randint(0, 4096, (batch, 64))
        with warnings.catch_warnings(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            warnings.simplefilter("ignore")
            model(input_ids=ids, labels=ids)
        return sum(storages.values())

    return (saved(2) - saved(1)) / 64


def _counted(targets, dt: Dtypes, *, dora: bool) -> int:
    lora = LoraConfig(rank=8, targets=targets, dora=dora)
    spec = spec_from_config(CONFIG, name="small", source="local")
    adapters = Adapters(rank=8, dropout=False, inputs=tuple(adapter_inputs(spec, lora)),
                        dora_outputs=dora_outputs(spec, lora))
    return frozen_decoder_layer_per_token(SHAPE, dt, adapters, seq_len=64, eager=False)


@pytest.mark.parametrize("targets", [QV, "all-linear"], ids=["q_v", "all-linear"])
@pytest.mark.parametrize("dt", [FP32_WEIGHTS, BF16], ids=["fp32", "bf16"])
def test_dora_adds_two_outputs_per_target_by_hand(targets, dt):
    assert _counted(targets, dt, dora=True) - _counted(targets, dt, dora=False) == BY_HAND[targets, dt.compute]


@pytest.mark.parametrize(("targets", "dt"), [(QV, FP32_WEIGHTS), ("all-linear", BF16)],
                         ids=["q_v-fp32", "all-linear-bf16"])
def test_dora_adds_what_autograd_saves(targets, dt):
    """What autograd saves in a block per token with DoRA less with LoRA (the slope between batch 1 and 2)."""
    bf16 = dt.compute == 2
    measured = _saved_per_token(targets, dora=True, bf16=bf16) - _saved_per_token(targets, dora=False, bf16=bf16)
    assert measured == BY_HAND[targets, dt.compute]

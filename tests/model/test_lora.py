"""LoRA / DoRA adapter counts: hand-worked for Qwen2.5-7B, and equal to PEFT's own trainable count
on the model built on the meta device for every bundled family PEFT can target."""

from __future__ import annotations

import pytest

from advisor.model.bundled import load_architectures
from advisor.model.lora import LoraConfig, adapter_params, default_targets, with_lora
from advisor.model.sources import resolve_model


def test_qwen25_7b_rank16_default_targets_worked_by_hand():
    # Qwen2.5-7B: hidden 3584, 28 query heads and 4 key/value heads of 128, 28 layers. PEFT's default
    # targets for qwen2 are q_proj (3584 -> 3584) and v_proj (3584 -> 4 * 128 = 512):
    # 16 * ((3584 + 3584) + (3584 + 512)) = 16 * 11264 = 180,224 per layer; x 28 = 5,046,272.
    spec = resolve_model("Qwen/Qwen2.5-7B")
    assert adapter_params(spec, LoraConfig(rank=16)) == 5_046_272
    lora = with_lora(spec, LoraConfig(rank=16))
    assert (lora.trainable_params, lora.total_params - spec.total_params) == (5_046_272, 5_046_272)


def test_dora_adds_one_magnitude_per_output_feature():
    # DoRA on the same targets adds out_features per target: (3584 + 512) x 28 = 114,688.
    spec = resolve_model("Qwen/Qwen2.5-7B")
    assert adapter_params(spec, LoraConfig(rank=16, dora=True)) - adapter_params(spec, LoraConfig(rank=16)) == 114_688


def test_unknown_target_names_the_models_linear_layers():
    with pytest.raises(ValueError, match="no linear layer named qkv in .*q_proj, k_proj, v_proj, o_proj, gate_proj"):
        adapter_params(resolve_model("Qwen/Qwen2.5-0.5B"), LoraConfig(rank=8, targets=("qkv",)))


def test_family_without_peft_default_asks_for_targets():
    with pytest.raises(ValueError, match="PEFT has no default LoRA targets for phi3: pass --lora-targets"):
        adapter_params(resolve_model("microsoft/Phi-3-mini-4k-instruct"), LoraConfig(rank=8))


def test_size_only_model_cannot_be_counted():
    with pytest.raises(ValueError, match="LoRA counting needs a known architecture"):
        adapter_params(resolve_model("7.5B"), LoraConfig(rank=8))


def test_default_targets_are_peft_defaults():
    constants = pytest.importorskip("peft.utils.constants")
    mapping = constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    for model_type, info in load_architectures().items():
        expected = mapping.get(model_type)
        assert (list(info.lora_targets) if info.lora_targets else None) == expected, model_type


SMALL = {  # one bundled config per family, shrunk (same model_type and layout) so meta building is fast
    "Qwen/Qwen2.5-0.5B": dict(num_hidden_layers=2),
    "meta-llama/Llama-3.2-1B": dict(num_hidden_layers=2),
    "google/gemma-2-2b": dict(num_hidden_layers=2),
    "microsoft/Phi-3-mini-4k-instruct": dict(num_hidden_layers=2),
    "mistralai/Mixtral-8x7B-v0.1": dict(num_hidden_layers=2, hidden_size=256, intermediate_size=512,
                                        num_attention_heads=8, num_key_value_heads=2),
    "openai-community/gpt2": dict(n_layer=2),
    "google-bert/bert-base-uncased": dict(num_hidden_layers=2),
}


@pytest.mark.parametrize("model", sorted(SMALL))
@pytest.mark.parametrize("targets,dora", [(None, False), ("all-linear", False), (None, True)])
def test_count_equals_peft_on_the_meta_device(model, targets, dora):
    peft = pytest.importorskip("peft")
    from advisor.model.meta import build_meta_model, spec_from_module
    from advisor.model.sources import resolve, spec_from_config

    config = {**resolve(model).config, **SMALL[model]}
    spec = spec_from_config(config, name=model, source="local")
    lora = LoraConfig(rank=8, targets=targets, dora=dora)
    if spec.model_type == "phi3" and targets is None:
        pytest.skip("PEFT has no default targets for phi3 (tested above)")
    if spec.model_type in ("bert", "mixtral") and targets == "all-linear":  # PEFT takes more: not modelled
        with pytest.raises(ValueError):
            adapter_params(spec, lora)
        return
    net = build_meta_model(config)
    peft_targets = targets if targets is not None else list(default_targets(spec))
    wrapped = peft.get_peft_model(net, peft.LoraConfig(r=8, target_modules=peft_targets, use_dora=dora))
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    assert adapter_params(spec, lora) == trainable
    assert with_lora(spec, lora).total_params == spec_from_module(wrapped).total_params


def test_a_live_peft_model_is_planned_as_lora_without_counting_adapters_twice():
    peft = pytest.importorskip("peft")
    import advisor
    from transformers import LlamaConfig, LlamaForCausalLM

    base = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=512))
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.1))
    plan = advisor.plan(model, "2xA100")
    # rank 4 on q_proj (64 -> 64) and v_proj (64 -> 2 x 16 = 32): 4 x (128 + 96) x 2 layers = 1,792
    assert plan.model.trainable_params == 1_792
    assert plan.model.total_params == sum(p.numel() for p in model.parameters())
    assert plan.training.lora == LoraConfig(rank=4, targets=("q_proj", "v_proj"), dropout=0.1)
    assert any(note.startswith("LoRA rank 4 on q_proj, v_proj") for note in plan.assumptions)


@pytest.mark.parametrize("model", [m for m in sorted(SMALL) if "Mixtral" not in m])
def test_linear_names_are_the_models_own(model):
    """The names an unknown --lora-targets lists are the last names of the model's nn.Linear (and
    GPT-2's Conv1D) modules, as transformers builds it on the meta device. (Mixtral's experts are
    stacked parameters, listed separately.)"""
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    from advisor.model.lora import linear_names
    from advisor.model.meta import build_meta_model
    from advisor.model.sources import resolve, spec_from_config

    config = {**resolve(model).config, **SMALL[model]}
    net = build_meta_model(config)
    own = {name.rsplit(".", 1)[-1] for name, module in net.named_modules() if isinstance(module, (nn.Linear, Conv1D))}
    assert set(linear_names(spec_from_config(config, name=model, source="local"))) == own


def test_a_live_bitsandbytes_peft_model_is_planned_as_qlora():
    """transformers keeps the BitsAndBytesConfig a model was loaded with in ``config.quantization_config``;
    a PEFT model over it is planned as QLoRA with that scheme, the base counted from its config (packed
    Params4bit would count half their weights). bitsandbytes needs CUDA, so the config is attached to a
    CPU model here: the planner reads nothing else."""
    peft = pytest.importorskip("peft")
    import advisor
    from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    base = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=512))
    base.config.quantization_config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                         bnb_4bit_use_double_quant=True)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    plan = advisor.plan(model, "2xA100")
    assert (plan.training.quantize, plan.training.double_quant) == ("nf4", True)
    assert plan.model.trainable_params == 1_792  # as in the unquantised case above
    assert plan.model.total_params == sum(p.numel() for p in model.parameters())
    assert not plan.candidate("dp").available


def test_a_live_peft_models_base_is_planned_in_the_dtype_it_was_loaded_in():
    """The tiny Llama above loaded in fp32 (as TRL's SFTTrainer loads a model without a dtype) and in bf16: 512 x 64
    x 2 embedding and head + 2 x (64 x 64 x 2 + 64 x 32 x 2 + 3 x 64 x 176 + 2 x 64) + 64 = 158,016 frozen weights, so
    DDP's resting weights differ by 2 x 158,016 = 316,032 bytes; PEFT's adapters stay fp32 in both."""
    peft = pytest.importorskip("peft")
    import torch

    import advisor
    from transformers import LlamaConfig, LlamaForCausalLM

    plans = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        base = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, vocab_size=512)).to(dtype)
        model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        plans[dtype] = advisor.plan(model, "2xA100", strategy="ddp")
    assert plans[torch.float32].training.frozen_base == "param"
    assert plans[torch.bfloat16].training.frozen_base is None  # the recipe's own: the compute dtype
    assert plans[torch.float16].training.frozen_base is None  # 2 bytes a weight too
    rest = {dtype: plan.candidate("ddp").memory_bytes.params for dtype, plan in plans.items()}
    assert rest[torch.float32] - rest[torch.bfloat16] == 316_032

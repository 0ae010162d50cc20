"""LoRA on the bundled families whose blocks are not Llama-like (T5, BART, Mamba, Jamba, DeepSeek,
Qwen2.5-VL): the linear layers ``advisor.model.kind_linears`` lists are the ones transformers builds on
the meta device, name for name, and the adapters counted from them equal PEFT's own trainable count
on that model (``peft.get_peft_model`` on the meta device)."""

from __future__ import annotations

import pytest

from advisor.model.kind_linears import formula_layout
from advisor.model.lora import LoraConfig, adapter_params, with_lora
from advisor.model.sources import resolve, resolve_model, spec_from_config

# One bundled config per kind, shrunk where the full one builds slowly (the same model_type and layer
# pattern: Jamba keeps an attention layer at 4 of 8, DeepSeek its 3 dense layers before the MoE ones).
SMALL = {
    "google-t5/t5-large": dict(num_layers=2, num_decoder_layers=3),
    "facebook/bart-large": dict(encoder_layers=2, decoder_layers=3),
    "state-spaces/mamba-130m-hf": dict(num_hidden_layers=2),
    "ai21labs/Jamba-v0.1": dict(num_hidden_layers=8, hidden_size=256, intermediate_size=512, num_attention_heads=8,
                                num_key_value_heads=2, num_experts=4, vocab_size=1024),
    "deepseek-ai/DeepSeek-V3": dict(num_hidden_layers=5, hidden_size=256, intermediate_size=512,
                                    moe_intermediate_size=64, n_routed_experts=8, n_group=2, topk_group=1,
                                    num_experts_per_tok=2, vocab_size=1024),
    "Qwen/Qwen2.5-VL-7B-Instruct": dict(num_hidden_layers=2),
}


def _config(model: str) -> dict:
    config = {**resolve(model).config, **SMALL[model]}
    if "vision_config" in config:
        config["vision_config"] = {**config["vision_config"], "depth": 2, "fullatt_block_indexes": [1]}
    return config


def _meta(config: dict):
    from advisor.model.meta import build_meta_model

    return build_meta_model(config)


@pytest.mark.parametrize("model", sorted(SMALL))
def test_listed_linears_are_the_meta_models_own(model):
    from advisor.simulate.linears import linear_layout

    config = _config(model)
    listed = formula_layout(spec_from_config(config, name=model, source="local"))
    built = linear_layout(_meta(config))
    assert {layer.name: (layer.in_features, layer.out_features) for layer in listed.layers} == \
        {layer.name: (layer.in_features, layer.out_features) for layer in built.layers}
    assert listed.output == built.output == "lm_head"


CASES = [  # (model, --lora-targets): PEFT's default, all-linear where PEFT adapts no stacked experts, named layers
    ("google-t5/t5-large", None), ("google-t5/t5-large", "all-linear"), ("google-t5/t5-large", ("wi", "lm_head")),
    ("facebook/bart-large", None), ("facebook/bart-large", "all-linear"), ("facebook/bart-large", ("out_proj", "fc1")),
    ("state-spaces/mamba-130m-hf", ("in_proj", "lm_head")), ("state-spaces/mamba-130m-hf", ("x_proj", "dt_proj")),
    ("ai21labs/Jamba-v0.1", ("q_proj", "v_proj")), ("ai21labs/Jamba-v0.1", "all-linear"), ("ai21labs/Jamba-v0.1", ("in_proj", "out_proj", "down_proj")),
    ("deepseek-ai/DeepSeek-V3", ("q_a_proj", "kv_b_proj", "o_proj")), ("deepseek-ai/DeepSeek-V3", ("kv_a_proj_with_mqa", "lm_head")),
    ("Qwen/Qwen2.5-VL-7B-Instruct", "all-linear"), ("Qwen/Qwen2.5-VL-7B-Instruct", ("qkv", "down_proj")),
]


@pytest.mark.parametrize("model,targets", CASES)
def test_count_equals_peft_on_the_meta_device(model, targets):
    peft = pytest.importorskip("peft")
    from advisor.model.meta import spec_from_module

    config = _config(model)
    spec = spec_from_config(config, name=model, source="local")
    lora = LoraConfig(rank=8, targets=targets)
    wrapped = peft.get_peft_model(_meta(config), peft.LoraConfig(**lora.peft_kwargs(("q", "v") if "t5" in model else
                                                                                    ("q_proj", "v_proj"))))
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    assert adapter_params(spec, lora) == trainable
    adapted = with_lora(spec, lora)  # the components still sum to the total (ModelSpec's validator)
    assert (adapted.trainable_params, adapted.total_params) == (trainable, spec_from_module(wrapped).total_params)


def test_t5_large_default_targets_worked_by_hand():
    # t5-large: d_model 1024, 16 heads of d_kv 64 (inner 1024), 24 encoder and 24 decoder blocks. PEFT's
    # default targets for t5, q and v, match each self-attention's q and v and the decoder's EncDecAttention
    # q and v: 16 x (1024 + 1024) = 32,768 per adapter, 24 x 2 + 24 x 4 = 144 adapters: 4,718,592.
    assert adapter_params(resolve_model("google-t5/t5-large"), LoraConfig(rank=16)) == 4_718_592


def test_jamba_attention_adapters_worked_by_hand():
    # Jamba-v0.1: 4 attention layers of 32 (4, 12, 20, 28), hidden 4096, 8 kv heads of 128: q_proj
    # 4096 -> 4096 and v_proj 4096 -> 1024; 16 x ((4096 + 4096) + (4096 + 1024)) x 4 = 851,968.
    spec = resolve_model("ai21labs/Jamba-v0.1")
    lora = LoraConfig(rank=16, targets=("q_proj", "v_proj"))
    assert adapter_params(spec, lora) == 851_968
    adapted = with_lora(spec, lora)
    assert adapted.hybrid.block_params[4] - spec.hybrid.block_params[4] == 212_992  # one attention layer's
    assert adapted.hybrid.block_params[0] == spec.hybrid.block_params[0]  # a Mamba layer has none
    # the largest trainable tensor: a q_proj lora_A, 16 x 4096 (block 0, a Mamba layer, has no adapter)
    from advisor.estimate.states import largest_trainable_params
    from advisor.training import TrainingConfig

    assert largest_trainable_params(adapted, TrainingConfig(lora=lora)) == 65_536


@pytest.mark.parametrize("model,targets,message", [
    ("deepseek-ai/DeepSeek-V3", "all-linear", "all-linear is not modelled for deepseek_v3 yet (PEFT also adapts its "
                                              "stacked expert weights)"),
    ("deepseek-ai/DeepSeek-V3", ("q_proj", "v_proj"), "no linear layer named q_proj, v_proj in deepseek-ai/DeepSeek-V3; "
     "its linear layers are: q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj, gate_proj, up_proj, down_proj, lm_head"),
    ("google-t5/t5-large", ("q_proj", "v_proj"), "its linear layers are: q, k, v, o, wi, wo, lm_head (or all-linear)"),
    # PEFT maps these names onto the stacked experts too (transformers_weight_conversion.py): not counted here
    ("deepseek-ai/DeepSeek-V3", ("gate_proj", "o_proj"), "adapters on gate_proj are not modelled for deepseek_v3 yet"),
    ("Qwen/Qwen3-30B-A3B", ("up_proj",), "adapters on up_proj are not modelled for qwen3_moe yet"),
    ("Qwen/Qwen3-30B-A3B", "all-linear", "all-linear is not modelled for qwen3_moe yet"),
    # get_peft_model raises on out_proj of a Mamba model (peft/tuners/tuners_utils.py), so all-linear too
    ("state-spaces/mamba-130m-hf", "all-linear", "PEFT refuses LoRA on out_proj of a mamba model; name the targets "
     "(some of: in_proj, x_proj, dt_proj, lm_head)"),
])
def test_what_peft_would_refuse_or_stacked_experts_are_a_value_error(model, targets, message):
    with pytest.raises(ValueError) as caught:
        adapter_params(resolve_model(model), LoraConfig(rank=8, targets=targets))
    assert message in str(caught.value)

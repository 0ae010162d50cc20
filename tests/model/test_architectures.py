"""Parameter counts are exact: equal to sum(p.numel()) of the transformers model on the meta device."""

from __future__ import annotations

import pytest

from advisor.model.architectures import count_from_config
from advisor.model.meta import build_meta_model, spec_from_module
from advisor.model.sources import spec_from_config
from advisor.model.bundled import bundled_model_ids, load_bundled_config


def _meta_count(cfg: dict) -> int:
    return sum(p.numel() for p in build_meta_model(cfg).parameters())


@pytest.mark.parametrize("model_id", bundled_model_ids())
def test_bundled_formula_matches_meta_device(model_id):
    cfg = load_bundled_config(model_id)
    spec = count_from_config(cfg, name=model_id, source="bundled")
    assert spec is not None, f"{model_id} has no fast formula"
    assert spec.total_params == _meta_count(cfg)


def test_tiny_configs_match_meta_device(tiny_config):
    name, cfg = tiny_config
    spec = spec_from_config(cfg, name=name, source="local")
    module = build_meta_model(cfg)
    assert spec.total_params == sum(p.numel() for p in module.parameters())
    if name.endswith("_fallback"):
        assert spec.count_method == "meta_device"
    else:
        assert spec.count_method == "formula"
        # Components from the formula agree with the module tree, not just the sum.
        measured = spec_from_module(module)
        fields = ["embedding_params", "layer_params", "num_layers", "block_classes"]
        if not name.startswith("bert"):  # BERT's MLM transform counts as head here, as 'other' there
            fields += ["head_params", "other_params"]
        for field in fields:
            assert getattr(spec, field) == getattr(measured, field), field


def test_published_totals():
    """Spot checks against the totals model cards publish."""
    expect = {"Qwen/Qwen2.5-7B": 7_615_616_512, "meta-llama/Llama-3.1-8B": 8_030_261_248,
              "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704, "openai-community/gpt2": 124_439_808}
    for model_id, total in expect.items():
        assert count_from_config(load_bundled_config(model_id), name=model_id, source="bundled").total_params == total


def test_moe_active_params():
    spec = count_from_config(load_bundled_config("mistralai/Mixtral-8x7B-v0.1"), name="m", source="bundled")
    # Mixtral 8x7B: about 12.9B parameters active per token (Mistral AI's announcement).
    assert 12.8e9 < spec.active_params < 13.0e9
    assert spec.num_experts == 8 and spec.num_experts_per_token == 2


def test_tied_embeddings_counted_once():
    tied = count_from_config(load_bundled_config("Qwen/Qwen2.5-0.5B"), name="q", source="bundled")
    untied = count_from_config(load_bundled_config("Qwen/Qwen2.5-7B"), name="q", source="bundled")
    assert tied.tied_embeddings and tied.head_params == 0
    assert not untied.tied_embeddings and untied.head_params == untied.embedding_params


def test_live_module_trainable_and_shared():
    import torch

    cfg = load_bundled_config("Qwen/Qwen2.5-0.5B")
    module = build_meta_model(cfg)
    for p in module.model.layers.parameters():
        p.requires_grad_(False)
    spec = spec_from_module(module)
    # Qwen2.5-0.5B by hand (hidden 896, 24 layers, 14 heads of 64, 2 KV heads, MLP 4864, vocab 151,936):
    # a layer is q 896*896+896 + k,v 2*(896*128+128) + o 896*896 + MLP 3*896*4864 + norms 2*896 = 14,912,384;
    # 24 of them 357,897,216 + tied embeddings 151,936*896 = 136,134,656 + final norm 896 = 494,032,768.
    assert (spec.total_params, spec.num_layers, spec.layer_params) == (494_032_768, 24, 14_912_384)
    assert spec.trainable_params == 136_134_656 + 896  # the layers frozen: embeddings and final norm
    assert spec.tied_embeddings is True
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    assert spec_from_module(plain).total_params == 4 * 4 + 4 + 4 * 2 + 2

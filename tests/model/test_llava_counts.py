"""Llava counted from the config (``advisor.model.llava``) equals ``sum(p.numel())`` of the transformers
model on the meta device: tiny configs built in code (the bundled llava-1.5-7b-hf through
tests/model/test_architectures.py), the image tokens an image and the block classes."""

from __future__ import annotations

import pytest

from advisor.model.architectures import count_from_config
from advisor.model.meta import build_meta_model

LLAMA = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=1000)
CLIP = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=2, image_size=32, patch_size=8)
BASE = dict(model_type="llava", architectures=["LlavaForConditionalGeneration"], image_token_index=999)
TINY = {
    "default": dict(BASE, text_config=LLAMA, vision_config=CLIP),
    # The CLS token kept, two feature layers concatenated (projector input 2 x 32), no projector biases.
    "full_two_layers_no_bias": dict(BASE, text_config=LLAMA, vision_config=CLIP, vision_feature_select_strategy="full",
                                    vision_feature_layer=[-2, -3], multimodal_projector_bias=False),
    "mistral_tied": dict(BASE, text_config=dict(LLAMA, model_type="mistral"), vision_config=CLIP,
                         tie_word_embeddings=True),
}


@pytest.mark.parametrize("name", sorted(TINY))
def test_llava_counts_match_meta_device(name):
    cfg = TINY[name]
    spec = count_from_config(cfg, name=name, source="local")
    assert spec is not None and spec.count_method == "formula"
    model = build_meta_model(cfg)
    assert spec.total_params == sum(p.numel() for p in model.parameters())
    tower = model.model.vision_tower
    assert spec.vision.num_layers == len(tower.encoder.layers)
    assert spec.layer_params == sum(p.numel() for p in model.model.language_model.layers[0].parameters())
    assert spec.tied_embeddings == (model.lm_head.weight is model.model.language_model.embed_tokens.weight)
    assert spec.block_classes == (type(model.model.language_model.layers[0]).__name__, "CLIPEncoderLayer")
    assert spec.vision.block_class == type(tower.encoder.layers[0]).__name__ == "CLIPEncoderLayer"


def test_image_tokens_and_used_layers():
    """32 x 32 images of 8 x 8 patches: 16 patches + CLS. 'default' drops CLS (16 language-model tokens
    an image, whatever --image-size: the processor resizes to the tower's side), 'full' keeps it (17).
    vision_feature_layer -2 of 3 layers: hidden_states holds 4 entries, entry 2 needs 2 layers; [-2, -3]: 2."""
    from advisor.estimate.memory import image_tokens
    from advisor.training import TrainingConfig

    default = count_from_config(TINY["default"], name="d", source="local")
    full = count_from_config(TINY["full_two_layers_no_bias"], name="f", source="local")
    assert (default.vision.tokens, default.vision.image_tokens, default.vision.used_layers) == (17, 16, 2)
    assert (full.vision.image_tokens, full.vision.used_layers, full.vision.projector_in) == (17, 2, 64)
    assert image_tokens(default, TrainingConfig(images_per_sample=3, image_size=1000)) == 48


def test_other_towers_fall_back_to_the_meta_device():
    """A SigLIP tower is not CLIP's module tree: no formula, the meta device counts it."""
    siglip = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=2, image_size=32, patch_size=8)
    assert count_from_config(dict(BASE, text_config=LLAMA, vision_config=siglip), name="s", source="local") is None


@pytest.mark.parametrize("targets", [("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "o_proj"), "all-linear"])
def test_lora_on_llava_equals_peft_tower_included(targets):
    """PEFT's name matching puts q_proj / v_proj adapters on the CLIP tower's layers as well as the
    language model's, and all-linear also on the tower's out_proj / fc1 / fc2 and the projector."""
    peft = pytest.importorskip("peft")
    from advisor.model.lora import LoraConfig, adapter_params, with_lora
    from advisor.model.meta import spec_from_module

    cfg = TINY["default"]
    spec = count_from_config(cfg, name="tiny", source="local")
    lora = LoraConfig(rank=4, targets=targets)
    wrapped = peft.get_peft_model(build_meta_model(cfg), peft.LoraConfig(r=4, target_modules=targets if
                                                                         targets == "all-linear" else list(targets)))
    assert adapter_params(spec, lora) == sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    assert with_lora(spec, lora).total_params == spec_from_module(wrapped).total_params

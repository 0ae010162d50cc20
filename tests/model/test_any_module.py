"""Any ``nn.Module`` is described (issue 10, item 4): models without token embeddings (ViT, ResNet,
CLIP, Wav2Vec2) get exact counts, no vocabulary, and a note that their activations are not
modelled; ``advisor inspect`` on their config.json works; one process gets its model back unchanged.

Tiny configs are built in code (no network). Counts are worked by hand where the module tree is
small enough (ViT, ResNet, a tied toy); for CLIP and Wav2Vec2 the reference is the real CPU module's
own ``sum(p.numel())``, against the meta-device path ``inspect`` takes.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from click.testing import CliRunner
from torch import nn

from advisor.cli.main import cli
from advisor.estimate.activations import Dtypes, estimate_activations, shape_of
from advisor.model.meta import spec_from_module
from advisor.model.sources import resolve_model

# ViT: hidden 32, 2 layers, 2 heads, MLP 64, 32x32 images in 8x8 patches (16 patches), 3 channels.
# Embeddings: cls 32 + positions (16 + 1) x 32 = 544 + patch conv 3*8*8*32 + 32 = 6176 -> 6752.
# One ViTLayer: q, k, v, out 4 x (32*32 + 32) = 4224; MLP 32*64 + 64 + 64*32 + 32 = 4192; two
# LayerNorms 2 x 64 -> 8544. Final LayerNorm 64, pooler 32*32 + 32 = 1056.
VIT_TOTAL = 6752 + 2 * 8544 + 64 + 1056  # 24,960
VIT_EMBEDDINGS = 6752
# ResNet (basic blocks): stem conv 3->8 7x7 (1176) + BN (16); stage 1 (8->8, identity shortcut):
# 2 x (3x3 conv 576 + BN 16) = 1184; stage 2 (8->16, stride 2): 3x3 convs 1152 + 2304, BNs 32 + 32,
# 1x1 shortcut conv 128 + BN 32 = 3680. BN running stats are buffers, not parameters.
RESNET_TOTAL = 1176 + 16 + 1184 + 3680  # 6,056


def _configs() -> dict:
    layers = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    return {
        "vit": transformers.ViTConfig(**layers, image_size=32, patch_size=8),
        "resnet": transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"),
        "clip": transformers.CLIPConfig(
            text_config=dict(**layers, vocab_size=100, bos_token_id=0, eos_token_id=1, pad_token_id=1),
            vision_config=dict(**layers, image_size=32, patch_size=8), projection_dim=16),
        "wav2vec2": transformers.Wav2Vec2Config(
            **layers, conv_dim=(8, 8), conv_kernel=(3, 3), conv_stride=(2, 2), num_conv_pos_embeddings=4,
            num_conv_pos_embedding_groups=2, vocab_size=20),
    }


CONFIGS = _configs()
KINDS = sorted(CONFIGS)


def _model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    return transformers.AutoModel.from_config(CONFIGS[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_spec_from_module_accepts_models_without_token_embeddings(kind):
    model = _model(kind)
    spec = spec_from_module(model)
    assert spec.total_params == spec.trainable_params == sum(p.numel() for p in model.parameters())
    assert spec.vocab_size is None  # Wav2Vec2's CTC vocab_size and CLIP's text tower are not an LM vocabulary
    shape = shape_of(spec)
    assert shape.family == "none"
    assert shape.note.startswith("no token embeddings: activations are not modelled for ")
    assert type(model).__name__ in shape.note and "model states only" in shape.note


def test_hand_counts_vit_and_resnet():
    vit, resnet = spec_from_module(_model("vit")), spec_from_module(_model("resnet"))
    assert vit.total_params == VIT_TOTAL and resnet.total_params == RESNET_TOTAL
    # ViT's repeated block is found even without token embeddings (FSDP's wrap unit).
    assert (vit.num_layers, vit.layer_params, vit.block_classes, vit.embedding_params) == (2, 8544, ("ViTLayer",), 0)
    assert (vit.hidden_size, vit.num_attention_heads) == (32, 2)
    assert resnet.hidden_size is None and resnet.num_layers is None  # ResNet has neither


def test_frozen_and_shared_parameters():
    vit = _model("vit")
    vit.embeddings.requires_grad_(False)
    spec = spec_from_module(vit)
    assert (spec.total_params, spec.trainable_params) == (VIT_TOTAL, VIT_TOTAL - VIT_EMBEDDINGS)
    toy = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False), nn.LayerNorm(4))
    toy[1].weight = toy[0].weight  # shared: counted once
    toy[2].requires_grad_(False)
    spec = spec_from_module(toy)
    assert (spec.total_params, spec.trainable_params) == (10 * 4 + 2 * 4, 10 * 4)
    assert shape_of(spec).note.startswith("no token embeddings") and spec.architecture == "Sequential"


def test_module_without_parameters_is_one_clear_error():
    with pytest.raises(ValueError, match="no parameters"):
        spec_from_module(nn.ReLU())


def test_not_modelled_means_no_activation_bytes():
    shape = shape_of(spec_from_module(_model("vit")))
    acts = estimate_activations(shape, Dtypes(residual=4, compute=2, input_casts=True), micro_batch_size=64,
                                seq_len=2048, checkpointing=False, eager=False)
    assert (acts.saved_bytes, acts.logits_bytes, acts.loss_transient_bytes, acts.backward_temp_bytes) == (0, 0, 0, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_inspect_local_config(kind, tmp_path):
    CONFIGS[kind].save_pretrained(tmp_path)
    real = sum(p.numel() for p in _model(kind).parameters())
    result = CliRunner().invoke(cli, ["inspect", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"{real:,}" in result.output
    assert "no token embeddings" in " ".join(result.output.split())
    assert resolve_model(str(tmp_path)).total_params == real


def test_plan_states_what_is_not_modelled(tmp_path):
    from advisor.planning.api import plan

    CONFIGS["vit"].save_pretrained(tmp_path)
    result = plan(str(tmp_path), gpus="1xA100", micro_batch_size=8, strategy="ddp")
    assert any(a.startswith("no token embeddings: activations are not modelled for ViTModel")
               for a in result.assumptions)
    assert result.candidate("ddp").memory_bytes.activations == 0
    assert not any("pass a config" in a for a in result.assumptions)


@pytest.mark.parametrize("kind", KINDS)
def test_wrap_one_process_returns_model_unchanged(kind, capsys):
    from wrappers import wrap
    from wrappers.launch_env import LaunchEnv

    model = _model(kind)
    env = LaunchEnv(world_size=1, rank=0, local_rank=0, local_world_size=1, num_gpus=0, gpu_name=None,
                    accelerate_plugin=None)
    same = wrap(model, env=env)
    assert same is model and model.advisor_decision.strategy is None
    assert "[advisor] not parallelised (" in capsys.readouterr().err  # returned without a wrapper


def test_one_layer_model_block_is_the_layer_not_the_embeddings():
    """BertEmbeddings is in BERT's _no_split_modules too; with one layer both occur once (the old
    rule, most instances, took the first: the embeddings). By hand: embeddings 100*32 + 64*32 + 2*32
    + LayerNorm 64 = 5,376; BertLayer 4 x (32*32 + 32) + 64 + (32*64 + 64) + (64*32 + 32) + 64 = 8,544."""
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    spec = spec_from_module(transformers.BertModel(config, add_pooling_layer=False))
    assert (spec.block_classes, spec.num_layers, spec.layer_params, spec.embedding_params) == (("BertLayer",), 1, 8544, 3200)
    assert spec.total_params == 5376 + 8544

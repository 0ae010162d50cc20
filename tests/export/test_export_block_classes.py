"""A model with several kinds of block (Jamba: attention layers and Mamba layers) is exported with every
block class, and the consumers' own auto-wrap code then makes each layer of either kind an FSDP unit.

Before, profiles/architectures.json named one class per family, so the exports wrapped Jamba's
attention layers and left its Mamba layers (most of the model) in the root unit.
"""

from __future__ import annotations

import pytest
import transformers

from advisor.export.accelerate import build_accelerate, render_accelerate
from advisor.export.lightning import build_lightning
from advisor.export.trainer import build_trainer_args
from advisor.export.write import write_export
from advisor.planning.api import plan

# Attention on layers 1 and 3, Mamba on 0 and 2 (the class names are transformers 5.x modeling_jamba.py's).
TINY_JAMBA = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=100, num_experts=2, num_experts_per_tok=1, attn_layer_period=2,
                  attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, mamba_d_state=4,
                  mamba_d_conv=2, mamba_expand=2, use_mamba_kernels=False, architectures=["JambaForCausalLM"])
LAYERS = ["JambaMambaDecoderLayer", "JambaAttentionDecoderLayer"] * 2  # by hand from the periods above
BOTH = ["JambaAttentionDecoderLayer", "JambaMambaDecoderLayer"]


@pytest.fixture
def jamba_dir(tmp_path):
    transformers.JambaConfig(**TINY_JAMBA).save_pretrained(tmp_path / "jamba")
    return str(tmp_path / "jamba")


@pytest.fixture
def jamba_model():
    return transformers.JambaForCausalLM(transformers.JambaConfig(**TINY_JAMBA))


def _wrapped_by(plugin, model) -> list[str]:
    """Class names of the modules accelerate's FSDP2 auto-wrap policy makes units (utils/fsdp_utils.py)."""
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    return [type(m).__name__ for m in model.modules() if policy(m)]


def test_accelerate_config_wraps_both_kinds_of_layer(tmp_path, monkeypatch, jamba_dir, jamba_model):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    assert [type(layer).__name__ for layer in jamba_model.model.layers] == LAYERS
    result = plan(jamba_dir, "2xA100", strategy="zero3")
    assert build_accelerate(result)["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == ",".join(BOTH)
    path = write_export(tmp_path / "accelerate.yaml", render_accelerate(result))
    assert load_config_from_file(str(path)).distributed_type == "FSDP"
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", str(path), "t.py"]))
    for key, value in prepare_multi_gpu_env(args).items():
        monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.transformer_cls_names_to_wrap == BOTH
    assert _wrapped_by(plugin, jamba_model) == LAYERS


def test_trainer_args_wrap_both_kinds_of_layer(tmp_path, jamba_dir, jamba_model):
    from accelerate.utils import FullyShardedDataParallelPlugin

    doc = build_trainer_args(plan(jamba_dir, "2xA100", strategy="zero3"))
    assert doc["fsdp_config"]["transformer_layer_cls_to_wrap"] == BOTH
    doc["bf16"] = False  # this test machine has no bf16-capable GPU
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **doc)
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)  # what the Trainer's Accelerator builds
    assert _wrapped_by(plugin, jamba_model) == LAYERS


def test_lightning_snippet_names_both_kinds_of_layer(jamba_dir, jamba_model):
    source = build_lightning(plan(jamba_dir, "2xA100", strategy="zero3"))
    namespace: dict = {}
    exec(source.split("\nstrategy = ")[0], namespace)  # the imports, BLOCK_CLASSES and shard_model
    assert [type(m).__name__ for m in jamba_model.modules() if type(m).__name__ in namespace["BLOCK_CLASSES"]] == LAYERS

"""Blocks come from ``_no_split_modules`` or the ModuleList heuristic; checkpoint wrappers stand in for them."""

from __future__ import annotations

import pytest
from tests.wrappers._dist import run_scenarios, tiny_llama
from torch import nn

from wrappers.blocks import block_class_names, find_blocks
from wrappers.checkpointing import apply_activation_checkpointing


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(self.up(x).relu())


class _Stack(nn.Module):
    """No ``_no_split_modules``: the heuristic must find ``layers``."""

    def __init__(self, width: int = 16, num_layers: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, width)
        self.layers = nn.ModuleList(_Block(width) for _ in range(num_layers))
        self.heads = nn.ModuleList([nn.Linear(width, 2), nn.Linear(width, 3)])  # mixed classes: never blocks

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.heads[0](x)


def test_hugging_face_blocks_from_no_split_modules():
    model = tiny_llama()
    assert find_blocks(model) == list(model.model.layers)
    assert block_class_names(model) == ["LlamaDecoderLayer"]


def test_heuristic_picks_the_module_list_holding_most_parameters():
    model = _Stack()
    assert find_blocks(model) == list(model.layers)
    assert block_class_names(model) == ["_Block"]


def test_no_blocks_when_the_list_holds_a_minority_of_parameters():
    model = _Stack(num_layers=2)
    model.embed = nn.Embedding(100_000, 16)  # the table now dominates
    assert find_blocks(model) == []
    assert block_class_names(model) == []


def test_checkpoint_wrappers_stand_in_for_their_blocks():
    for model in (tiny_llama(), _Stack()):
        wrappers = apply_activation_checkpointing(model, blocks=find_blocks(model))
        assert find_blocks(model) == wrappers
        assert len(block_class_names(model)) == 1


# Tiny configs of the families whose blocks come in several kinds (and two with one kind, for contrast).
_SEVERAL_KINDS = {
    "jamba": dict(model_type="jamba", architectures=["JambaForCausalLM"], hidden_size=32, intermediate_size=48,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=100, num_experts=2,
                  num_experts_per_tok=1, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                  expert_layer_offset=1, mamba_d_state=4, mamba_d_conv=2, mamba_expand=2, use_mamba_kernels=False),
    "bart": dict(model_type="bart", architectures=["BartForConditionalGeneration"], d_model=32, encoder_layers=2,
                 decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
                 decoder_ffn_dim=48, vocab_size=100, max_position_embeddings=64),
    "qwen2_5_vl": dict(model_type="qwen2_5_vl", architectures=["Qwen2_5_VLForConditionalGeneration"], hidden_size=64,
                       intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       vocab_size=300, rope_scaling={"mrope_section": [2, 3, 3], "rope_type": "default"},
                       vision_config=dict(depth=2, hidden_size=32, intermediate_size=40, num_heads=2,
                                          out_hidden_size=64, patch_size=4, spatial_merge_size=2)),
    "t5": dict(model_type="t5", architectures=["T5ForConditionalGeneration"], d_model=32, d_ff=48, d_kv=8,
               num_heads=4, num_layers=2, vocab_size=100, decoder_start_token_id=0, pad_token_id=0),
    "mamba": dict(model_type="mamba", architectures=["MambaForCausalLM"], hidden_size=32, num_hidden_layers=2,
                  state_size=4, conv_kernel=2, expand=2, vocab_size=100),
}


@pytest.mark.parametrize("family", sorted(_SEVERAL_KINDS))
def test_architecture_table_names_the_blocks_wrap_shards(family):
    """profiles/architectures.json's block_classes (what the exports wrap) are the classes find_blocks
    (what wrap() shards) finds in the transformers model, every kind of layer included."""
    from advisor.model.architectures import count_from_config
    from advisor.model.meta import build_meta_model

    cfg = _SEVERAL_KINDS[family]
    spec = count_from_config(cfg, name=family, source="local")
    assert spec is not None and spec.count_method == "formula"
    assert block_class_names(build_meta_model(cfg)) == sorted(spec.block_classes)


def _shard_jamba(rank: int, world_size: int) -> None:
    import torch
    import transformers
    from torch.distributed.fsdp import FSDPModule

    from wrappers.fsdp import apply_fsdp

    cfg = {k: v for k, v in _SEVERAL_KINDS["jamba"].items() if k != "model_type"}
    torch.manual_seed(0)
    model = transformers.JambaForCausalLM(transformers.JambaConfig(**cfg))
    apply_fsdp(model, reshard_after_forward=True, precision="fp32", cpu_offload=False)
    # Layers 1 and 3 attention, 0 and 2 Mamba (the periods above): each its own unit, then the root.
    assert [type(m).__name__ for m in model.modules() if isinstance(m, FSDPModule)] == [
        "FSDPJambaForCausalLM", "FSDPJambaMambaDecoderLayer", "FSDPJambaAttentionDecoderLayer",
        "FSDPJambaMambaDecoderLayer", "FSDPJambaAttentionDecoderLayer"]
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in model.model.layers.parameters())


def test_wrap_shards_both_kinds_of_jamba_layer():
    run_scenarios({"jamba": (_shard_jamba,)}, world_size=1).check("jamba")

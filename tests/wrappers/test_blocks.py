"""Blocks come from ``_no_split_modules`` or the ModuleList heuristic; checkpoint wrappers stand in for them."""

from __future__ import annotations

from tests.wrappers._dist import tiny_llama
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

"""The linear layers of a model as PEFT sees them: qualified module names and shapes, recorded by
building the model on the meta device (``advisor.simulate.linears``) for a family whose layers no
formula lists. LoRA counts its adapters from them (``advisor.model.lora``). Pure data, no torch.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

# A repeated block's index in a qualified name: "model.layers.3.self_attn.q_proj" -> ("model.layers", 3, ...).
_BLOCK = re.compile(r"^(.*?)\.(\d+)\.(.+)$")


class LinearLayer(BaseModel):
    """One ``nn.Linear`` (or transformers' ``Conv1D``) of the model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Qualified module name (model.named_modules()).")
    in_features: int = Field(ge=1)
    out_features: int = Field(ge=1)

    @property
    def short_name(self) -> str:
        """The last component, the name PEFT's suffix matching is usually given; the last two for a layer of
        an ``nn.Sequential`` (Qwen2.5-VL's ``merger.mlp.0``), whose bare index would also match the blocks."""
        parts = self.name.rsplit(".", 2)
        return ".".join(parts[-2:]) if parts[-1].isdigit() and len(parts) > 1 else parts[-1]

    @property
    def block(self) -> tuple[str, int, str] | None:
        """(the block list's name, the block's index, the name inside the block), or None outside the blocks."""
        found = _BLOCK.match(self.name)
        return None if found is None else (found[1], int(found[2]), found[3])


class LinearLayout(BaseModel):
    """Every linear layer of one model, and which of them is the output head (PEFT's all-linear leaves
    it out: ``get_output_embeddings()``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layers: tuple[LinearLayer, ...] = Field(description="In module order.")
    output: str | None = Field(default=None, description="Qualified name of the output head; None: none.")
    stacked_experts: bool = Field(default=False, description="The model keeps mixture-of-experts weights in "
                                  "stacked 3-D parameters (transformers 5), which PEFT's all-linear also adapts.")

    @property
    def short_names(self) -> tuple[str, ...]:
        """Each layer's last name once, in module order."""
        return tuple(dict.fromkeys(layer.short_name for layer in self.layers))

    def first_block(self) -> tuple[LinearLayer, ...]:
        """The layers of block 0 of the first repeated block list."""
        lists = [layer.block[0] for layer in self.layers if layer.block is not None]
        if not lists:
            return ()
        return tuple(layer for layer in self.layers if layer.block is not None and layer.block[:2] == (lists[0], 0))

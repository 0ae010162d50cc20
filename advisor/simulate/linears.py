"""Record a model's linear layers on the meta device, for LoRA on a family no formula lists.

``recorded_linears(cfg, cache_dir=)`` builds the model as the tracer and the simulator build it
(``advisor.model.meta.build_meta_model``: no weights, no memory), lists every ``nn.Linear`` and
transformers' ``Conv1D`` (the layer classes PEFT's LoRA and ``all-linear`` take) with its qualified
name and shape, and names the output head (``get_output_embeddings()``, which ``all-linear`` leaves
out). Cached as JSON next to the traced profiles (``advisor.simulate.profile_cache``), keyed by the
config and the torch and transformers versions, so a second plan imports no torch. Counting the
adapters from them is ``advisor.model.lora``'s.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from advisor.model.cache_entry import read_entry, write_entry
from advisor.model.linear_layout import LinearLayer, LinearLayout
from advisor.model.spec_cache import cache_file_stem, config_digest, library_versions


def linear_layout(net: Any) -> LinearLayout:
    """The linear layers of a built model (meta or real)."""
    import torch
    from transformers.pytorch_utils import Conv1D

    layers = []
    for name, module in net.named_modules():
        if isinstance(module, torch.nn.Linear):
            layers.append(LinearLayer(name=name, in_features=module.in_features, out_features=module.out_features))
        elif isinstance(module, Conv1D):  # GPT-2's: weight (in, out)
            fan_in, fan_out = module.weight.shape
            layers.append(LinearLayer(name=name, in_features=fan_in, out_features=fan_out))
    get_output = getattr(net, "get_output_embeddings", None)
    head = get_output() if callable(get_output) else None
    output = next((name for name, module in net.named_modules() if module is head), None) if head is not None else None
    stacked = any(param.dim() == 3 for param in net.parameters())
    return LinearLayout(layers=tuple(layers), output=output, stacked_experts=stacked)


def recorded_linears(cfg: dict, *, cache_dir: Path | None) -> LinearLayout:
    """``cfg``'s linear layers, from ``cache_dir`` when an earlier plan recorded them."""
    path = None
    if cache_dir is not None:
        digest = config_digest(cfg, kind="linears", versions=library_versions())
        path = cache_dir / "linears" / f"{cache_file_stem(cfg)}-{digest}.json"
        entry = read_entry(path, kind="linears")
        if entry is not None:
            try:
                return LinearLayout.model_validate(entry)
            except ValueError:
                pass  # written by another version: record again
    from advisor.model.meta import build_meta_model

    layout = linear_layout(build_meta_model(copy.deepcopy(cfg)))  # transformers edits nested dicts in place
    if path is not None:
        write_entry(path, layout.model_dump(mode="json"), kind="linears")
    return layout

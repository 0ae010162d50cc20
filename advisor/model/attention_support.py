"""Which transformers model classes have no SDPA attention path (``profiles/attention_support.json``).

Such a class runs eager attention unless flash or flex attention is asked for by name, so a plan that leaves
``--attention`` unset counts eager's score matrices for it. Pure: reads the profile, imports no torch.
"""

from __future__ import annotations

import functools
import json

from profiles import PROFILES_DIR


@functools.cache
def no_sdpa_classes() -> frozenset[str]:
    return frozenset(json.loads((PROFILES_DIR / "attention_support.json").read_text())["no_sdpa"])


def runs_eager_by_default(architecture: str | None) -> bool:
    """Whether transformers' ``architecture`` class has no SDPA path, so it runs eager attention by default."""
    return architecture in no_sdpa_classes()

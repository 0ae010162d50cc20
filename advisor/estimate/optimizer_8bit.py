"""bitsandbytes' blockwise 8-bit AdamW (``--optimizer adamw-8bit`` / ``adamw-8bit-paged``): the state's bytes
by release, from ``profiles/bitsandbytes_optimizers.json``. Pure: no torch or bitsandbytes import; which
release is planned comes in ``TrainingConfig.bitsandbytes`` (the planner fills in the installed one, read
from package metadata by ``advisor.model.releases.installed_release``; None: the newest release's block).

``Optimizer2State.init_state`` (bitsandbytes/optim/optimizer.py) gives each parameter of ``n >= 4096``
elements two uint8 states of its shape and two fp32 absmax vectors of ``ceil(n / block)`` entries; the block
was 2048 elements up to 0.43.3 and is 256 from 0.44.0 (commit aa57bd89, PR #1365): 2 + 8 / 2048 bytes an
element before, 2 + 8 / 256 = 2.03125 from 0.44.0. Counted over all trainable elements at once (the per-tensor
ceiling adds at most 8 bytes a tensor); the shared 256-entry quantisation maps (2 KiB) and the fp32 states of
tensors under 4096 elements (norms and biases of models narrower than 4096: about 6 bytes an element more,
2 MB on Qwen2.5-7B) are left out.
"""

from __future__ import annotations

import functools
import json

from pydantic import BaseModel, ConfigDict, Field

from advisor.model.releases import release_tuple
from advisor.precision import FP32
from profiles import PROFILES_DIR

EIGHT_BIT_OPTIMIZERS = ("adamw-8bit", "adamw-8bit-paged")


class AbsmaxBlock(BaseModel):
    """The absmax block of one range of bitsandbytes releases."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    since: str = Field(description="The first release with this block (until the next row's release).")
    block_elements: int = Field(ge=1, description="Elements of a state that share one fp32 absmax.")
    source: str = Field(description="The bitsandbytes source lines (tag and commit) that show it.")


@functools.cache
def load_absmax_blocks() -> tuple[AbsmaxBlock, ...]:
    """The table's rows, oldest release first."""
    raw = json.loads((PROFILES_DIR / "bitsandbytes_optimizers.json").read_text())["blocks"]
    return tuple(sorted((AbsmaxBlock(**row) for row in raw), key=lambda row: release_tuple(row.since)))


def absmax_block(release: str | None) -> AbsmaxBlock:
    """The row in force for bitsandbytes ``release``; None: the newest release's."""
    rows = load_absmax_blocks()
    if release is None:
        return rows[-1]
    return [row for row in rows if release_tuple(release) >= release_tuple(row.since)][-1]


def eight_bit_state_bytes(trainable_params: int, release: str | None) -> int:
    """Two uint8 moments an element and one fp32 absmax per block of each (bytes)."""
    block = absmax_block(release).block_elements
    return 2 * trainable_params + 2 * FP32 * trainable_params // block


def bitsandbytes_note(release: str | None, *, installed: bool) -> str:
    """The plan's assumption: which release's block its 8-bit optimizer state is counted with."""
    row = absmax_block(release)
    per_element = 2 + 2 * FP32 / row.block_elements
    counted = (f"two uint8 moments and one fp32 absmax per {row.block_elements}-element block of each "
               f"({per_element:g} bytes a trainable parameter; profiles/bitsandbytes_optimizers.json)")
    if release is None:
        return (f"8-bit AdamW state: bitsandbytes not installed, the newest release's behaviour assumed "
                f"({row.since} and later): {counted}")
    return f"8-bit AdamW state: bitsandbytes {release} ({'installed' if installed else 'given'}): {counted}"

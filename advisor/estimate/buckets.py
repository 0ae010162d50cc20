"""Communication bucket sizes: the one place that decides them. The memory estimate, the step-time
estimate and the DeepSpeed export all read ``deepspeed_buckets``, so the file we write is the
configuration we estimated.

DeepSpeed: accelerate's ``"auto"`` values (accelerate/utils/deepspeed.py,
``HfDeepSpeedConfig``-style fill-in): ``reduce_bucket_size = hidden^2``,
``stage3_prefetch_bucket_size = 0.9 hidden^2``; ``allgather_bucket_size`` (ZeRO-1/2) follows the
reduce bucket; ``stage3_max_live_parameters`` keeps DeepSpeed's default of 1e9 elements
(deepspeed/runtime/zero/config.py).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from advisor.estimate.activations import shape_of
from advisor.model.spec import ModelSpec
from advisor.recipes import ZeroSettings

MAX_LIVE_PARAMETERS = 10**9  # DeepSpeed's default stage3_max_live_parameters


class DeepSpeedBuckets(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    reduce_elements: int = Field(gt=0, description="reduce_bucket_size: gradients reduced per bucket (IPG buffer).")
    allgather_elements: int = Field(gt=0, description="allgather_bucket_size (ZeRO-1/2).")
    prefetch_elements: int = Field(ge=0, description="stage3_prefetch_bucket_size (ZeRO-3).")
    max_live_parameters: int = Field(gt=0, description="stage3_max_live_parameters (ZeRO-3).")


def deepspeed_buckets(spec: ModelSpec, settings: ZeroSettings | None = None) -> DeepSpeedBuckets:
    """The bucket sizes of a DeepSpeed run of ``spec``: the ones a user's config fixes (``settings``,
    ``TrainingConfig.zero``), the rest filled as accelerate fills ``"auto"`` (module docstring)."""
    hidden_sq = (spec.hidden_size or shape_of(spec).hidden_size) ** 2
    given = settings or ZeroSettings()
    reduce = given.reduce_bucket_size or hidden_sq
    return DeepSpeedBuckets(
        reduce_elements=reduce, allgather_elements=given.allgather_bucket_size or reduce,
        prefetch_elements=hidden_sq * 9 // 10 if given.stage3_prefetch_bucket_size is None
        else given.stage3_prefetch_bucket_size,
        max_live_parameters=given.stage3_max_live_parameters or MAX_LIVE_PARAMETERS)

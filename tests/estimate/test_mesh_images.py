"""Images on a device mesh (``advisor.estimate.model_parallel``): the image tokens join the language
model's sequence that CP splits, and the vision tower, replicated over tp and outside CP's sequence
split, keeps its whole activations on every rank. Worked by hand on llava-1.5-7b, whose tower bytes are
counted by hand in ``tests/estimate/test_llava_activations.py``."""

from __future__ import annotations

import pytest

from advisor.estimate.model_parallel import estimate_mesh_memory
from advisor.hardware.cluster import parse_gpus
from advisor.mesh import ParallelDims
from advisor.model.sources import resolve_model
from advisor.planning.api import plan
from advisor.strategies import STRATEGIES
from advisor.training import TrainingConfig
from tests.estimate.test_llava_activations import ALONE_7B, PER_IMAGE_7B

ZERO3 = STRATEGIES["zero3"].on("torch")


def _at_loss(spec, mesh: ParallelDims, **training) -> int:
    mem = estimate_mesh_memory(spec, parse_gpus("8xH100"), TrainingConfig(**training), ZERO3, mesh,
                               micro_batch_size=1, checkpointing=False)
    return mem.at_loss_backward


@pytest.mark.parametrize("tp, cp", [(2, 1), (2, 2), (1, 2)])
def test_llava_images_on_a_mesh_add_their_tokens_and_the_whole_tower(tp, cp):
    """llava-1.5-7b (336 x 336 images, 14-pixel patches: 24^2 = 576 image tokens an image), bf16 FSDP2,
    micro-batch 1, no checkpointing, at the loss backward: one image at 2,048 text tokens is the language
    model at 2,048 + 576 = 2,624 tokens (split by cp like text: 1,312 a rank at cp 2) plus the whole tower
    on every rank, 557,126,976 bytes by hand (579,625,360 from transformers 5.24.0, one image alone); two
    images at 2,048 are 2,048 + 1,152 = 3,200 tokens plus twice the per-image figure, 1,114,253,952 bytes
    (1,161,614,112)."""
    spec = resolve_model("llava-hf/llava-1.5-7b-hf")
    mesh = ParallelDims(dp_shard=8 // (tp * cp), cp=cp, tp=tp, world_size=8)
    one = _at_loss(spec, mesh, seq_len=2048, images_per_sample=1) - _at_loss(spec, mesh, seq_len=2624)
    two = _at_loss(spec, mesh, seq_len=2048, images_per_sample=2) - _at_loss(spec, mesh, seq_len=3200)
    assert one == ALONE_7B
    assert two == 2 * PER_IMAGE_7B


def test_more_images_need_more_memory_on_a_mesh():
    """The issue's case: Qwen2.5-VL-7B on 8 x H100 at 1,024 x 1,024 pixels (37^2 = 1,369 tokens an image);
    64 images a sample add 48 x 1,369 = 65,712 language-model tokens and 48 x 5,476 patches of tower over 16
    images, so every mesh at the same micro-batch needs more memory; before, the mesh plans were the same
    at 0, 16 and 64 images."""
    options = dict(image_size=1024, micro_batch_size=1, activation_checkpointing="on", tp=2, cp=1)
    totals = {}
    for images in (0, 16, 64):
        result = plan("Qwen/Qwen2.5-VL-7B-Instruct", "8xH100", images_per_sample=images, **options)
        (cand,) = [c for c in result.candidates if c.mesh is not None and (c.mesh.tp, c.mesh.cp, c.mesh.pp) == (2, 1, 1)]
        totals[images] = cand.memory_bytes.total
    assert totals[0] < totals[16] < totals[64]


def test_context_parallelism_is_neither_searched_nor_accepted_with_images(capsys):
    """Issue 21: the planner recommended dp_shard 2 x cp 4 for Qwen2.5-VL-7B with 4 images at seq 65,536, a mesh
    wrap() cannot run (transformers checks the image placeholders in input_ids against the features, and CP
    shards input_ids before the model). Searched meshes have cp 1 with images; a pinned --cp is exit 2."""
    from tests.cli._main import run_main

    job = dict(image_size=448, images_per_sample=4, seq_len=65_536)
    result = plan("Qwen/Qwen2.5-VL-7B-Instruct", "8xH100", **job)
    assert result.recommendation is None or result.recommendation.mesh is None or result.recommendation.mesh.cp == 1
    assert "no cp: context parallelism cannot shard" in " ".join(result.why)
    text_only = plan("Qwen/Qwen2.5-VL-7B-Instruct", "8xH100", seq_len=65_536)
    assert text_only.recommendation.mesh is not None and text_only.recommendation.mesh.cp > 1  # no images: CP runs
    code, _, err = run_main(["plan", "-m", "Qwen/Qwen2.5-VL-7B-Instruct", "-g", "8xH100", "--image-size", "448",
                             "--images-per-sample", "4", "--cp", "2"], capsys)
    assert code == 2 and "--cp 2 cannot run with images" in err and len(err.strip().splitlines()) == 1

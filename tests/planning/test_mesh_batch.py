"""A mesh keeps the asked global batch (micro-batch x data-parallel ranks x accumulation = global batch)
or is not a candidate, with the reason; never a step of fewer samples than asked."""

from __future__ import annotations

import pytest

from advisor.hardware.cluster import parse_gpus
from advisor.mesh import ParallelDims
from advisor.model.sources import resolve_model
from advisor.planning.api import plan
from advisor.planning.candidates import evaluate_candidate
from advisor.training import TrainingConfig
from tests.cli._main import run_main


def test_no_mesh_divides_16_samples_into_micro_batches_of_3(capsys):
    """16 = 3 x dp x accumulation has no solution for dp in {4, 2, 1} (3 x 4 = 12, 3 x 2 = 6, 3 x 1 = 3
    samples a micro-step): refused, one line, exit 2. Before, dp_shard 4 x cp 2 was recommended at 12 a step."""
    with pytest.raises(ValueError, match=r"micro-batch 3 x the data-parallel ranks of any mesh tried \(dp 4: 12, "
                                         r"dp 2: 6, dp 1: 3 samples"):
        plan("Qwen/Qwen2.5-0.5B", "8xH100", global_batch_size=16, micro_batch_size=3)
    code, out, err = run_main(["plan", "-m", "Qwen/Qwen2.5-0.5B", "-g", "8xH100", "--global-batch", "16",
                               "--micro-batch", "3"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--global-batch 16" in err, (out, err)


def test_every_mesh_candidate_keeps_24_samples_a_step():
    """24 samples at micro-batch 4 on 8 GPUs: data parallelism takes 32 a micro-step (blocked); a mesh with
    dp 4 takes 16 (24 is not a multiple: not a candidate), dp 2 takes 8 (3 micro-steps), dp 1 takes 4 (6)."""
    p = plan("Qwen/Qwen2.5-0.5B", "8xH100", global_batch_size=24, micro_batch_size=4)
    meshes = [c for c in p.candidates if c.mesh is not None]
    assert meshes and {c.mesh.dp for c in meshes} == {2, 1}
    assert {(c.mesh.dp, c.gradient_accumulation_steps) for c in meshes} == {(2, 3), (1, 6)}
    rec = p.recommendation
    assert rec.micro_batch_size * rec.mesh.dp * rec.gradient_accumulation_steps == 24
    assert "24 samples are not a whole number of micro-steps of micro-batch 4 x 8 GPUs (32 samples)" in p.why[0]


def test_a_mesh_that_would_round_the_batch_down_is_unavailable():
    spec = resolve_model("Qwen/Qwen2.5-0.5B")
    mesh = ParallelDims(dp_shard=4, cp=2, world_size=8)
    cand = evaluate_candidate(spec, parse_gpus("8xH100"), TrainingConfig(global_batch_size=16, micro_batch_size=3),
                              "zero3", mesh)
    assert not cand.available and not cand.fits
    assert cand.unavailable_reason == ("--global-batch 16 is not a multiple of micro-batch 3 x 4 data-parallel "
                                       "ranks (12 samples a micro-step)")

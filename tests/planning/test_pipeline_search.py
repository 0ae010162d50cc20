"""Pipeline and expert meshes in the search: when they join, the pins, the per-stage peaks, the 'why'."""

from __future__ import annotations

import json

import pytest

from advisor.hardware.cluster import parse_gpus
from advisor.mesh import ParallelDims
from advisor.model.sources import resolve_model
from advisor.planning.api import plan
from advisor.planning.pipeline_meshes import evaluate_pipeline_meshes, expert_share, pipeline_meshes
from advisor.training import TrainingConfig
from advisor.units import GIB
from tests.cli._main import run_main


@pytest.mark.parametrize("args, message", [
    (["--model", "meta-llama/Llama-3.1-8B", "--gpus", "8xH100", "--pp", "3"],
     "--pp 3 does not divide the model's 32 layers"),
    (["--model", "mistralai/Mixtral-8x7B-v0.1", "--gpus", "8xH100", "--ep", "3"],
     "--ep 3 does not divide the model's 8 experts"),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpus", "8xH100", "--ep", "2"], "needs a mixture-of-experts model"),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpus", "8xH100", "--pp", "2", "--virtual-stages", "2"],
     "virtual stages 2 need an interleaved schedule"),
    (["--model", "mistralai/Mixtral-8x7B-v0.1", "--gpus", "8xH100", "--tp", "4", "--ep", "4"],
     "ep 4 must divide dp_shard 2 x cp 1 = 2"),
])
def test_bad_degrees_exit_2_with_one_line(capsys, args, message):
    code, out, err = run_main(["plan", *args], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_plans_without_pp_or_ep_keep_their_json_keys(capsys):
    code, out, _ = run_main(["plan", "--model", "meta-llama/Llama-3.1-8B", "--gpus", "8xH100", "--seq-len",
                             "131072", "--json"], capsys)
    doc = json.loads(out)
    meshes = [c for c in doc["candidates"] if c.get("mesh")]
    assert code == 0 and meshes and not any("stage_peaks" in c for c in doc["candidates"])
    assert not any("pp" in c["mesh"] or "ep" in c["mesh"] for c in meshes)


def test_search_offers_pipeline_stages_at_every_tp_of_the_node_with_uneven_splits():
    """405B: 128 query and 8 key/value heads, so tp 1, 2, 4 and 8 divide the node and the heads; 126 layers,
    so pp 2 splits evenly and pp 4, 8, 16 unevenly; 126 is not a multiple of pp x 2: no interleaved mesh
    (wrap_pipeline splits two chunks a rank evenly only)."""
    spec = resolve_model("meta-llama/Llama-3.1-405B")
    meshes = pipeline_meshes(spec, parse_gpus("16x8xH100"), TrainingConfig(seq_len=8192))
    assert [(m.pp, m.tp, m.dp_shard) for m in meshes] == [
        (q, t, 128 // (q * t)) for t in (1, 2, 4, 8) for q in (2, 4, 8, 16) if 128 // (q * t) >= 1]
    assert {m.pp_schedule for m in meshes} == {"1f1b"}
    assert all(sum(m.stage_layers(126)) == 126 for m in meshes)
    assert next(m for m in meshes if (m.pp, m.tp) == (8, 8)).pp_layers == (15, 16, 16, 16, 16, 16, 16, 15)


def test_interleaved_is_offered_where_pp_x_2_divides_the_layers():
    """Qwen2.5-7B: 28 layers, 28 heads and 4 key/value heads (tp 1, 2, 4 on an 8-GPU node): interleaved 1F1B
    (two chunks a rank) at pp 2 only (28 = 2 x 2 x 7; 4 x 2 and 8 x 2 do not divide 28)."""
    spec = resolve_model("Qwen/Qwen2.5-7B")
    meshes = pipeline_meshes(spec, parse_gpus("8xH100"), TrainingConfig())
    interleaved = [(m.pp, m.tp, m.virtual_stages) for m in meshes if m.pp_schedule == "interleaved_1f1b"]
    assert interleaved == [(2, 1, 2), (2, 2, 2), (2, 4, 2)]
    assert sorted({m.tp for m in meshes}) == [1, 2, 4]


def _mesh(pp, tp, schedule="1f1b"):
    return ParallelDims(pp=pp, tp=tp, dp_shard=64 // (pp * tp), pp_schedule=schedule,
                        virtual_stages=2 if schedule == "interleaved_1f1b" else 1, world_size=64)


class _Fits:
    def __init__(self, fits):
        self.fits = fits


def test_the_search_skips_meshes_a_misfit_dominates():
    """1F1B fits at (pp 2, tp 8), (pp 4, tp 8), (pp 4, tp 4); interleaved at (pp 2, tp 8). Skipped (never
    evaluated): 1F1B (pp 2, tp 2) once (pp 2, tp 4) did not fit (dense: the stage grows as 1/tp); the
    interleaved twins of 1F1B meshes that do not fit ((2, 4), (2, 2), (4, 2)); interleaved (pp 4, tp 4) once
    interleaved (pp 4, tp 8) did not fit. Pinned degrees: every mesh."""
    fitting = {(2, 8, "1f1b"), (4, 8, "1f1b"), (4, 4, "1f1b"), (2, 8, "interleaved_1f1b")}
    meshes = [_mesh(q, t, s) for t in (2, 4, 8) for q in (2, 4) for s in ("1f1b", "interleaved_1f1b")]
    asked = []

    def evaluate(m):
        asked.append((m.pp, m.tp, m.pp_schedule))
        return [_Fits((m.pp, m.tp, m.pp_schedule) in fitting)]

    out = evaluate_pipeline_meshes(meshes, evaluate, dense=True)
    assert asked == [(2, 8, "1f1b"), (4, 8, "1f1b"), (2, 4, "1f1b"), (4, 4, "1f1b"), (4, 2, "1f1b"),
                     (2, 8, "interleaved_1f1b"), (4, 8, "interleaved_1f1b")]
    assert len(out) == len(asked)
    asked.clear()
    evaluate_pipeline_meshes(meshes, evaluate, dense=True, prune=False)
    assert len(asked) == len(meshes)
    asked.clear()
    evaluate_pipeline_meshes(meshes, evaluate, dense=False)  # MoE: ep changes with tp, so every tp is tried
    assert (2, 2, "1f1b") in asked and (2, 4, "interleaved_1f1b") not in asked


def test_405b_fastest_shows_every_stage_and_why_pp_loses():
    result = plan("meta-llama/Llama-3.1-405B", "16x8xH100", seq_len=8192, policy="fastest")
    staged = [c for c in result.candidates if c.stage_peaks]
    assert {c.mesh.pp for c in staged} == {2, 4, 8, 16}
    for c in staged:  # the worst stage decides the fit
        assert len(c.stage_peaks) == c.mesh.pp and max(c.stage_peaks) == c.memory_bytes.total
    assert result.recommendation.mesh.pp == 1
    assert any(line.startswith("Pipeline/expert meshes searched (policy fastest") for line in result.why)


def test_mixtral_on_8_h100_has_no_gpu_only_plan_and_says_why_in_numbers():
    """Routed experts are 97% of Mixtral-8x7B; sharded over all 8 GPUs its states alone are
    46,702,792,704 x (4 + 4 + 8) bytes / 8 = 93,405,585,408 bytes = 87.0 GiB > 79.2 GiB, whatever ep."""
    spec = resolve_model("mistralai/Mixtral-8x7B-v0.1")
    assert expert_share(spec) > 0.95
    result = plan("mistralai/Mixtral-8x7B-v0.1", "8xH100")
    assert result.recommendation.strategy == "zero3_offload"
    assert any(c.mesh is not None and c.mesh.ep == 8 for c in result.candidates)
    line = next(line for line in result.why if line.startswith("No GPU-only mesh fits"))
    assert "model states alone (parameters, gradients, optimizer) are 87.0 GiB" in line
    assert 46_702_792_704 * 16 // 8 == 93_405_585_408 and round(93_405_585_408 / GIB, 1) == 87.0


def test_pinned_pipeline_and_experts_on_deepseek_v3():
    result = plan("deepseek-ai/DeepSeek-V3", "32x8xH100", pp=16, ep=16, pp_schedule="1f1b", pp_layers=(3,) + (4,) * 14 + (2,))
    rec = result.recommendation
    assert rec is not None and (rec.mesh.pp, rec.mesh.ep) == (16, 16)
    chosen = next(c for c in result.candidates if c.mesh == rec.mesh and c.fits)
    assert len(chosen.stage_peaks) == 16 and max(chosen.stage_peaks) == chosen.memory_bytes.total
    assert any(line.startswith("per-stage peaks (GiB, rank 0 first)") for line in result.why)
    assert any(line.startswith("pp 16 ") for line in result.why)  # what the degree buys


def test_the_parallelism_docs_figures():
    """docs/parallelism.md quotes these plans (tests/test_readme.py runs its commands for their exit codes)."""
    from advisor.planning.api import plan

    titan = plan("meta-llama/Llama-3.1-405B", "16x8xH100", seq_len=8192)
    assert titan.recommendation.mesh.label == "dp_shard 16 x cp 2 x tp 4"
    fastest = plan("meta-llama/Llama-3.1-405B", "16x8xH100", seq_len=8192, policy="fastest")
    assert fastest.recommendation.mesh.pp == 1 and not any(c.fits for c in fastest.candidates if c.mesh and c.mesh.pp > 1)
    deepseek = plan("deepseek-ai/DeepSeek-V3", "32x8xH100").recommendation
    assert deepseek.mesh.label == "dp_shard 256 (ep 8)"
    mixtral = plan("mistralai/Mixtral-8x7B-v0.1", "8xH100")
    assert mixtral.recommendation.strategy == "zero3_offload" and "--gpus 2x8xH100" in mixtral.why[0]
    # zero3 at micro-batch 1: wrap()'s experts on dim 1 (recipe torch) against plain fully_shard's dim 0 (trainer).
    for gpus, on_dim1, on_dim0 in (("2x8xH100", 75.8, 116.3), ("8x8xH100", 48.5, 167.2)):
        for recipe, gib in (("torch", on_dim1), ("trainer", on_dim0)):
            zero3 = plan("mistralai/Mixtral-8x7B-v0.1", gpus, strategy="zero3", micro_batch_size=1,
                         activation_checkpointing="off", recipe=recipe).candidate("zero3")
            assert round(zero3.memory_bytes.total / GIB, 1) == gib, (gpus, recipe)

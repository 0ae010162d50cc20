"""wrap(compile=True) on a device mesh, for real: 2 gloo ranks on CPU, the blocks compiled by inductor, one AdamW
step against one process training eagerly on the whole batch (tests/wrappers/_dist.py's workload).

FSDP2 (dp_shard 2) compiles each block after checkpointing and before ``fully_shard`` and trains as the eager
reference does (atol 1e-5: the tolerance test_mesh_wrap.py works out for 3 steps; one step moves a parameter by at
most lr = 2e-3). HSDP (2 replicas of 1 shard) compiles the same blocks before the same call on another mesh and
trained so too; it is left out for CI's time (its inductor compile took 39 s of a worker; test_mesh_wrap.py trains
HSDP eagerly). A TP mesh is refused with one line, and the reason is kept here as a finding: with the guard lifted,
TP 2 compiled trains every block weight as the reference does but leaves the embedding without a gradient (AdamW's
first step then moves it by 0 where the reference moves it by lr), measured on torch 2.13.0+cpu; it is measured again
on any other torch (.ci/drift with DRIFT_TORCH), where it may have changed, and not on 2.13.0 (43 s of compile).
"""

from __future__ import annotations

import pytest
import torch
from tests.wrappers._dist import (
    GLOBAL_BATCH, build_adamw, global_batch, launch_env, reference_params, run_scenarios, tiny_llama, train_steps,
)
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import DataLoader

from advisor.mesh import ParallelDims
from wrappers import wrap

MESHES = {"fsdp2": ParallelDims(dp_shard=2, world_size=2), "tp2": ParallelDims(tp=2, world_size=2)}
FINDING_TORCH = "2.13.0"  # the release the TP finding was measured on
REMEASURE = torch.__version__.split("+")[0] != FINDING_TORCH


def _trained(rank: int, world_size: int, kind: str, lift_guard: bool) -> dict:
    if lift_guard:  # the finding behind the guard: apply the compile it refuses
        import wrappers.parallelize as parallelize
        parallelize.mesh_compile_problem = lambda dims: None
    dims = MESHES[kind]
    model = tiny_llama()
    loader = DataLoader(list(global_batch(0)), batch_size=GLOBAL_BATCH // dims.dp)
    try:
        model, optimizer, loader = wrap(model, build_adamw(model), loader, mesh=dims,
                                        env=launch_env(rank, world_size), verbose=False, compile=True)
    except ValueError as err:
        return {"refused": str(err)}
    compiled = [block._compiled_call_impl is not None for block in model.model.layers]
    train_steps(model, optimizer, [global_batch(0)[list(loader.sampler)]])
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {"compiled": compiled, "params": {name: value.detach().clone() for name, value in full.items()}}


@pytest.fixture(scope="module")
def runs():
    scenarios = {kind: (_trained, kind, False) for kind in MESHES}
    if REMEASURE:
        scenarios["tp2_unguarded"] = (_trained, "tp2", True)
    return run_scenarios(scenarios, world_size=2, timeout_s=300)


def _diffs(params: dict, reference: dict) -> dict[str, float]:
    return {name: (value - reference[name]).abs().max().item() for name, value in params.items()}


def test_compiled_blocks_train_as_eager_on_one_process(runs):
    got = runs.values("fsdp2")[0]
    assert got["compiled"] == [True, True]
    diffs = _diffs(got["params"], reference_params(1))
    assert max(diffs.values()) < 1e-5, {name: d for name, d in diffs.items() if d >= 1e-5}


def test_tp_mesh_compile_is_refused_in_one_line(runs):
    message = runs.values("tp2")[0]["refused"]
    assert "\n" not in message and "tp > 1" in message and "tp = cp = 1" in message


@pytest.mark.skipif(not REMEASURE, reason=f"measured on torch {FINDING_TORCH}: re-measured on another release")
def test_finding_tp_compiled_blocks_leave_the_embedding_without_a_gradient(runs):
    """If this fails after a torch upgrade, compiled TP may work now: drop tp from mesh_compile_problem."""
    got = runs.values("tp2_unguarded")[0]
    diffs = _diffs(got["params"], reference_params(1))
    assert max(d for name, d in diffs.items() if name != "model.embed_tokens.weight") < 1e-5
    assert diffs["model.embed_tokens.weight"] == pytest.approx(2e-3, rel=1e-3)  # one step's lr: no gradient there

"""Checkpoints reload through our loader and through the consumer's own (``torch.load``, DCP).

The per-strategy round trips on 2 ranks live in ``test_strategies.py``; here: one process without a
process group, and a ZeRO-3 checkpoint written by 2 ranks read back by a single plain process. The
module's 2-rank scenarios run once, in one pair of gloo processes (``gloo_runs`` below); each test
asserts its own.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from tests.wrappers._dist import ScenarioResults, build_adamw, global_batch, run_scenarios, tiny_llama

from wrappers.checkpoint_io import load_checkpoint, save_checkpoint
from wrappers.recipe import Recipe, apply_recipe


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    ids = global_batch(step)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.parametrize("sharded", [False, True], ids=["consolidated", "sharded"])
def test_round_trip_in_one_process(tmp_path, sharded):
    model, fresh = tiny_llama(0), tiny_llama(1)
    optimizer, fresh_optimizer = build_adamw(model), build_adamw(fresh)
    _step(model, optimizer, 0)
    path = tmp_path / ("ckpt" if sharded else "ckpt.pt")
    save_checkpoint(model, path, sharded=sharded, optimizer=optimizer)
    load_checkpoint(fresh, path, sharded=sharded, optimizer=fresh_optimizer)
    torch.testing.assert_close(fresh.state_dict(), model.state_dict(), rtol=0, atol=0)
    _step(model, optimizer, 1)
    _step(fresh, fresh_optimizer, 1)
    torch.testing.assert_close(fresh.state_dict(), model.state_dict(), rtol=0, atol=0)


def test_consolidated_file_is_a_plain_torch_save(tmp_path):
    model = tiny_llama()
    save_checkpoint(model, tmp_path / "ckpt.pt", sharded=False)
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    other = tiny_llama(1)
    other.load_state_dict(state["model"])
    torch.testing.assert_close(other.state_dict(), model.state_dict(), rtol=0, atol=0)


def test_missing_checkpoint_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no consolidated checkpoint"):
        load_checkpoint(tiny_llama(), tmp_path / "absent.pt", sharded=False)
    save_checkpoint(tiny_llama(), tmp_path / "model_only.pt", sharded=False)
    with pytest.raises(ValueError, match="optimizer"):
        model = tiny_llama()
        load_checkpoint(model, tmp_path / "model_only.pt", sharded=False, optimizer=build_adamw(model))


def _save_zero3_worker(rank: int, world_size: int, tmp_dir: str) -> None:
    applied = apply_recipe(tiny_llama(0), Recipe(strategy="zero3"), device="cpu")
    save_checkpoint(applied.model, f"{tmp_dir}/sharded", sharded=True)
    save_checkpoint(applied.model, f"{tmp_dir}/consolidated.pt", sharded=False)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP's own loader, one process
def test_zero3_checkpoints_from_two_ranks_load_in_one_plain_process(gloo_runs, gloo_dirs):
    gloo_runs.check("zero3_save")
    tmp_path = gloo_dirs["zero3_save"]
    expected = tiny_llama(0).state_dict()
    from_dcp = tiny_llama(1)
    with pytest.warns(UserWarning, match="RNG states were saved by 2 ranks and load on 1"):
        load_checkpoint(from_dcp, tmp_path / "sharded", sharded=True)
    torch.testing.assert_close(from_dcp.state_dict(), expected, rtol=0, atol=0)
    state = {"model": tiny_llama(1).state_dict()}
    dcp.load(state, checkpoint_id=tmp_path / "sharded", no_dist=True)  # DCP's own loader, no wrappers code
    torch.testing.assert_close(state["model"], expected, rtol=0, atol=0)
    from_file = tiny_llama(1)
    from_file.load_state_dict(torch.load(tmp_path / "consolidated.pt", weights_only=True)["model"])
    torch.testing.assert_close(from_file.state_dict(), expected, rtol=0, atol=0)


# --- Resuming: RNG state and the layout read from disk -----------------------------------------------


def _dropout_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(32, 1))


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _noisy_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
    """Inputs from Python's and NumPy's generators, dropout from torch's: a resume must restore all three."""
    x = torch.full((4, 8), random.random()) + torch.from_numpy(np.random.rand(4, 8)).float()
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def _build_dropout(seed: int, strategy: str | None) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = _dropout_model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if strategy is None:
        return model, optimizer
    applied = apply_recipe(model, Recipe(strategy=strategy), device="cpu", optimizer=optimizer)
    return applied.model, applied.optimizer


def _resume(rank: int, world_size: int, tmp_dir: str, save_sharded: bool | None, strategy: str | None) -> None:
    """Train 2 steps, save, train 3 more; then a fresh model (other RNG states) loads and trains 3."""
    model, optimizer = _build_dropout(0, strategy)
    _seed_everything(100 + rank)  # every rank draws differently: each must get its own state back
    for _ in range(2):
        _noisy_step(model, optimizer)
    path = Path(tmp_dir) / "ckpt"
    save_checkpoint(model, path, sharded=save_sharded, optimizer=optimizer)
    uninterrupted = [_noisy_step(model, optimizer) for _ in range(3)]
    _seed_everything(999)
    resumed, resumed_optimizer = _build_dropout(1, strategy)
    load_checkpoint(resumed, path, optimizer=resumed_optimizer)  # the README's call: layout read from disk
    assert [_noisy_step(resumed, resumed_optimizer) for _ in range(3)] == uninterrupted


@pytest.mark.parametrize("sharded", [False, True], ids=["consolidated", "sharded"])
def test_resume_with_dropout_repeats_the_losses_in_one_process(tmp_path, sharded):
    _resume(0, 1, str(tmp_path), sharded, None)
    assert (tmp_path / "ckpt").is_dir() == sharded


RESUMES = {"ddp": False, "zero3": None}  # strategy: save_sharded (zero3 left to the default)


@pytest.fixture(scope="module")
def gloo_dirs(tmp_path_factory) -> dict[str, Path]:
    """One folder per 2-rank scenario of this module."""
    return {name: tmp_path_factory.mktemp(name) for name in ["zero3_save", *(f"resume_{s}" for s in RESUMES)]}


@pytest.fixture(scope="module")
def gloo_runs(gloo_dirs) -> ScenarioResults:
    """The module's 2-rank scenarios, run once in one pair of gloo processes."""
    scenarios = {"zero3_save": (_save_zero3_worker, str(gloo_dirs["zero3_save"]))}
    for strategy, save_sharded in RESUMES.items():
        scenarios[f"resume_{strategy}"] = (_resume, str(gloo_dirs[f"resume_{strategy}"]), save_sharded, strategy)
    return run_scenarios(scenarios)


@pytest.mark.parametrize("strategy, save_sharded", list(RESUMES.items()), ids=["ddp", "zero3-default"])
def test_resume_with_dropout_repeats_the_losses_on_two_ranks(gloo_runs, gloo_dirs, strategy, save_sharded):
    gloo_runs.check(f"resume_{strategy}")
    tmp_path = gloo_dirs[f"resume_{strategy}"]
    # zero3 left to the default: an FSDP2 model saves sharded, one file per rank's RNG state
    assert (tmp_path / "ckpt").is_dir() == (strategy == "zero3")


def test_load_without_sharded_reads_the_layout_on_disk(tmp_path):
    model = tiny_llama(0)
    save_checkpoint(model, tmp_path / "file.pt")  # a plain model: consolidated by default
    save_checkpoint(model, tmp_path / "dir", sharded=True)
    assert (tmp_path / "file.pt").is_file() and (tmp_path / "dir").is_dir()
    for name in ("file.pt", "dir"):
        fresh = tiny_llama(1)
        load_checkpoint(fresh, tmp_path / name)
        torch.testing.assert_close(fresh.state_dict(), model.state_dict(), rtol=0, atol=0)


def test_stateless_optimizer_round_trips_consolidated(tmp_path):
    """Plain SGD keeps no state; its learning rate (changed by a schedule, say) is what comes back."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    optimizer.param_groups[0]["lr"] = 0.05
    save_checkpoint(model, tmp_path / "ckpt.pt", optimizer=optimizer)
    fresh = torch.nn.Linear(2, 2)
    fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.1)
    load_checkpoint(fresh, tmp_path / "ckpt.pt", optimizer=fresh_optimizer)
    assert fresh_optimizer.param_groups[0]["lr"] == 0.05
    torch.testing.assert_close(fresh.state_dict(), model.state_dict(), rtol=0, atol=0)

"""Checkpoints reload through our loader and through the consumer's own (``torch.load``, DCP).

The per-strategy round trips on 2 ranks live in ``test_strategies.py``; here: one process without a
process group, and a ZeRO-3 checkpoint written by 2 ranks read back by a single plain process.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from tests.wrappers._dist import build_adamw, global_batch, run_distributed, tiny_llama

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
def test_zero3_checkpoints_from_two_ranks_load_in_one_plain_process(tmp_path):
    run_distributed(_save_zero3_worker, str(tmp_path))
    expected = tiny_llama(0).state_dict()
    from_dcp = tiny_llama(1)
    load_checkpoint(from_dcp, tmp_path / "sharded", sharded=True)
    torch.testing.assert_close(from_dcp.state_dict(), expected, rtol=0, atol=0)
    state = {"model": tiny_llama(1).state_dict()}
    dcp.load(state, checkpoint_id=tmp_path / "sharded", no_dist=True)  # DCP's own loader, no wrappers code
    torch.testing.assert_close(state["model"], expected, rtol=0, atol=0)
    from_file = tiny_llama(1)
    from_file.load_state_dict(torch.load(tmp_path / "consolidated.pt", weights_only=True)["model"])
    torch.testing.assert_close(from_file.state_dict(), expected, rtol=0, atol=0)

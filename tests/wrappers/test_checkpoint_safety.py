"""A checkpoint directory runs nothing it holds, a save never destroys the previous checkpoint or a
user's file (issue 21, items 11 and 12). One process, no process group."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from tests.wrappers._dist import build_adamw, global_batch, tiny_llama

import wrappers.checkpoint_io as checkpoint_io
from wrappers.checkpoint_files import MANIFEST, file_digest
from wrappers.checkpoint_io import load_checkpoint, save_checkpoint


class _Payload:
    """Pickles as a call to ``os.mkdir(marker)``: proof that loading ran code from the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (str(self.marker),)


def _crafted_directory(tmp_path: Path, *, forge_manifest: bool) -> tuple[Path, Path]:
    directory, marker = tmp_path / "ckpt", tmp_path / "code-ran"
    directory.mkdir()
    (directory / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    if forge_manifest:  # the attacker also writes a manifest whose hashes match the crafted file
        size, sha = file_digest(directory / ".metadata")
        manifest = {"format": "dp-advisor checkpoint manifest 1", "world_size": 1,
                    "files": {".metadata": {"bytes": size, "sha256": sha}}}
        (directory / MANIFEST).write_text(json.dumps(manifest))
    return directory, marker


def test_a_crafted_metadata_alone_is_refused_before_it_is_read(tmp_path):
    directory, marker = _crafted_directory(tmp_path, forge_manifest=False)
    with pytest.raises(ValueError, match="not a checkpoint written by save_checkpoint"):
        load_checkpoint(tiny_llama(), directory)
    assert not marker.exists()


def test_a_forged_manifest_still_runs_nothing(tmp_path):
    directory, marker = _crafted_directory(tmp_path, forge_manifest=True)
    with pytest.raises(ValueError, match="not DCP checkpoint metadata"):
        load_checkpoint(tiny_llama(), directory, sharded=True)
    assert not marker.exists()


def test_a_changed_shard_is_refused(tmp_path):
    save_checkpoint(tiny_llama(0), tmp_path / "ckpt", sharded=True)
    shard = next((tmp_path / "ckpt").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="differ from the manifest"):
        load_checkpoint(tiny_llama(1), tmp_path / "ckpt")


def test_the_manifest_lists_every_file_with_its_hash(tmp_path):
    model = tiny_llama(0)
    save_checkpoint(model, tmp_path / "ckpt", sharded=True, optimizer=build_adamw(model))
    listed = json.loads((tmp_path / "ckpt" / MANIFEST).read_text())["files"]
    on_disk = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name != MANIFEST)
    assert sorted(listed) == on_disk and ".metadata" in listed and "rng_rank0.pt" in listed
    for name, entry in listed.items():
        assert file_digest(tmp_path / "ckpt" / name) == (entry["bytes"], entry["sha256"])
    assert not list(tmp_path.glob(".ckpt.*"))  # nothing left aside


@pytest.mark.parametrize("sharded", [False, True], ids=["consolidated", "sharded"])
def test_a_users_file_is_never_replaced(tmp_path, sharded):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    with pytest.raises(FileExistsError, match="not a checkpoint written by save_checkpoint"):
        save_checkpoint(tiny_llama(), notes, sharded=sharded)
    assert notes.read_text() == "my notes"
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "train.py").write_text("print()")
    with pytest.raises(FileExistsError, match="train.py"):
        save_checkpoint(tiny_llama(), folder, sharded=sharded)
    assert (folder / "train.py").read_text() == "print()"


def test_a_link_is_not_followed(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("kept")
    (tmp_path / "link.pt").symlink_to(target)
    with pytest.raises(FileExistsError, match="symbolic link"):
        save_checkpoint(tiny_llama(), tmp_path / "link.pt", sharded=False)
    assert target.read_text() == "kept"


def _trained(seed: int) -> torch.nn.Module:
    model = tiny_llama(seed)
    ids = global_batch(0)
    model(input_ids=ids, labels=ids).loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    return model


@pytest.mark.parametrize("sharded", [False, True], ids=["consolidated", "sharded"])
def test_a_save_that_dies_leaves_the_previous_checkpoint_whole(tmp_path, sharded, monkeypatch):
    """The re-save fails after writing part of its files (as a SIGKILL would stop it); the previous
    checkpoint still loads, with the previous weights."""
    path = tmp_path / ("ckpt" if sharded else "ckpt.pt")
    old = tiny_llama(0)
    save_checkpoint(old, path, sharded=sharded)
    real_save = torch.save

    def dies_half_way(obj, f, *args, **kwargs):
        real_save({"model": {}, "rng": None}, f)  # something on disk, then the process is gone
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint_io.torch, "save", dies_half_way)
    with pytest.raises(BaseException):  # noqa: B017 (DCP wraps what its writer raised)
        save_checkpoint(_trained(0), path, sharded=sharded)
    monkeypatch.setattr(checkpoint_io.torch, "save", real_save)
    fresh = tiny_llama(1)
    load_checkpoint(fresh, path, sharded=sharded)
    torch.testing.assert_close(fresh.state_dict(), old.state_dict(), rtol=0, atol=0)
    assert not list(tmp_path.glob(".ckpt*"))  # the partial save was cleaned up


@pytest.mark.parametrize("sharded", [False, True], ids=["consolidated", "sharded"])
def test_a_checkpoint_is_replaced_by_the_next_save(tmp_path, sharded):
    path = tmp_path / ("ckpt" if sharded else "ckpt.pt")
    save_checkpoint(tiny_llama(0), path, sharded=sharded)
    new = _trained(0)
    save_checkpoint(new, path, sharded=sharded)
    fresh = tiny_llama(1)
    load_checkpoint(fresh, path, sharded=sharded)
    torch.testing.assert_close(fresh.state_dict(), new.state_dict(), rtol=0, atol=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_save_killed_between_its_renames_is_named_on_load(tmp_path, monkeypatch):
    """Replacing a directory takes two renames; killed between them, the old checkpoint is aside and the
    loader says where."""
    old = tiny_llama(0)
    save_checkpoint(old, tmp_path / "ckpt", sharded=True)
    real_rename, calls = os.rename, []

    def killed_after_moving_the_old_aside(src, dst):
        real_rename(src, dst)
        if ".ckpt.old-" in str(dst):
            calls.append(dst)
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "rename", killed_after_moving_the_old_aside)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(_trained(0), tmp_path / "ckpt", sharded=True)
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"left the previous checkpoint at .*\.ckpt\.old-"):
        load_checkpoint(tiny_llama(1), tmp_path / "ckpt")
    os.rename(calls[0], tmp_path / "ckpt")
    fresh = tiny_llama(1)
    load_checkpoint(fresh, tmp_path / "ckpt")
    torch.testing.assert_close(fresh.state_dict(), old.state_dict(), rtol=0, atol=0)


# -- fuzz: a damaged or forged directory is refused or loads exactly what was saved; it never runs code -------

import shutil  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _linear(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 3)


@st.composite
def _damage(draw):
    kind = draw(st.sampled_from(["flip", "truncate", "drop", "add", "manifest", "payload"]))
    return kind, draw(st.integers(min_value=0, max_value=10**6)), draw(st.binary(max_size=64))


@settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(_damage())
def test_a_damaged_checkpoint_is_refused_or_exact(tmp_path_factory, damage):
    root = tmp_path_factory.mktemp("fuzz")
    saved = _linear(0)
    save_checkpoint(saved, root / "ckpt", sharded=True)
    directory, marker = root / "ckpt", root / "code-ran"
    names = sorted(p.name for p in directory.iterdir())
    kind, number, blob = damage
    victim = directory / names[number % len(names)]
    if kind == "flip":
        data = bytearray(victim.read_bytes())
        data[number % len(data)] ^= 1 << (number % 8)
        victim.write_bytes(bytes(data))
    elif kind == "truncate":
        victim.write_bytes(victim.read_bytes()[: number % max(victim.stat().st_size, 1)])
    elif kind == "drop":
        victim.unlink()
    elif kind == "add":
        (directory / "__9_0.distcp").write_bytes(blob)
    elif kind == "manifest":  # forge: the payload as .metadata, the manifest rewritten to match it
        (directory / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
        manifest = json.loads((directory / MANIFEST).read_text())
        size, sha = file_digest(directory / ".metadata")
        manifest["files"][".metadata"] = {"bytes": size, "sha256": sha}
        (directory / MANIFEST).write_text(json.dumps(manifest))
    else:  # the payload pickled into a shard, manifest untouched
        victim = next(directory.glob("*.distcp"))
        victim.write_bytes(pickle.dumps(_Payload(marker)))
    fresh = _linear(1)
    try:
        load_checkpoint(fresh, directory, sharded=True)
    except ValueError:
        pass
    else:
        torch.testing.assert_close(fresh.state_dict(), saved.state_dict(), rtol=0, atol=0)
    assert not marker.exists()
    shutil.rmtree(root)


@pytest.mark.parametrize("saved_with, loaded_into", [("sgd", "adamw"), ("adamw", "sgd")])
def test_an_optimizer_checkpoint_of_another_class_is_refused(tmp_path, saved_with, loaded_into):
    """An SGD checkpoint loaded into AdamW used to copy SGD's groups over AdamW's: lr 0.5 (issue 21, item 10)."""
    build = {"sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.0),
             "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3)}
    model = _linear(0)
    optimizer = build[saved_with](model)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    save_checkpoint(model, tmp_path / "ckpt.pt", sharded=False, optimizer=optimizer)
    fresh = _linear(1)
    fresh_optimizer = build[loaded_into](fresh)
    with pytest.raises(ValueError, match=f"not a {type(fresh_optimizer).__name__}"):
        load_checkpoint(fresh, tmp_path / "ckpt.pt", optimizer=fresh_optimizer)
    assert fresh_optimizer.param_groups[0]["lr"] == (1e-3 if loaded_into == "adamw" else 0.5)

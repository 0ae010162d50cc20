"""Writing exports: never clobber without force, never a directory, never a half-written file."""

from __future__ import annotations

import os

import pytest

from advisor.export import write as write_module
from advisor.export.write import write_export


def test_writes_and_returns_the_path(tmp_path):
    path = write_export(tmp_path / "a.yaml", "x: 1\n")
    assert path == tmp_path / "a.yaml" and path.read_text() == "x: 1\n"


def test_existing_file_is_not_overwritten_without_force(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("mine\n")
    with pytest.raises(ValueError, match="already exists; pass --force"):
        write_export(path, "x: 1\n")
    assert path.read_text() == "mine\n"
    write_export(path, "x: 1\n", force=True)
    assert path.read_text() == "x: 1\n"


def test_identical_content_is_not_an_overwrite(tmp_path):
    path = write_export(tmp_path / "a.yaml", "x: 1\n")
    before = path.stat().st_mtime_ns
    assert write_export(path, "x: 1\n") == path and path.stat().st_mtime_ns == before


def test_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is a directory"):
        write_export(tmp_path, "x: 1\n", force=True)


def test_missing_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        write_export(tmp_path / "nope" / "a.yaml", "x: 1\n")


def test_atomic_write_leaves_no_temporary_file(tmp_path):
    write_export(tmp_path / "a.yaml", "x: 1\n")
    write_export(tmp_path / "a.yaml", "x: 2\n", force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml"]


def test_failed_replace_keeps_the_old_file_and_removes_the_temporary(tmp_path, monkeypatch):
    path = tmp_path / "a.yaml"
    path.write_text("old\n")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(write_module.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_export(path, "new\n", force=True)
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml"]


def test_new_file_gets_ordinary_permissions(tmp_path):
    path = write_export(tmp_path / "a.yaml", "x: 1\n")
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask

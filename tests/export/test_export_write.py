"""Writing exports: never clobber without force, never a directory, never a half-written file."""

from __future__ import annotations

import os

import pytest

from advisor.export import write as write_module
from advisor.export.write import write_export, write_or_keep


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
    assert write_or_keep(path, "x: 1\n") == (path, False) and write_or_keep(path, "x: 2\n", force=True) == (path, True)


def test_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="names a directory"):
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


def _call_with_deadline(func, timeout_s: float = 10.0):
    """Run ``func`` in a thread; (finished, result or exception). A hang is reported, not waited out."""
    import threading

    outcome: list = []

    def run():
        try:
            outcome.append(func())
        except BaseException as err:  # noqa: BLE001 - handed back to the test
            outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(outcome), (outcome[0] if outcome else None)


def test_fifo_is_refused_without_opening_it(tmp_path):
    # Before the fix, the "already identical?" check read the FIFO and blocked until a writer came.
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    finished, result = _call_with_deadline(lambda: write_export(fifo, "x: 1\n", force=True))
    if not finished:  # unblock the reader so the thread can end, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert finished, "write_export blocked on a FIFO"
    assert isinstance(result, ValueError) and "not a regular file" in str(result) and "\n" not in str(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.yaml"]  # no temporary left behind


def test_device_is_refused(tmp_path):
    # Before the fix /dev/null read as an empty file that "already exists; pass --force"
    # (and --force then tried to replace the device node). Never called with force here.
    with pytest.raises(ValueError, match="not a regular file"):
        write_export("/dev/null", "x: 1\n")


def test_identical_check_reads_no_more_than_the_new_text(tmp_path, monkeypatch):
    path = tmp_path / "big.yaml"
    path.write_bytes(b"x: 1\n" + b"#" * 1_000_000)
    sizes = []
    real_open = open

    class Counting:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def read(self, size=-1):
            sizes.append(size)
            return self.handle.read(size)

    monkeypatch.setattr(write_module, "open", lambda *a, **k: Counting(real_open(*a, **k)), raising=False)
    with pytest.raises(ValueError, match="already exists"):
        write_export(path, "x: 1\n")
    assert sizes == [6]


def test_symlink_is_refused_and_left_alone(tmp_path):
    # /dev/stdout is a link to /proc/self/fd/1, a regular file when stdout is redirected; before the
    # fix, --force replaced the link itself with a plain file. Here: a link to a file, and one like /dev/stdout.
    real = tmp_path / "real.yaml"
    real.write_text("mine\n")
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    with open(tmp_path / "out.txt", "w") as handle:
        fd_link = tmp_path / "stdout"
        fd_link.symlink_to(f"/proc/self/fd/{handle.fileno()}")
        for path in (link, fd_link):
            with pytest.raises(ValueError, match="is a symbolic link"):
                write_export(path, "x: 1\n", force=True)
            assert path.is_symlink()
    assert real.read_text() == "mine\n"


@pytest.mark.parametrize("name", ["newdir/", ""])
def test_a_trailing_slash_or_an_empty_name_is_refused(tmp_path, monkeypatch, name):
    """``Path("newdir/")`` is ``newdir``: the slash is checked on the string (issue 21, item 18)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="names a directory" if name else "empty"):
        write_export(name, "text")
    assert list(tmp_path.iterdir()) == []


def test_a_chart_is_named_as_a_chart_not_as_an_export(tmp_path):
    """--chart / --timeline have no stdout: the refusals name a chart file and offer no '-o -' (they named
    accelerate_config.yaml and '-o - for stdout', which --chart refuses)."""
    folder = tmp_path / "x.svg"
    folder.mkdir()
    with pytest.raises(ValueError, match=r"names a directory; give a file name, e\.g\. .*x\.svg/chart\.svg$"):
        write_export(folder, "<svg/>", **write_module.CHART)
    link = tmp_path / "l.svg"
    link.symlink_to(tmp_path / "elsewhere.svg")
    with pytest.raises(ValueError, match="is a symbolic link; give the file it points to$"):
        write_export(link, "<svg/>", **write_module.CHART)
    with pytest.raises(ValueError, match="or -o - for stdout$"):  # an export keeps its stdout hint
        write_export(link, "x: 1\n")


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="no /proc")
def test_a_regular_file_that_cannot_be_read_back_is_one_line():
    """/proc/self/mem stats as a regular file and fails to read with EIO: it was '[Errno 5] Input/output error'."""
    with pytest.raises(ValueError, match="cannot read /proc/self/mem to compare it"):
        write_export("/proc/self/mem", "x: 1\n", force=True)


def test_a_parent_that_is_a_file_and_a_dry_run_over_a_users_config_are_said(tmp_path, capsys):
    """A fuzz round: '-o existing.yaml/sub.yaml' said 'directory existing.yaml does not exist'; launch --dry-run over
    a config file of the user's said it 'writes' it, where the launch refuses without --force."""
    from tests.cli._main import run_main

    mine = tmp_path / "mine.yaml"
    mine.write_text("MINE: keep\n")
    code, _, err = run_main(["export", "-m", "Qwen/Qwen2.5-0.5B", "-g", "2xA100", "-o", str(mine / "sub.yaml")], capsys)
    assert code == 2 and f"{mine} is a file, not a directory" in err
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    code, _, err = run_main(["launch", "--cpu", "--processes", "1", "-m", "Qwen/Qwen2.5-0.5B", "--config-file",
                             str(mine), "--dry-run", str(script)], capsys)
    assert code == 0 and "which exists with other contents: the launch needs --force" in err
    assert mine.read_text() == "MINE: keep\n"

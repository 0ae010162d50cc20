"""The ``advisor`` script (``console``): once torch is imported it leaves through ``os._exit`` after
flushing, skipping the interpreter's teardown; the exit codes and output stay those of ``main``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from advisor.cli import main as cli_main


class _Exited(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


def _console(monkeypatch, argv: list[str]) -> int:
    def fake_exit(code: int) -> None:
        raise _Exited(code)

    monkeypatch.setattr(cli_main.os, "_exit", fake_exit)
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or object())
    monkeypatch.setattr(sys, "argv", ["advisor", *argv])
    with pytest.raises(_Exited) as exited:
        cli_main.console()
    return exited.value.code


def test_success_and_bad_input_keep_their_exit_codes_after_torch(monkeypatch, capsys):
    assert _console(monkeypatch, ["plan", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "1xH100", "--json"]) == 0
    assert '"recommendation"' in capsys.readouterr().out
    assert _console(monkeypatch, ["plan", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "0xH100"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("advisor: error:") and len(err.strip().splitlines()) == 1


def test_the_script_exits_normally_when_torch_was_never_imported():
    """A plan imports no torch, so the script leaves through sys.exit: a bad GPU count is exit 2."""
    done = subprocess.run([sys.executable, "-c", "from advisor.cli.main import console; console()", "plan", "--model",
                           "Qwen/Qwen2.5-0.5B", "--gpus", "0xH100"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("advisor: error:")


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGPIPE"), reason="no SIGPIPE on this platform")
def test_a_reader_that_closes_the_pipe_ends_the_script_as_it_ends_cat():
    """``advisor plan ... | head -1``: the script dies of SIGPIPE (the shell's 141), with nothing on stderr, as
    ``cat`` does. Before, click turned the BrokenPipeError into a silent exit 1, a failure to ``set -o pipefail``."""
    import signal

    script = ("import sys; from advisor.cli.entry import console; sys.argv = ['advisor', 'plan', '--model', "
              "'Qwen/Qwen2.5-0.5B', '--gpus', '2xA100']; console()")
    reader, writer = os.pipe()
    os.close(reader)  # the reader has gone before the first line is written
    done = subprocess.run([sys.executable, "-c", script], stdout=writer, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(writer)
    assert done.returncode == -signal.SIGPIPE and done.stderr == ""

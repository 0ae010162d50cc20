"""The ``advisor`` script's entry point. It imports the command inside a handler, so that Ctrl-C while
the interpreter is still loading click, pydantic and the option tables ends as one line and exit
code 130 (the shell's code for SIGINT), as it does once a command runs (``advisor.cli.main``).

A reader that closes the pipe early (``advisor plan ... | head -1``) ends the command as it ends ``cat`` or
``git log``: by SIGPIPE, exit status 141 in the shell, and no message. Python ignores SIGPIPE and click then
turned the ``BrokenPipeError`` into a silent exit 1, indistinguishable from a failure."""

from __future__ import annotations

import signal
import sys


def console() -> None:
    if hasattr(signal, "SIGPIPE"):  # not on Windows
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        from advisor.cli.main import console as run
    except KeyboardInterrupt:
        sys.stderr.write("advisor: interrupted\n")
        sys.exit(130)
    run()

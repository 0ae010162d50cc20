"""The ``advisor`` script's entry point. It imports the command inside a handler, so that Ctrl-C while
the interpreter is still loading click, pydantic and the option tables ends as one line and exit
code 130 (the shell's code for SIGINT), as it does once a command runs (``advisor.cli.main``)."""

from __future__ import annotations

import sys


def console() -> None:
    try:
        from advisor.cli.main import console as run
    except KeyboardInterrupt:
        sys.stderr.write("advisor: interrupted\n")
        sys.exit(130)
    run()

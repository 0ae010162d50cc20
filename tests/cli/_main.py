"""Run the ``advisor`` console entry point in-process, as a user's shell would: exit code, stdout, stderr."""

from __future__ import annotations

from advisor.cli.main import main


def run_main(args, capsys) -> tuple[int, str, str]:
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err

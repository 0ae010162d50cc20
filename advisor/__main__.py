"""``python -m advisor``: the same command as the ``advisor`` script (``advisor.cli.entry``), for an environment
whose scripts directory is not on PATH."""

from advisor.cli.entry import console

if __name__ == "__main__":
    console()

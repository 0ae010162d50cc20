"""Instructions executed by one cold `advisor plan` (valgrind's callgrind), this tree against another.

Run: python benchmarks/plan_instructions.py --baseline DIR [--no-bytecode] [-- plan ARGS...]
Wall and CPU times on a shared machine scatter by more than a few percent; the count of instructions
a cold run executes does not depend on the load (PYTHONHASHSEED fixed), so it compares two trees
exactly. Each tree runs with PYTHONPATH=its root; bytecode cached in a temporary PYTHONPYCACHEPREFIX
warmed by one run (an installed copy), or none at all with --no-bytecode (every module of the package
compiled on every run, as in a sandbox that sets PYTHONDONTWRITEBYTECODE). Needs valgrind; about
30 s per run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from _timing import bytecode_env, no_bytecode_env

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "2xA100"]
RUN = "import sys; from advisor.cli.main import main; main(sys.argv[1:])"


def instructions(root: Path, argv: list[str], *, bytecode: bool, tmp: str) -> int:
    """Instructions (callgrind's "I refs") of one cold run of ``advisor ARGV`` from ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "0"}
    env = bytecode_env(env, str(Path(tmp) / root.name)) if bytecode else no_bytecode_env(env)
    cmd = [sys.executable, "-c", RUN, *argv]
    # cwd outside the checkouts: ``python -c`` puts the working directory ahead of PYTHONPATH.
    if bytecode:
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, cwd=tmp)
    result = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False, cwd=tmp)
    match = re.search(r"I\s+refs:\s+([\d,]+)", result.stderr)
    if match is None:
        raise SystemExit(f"no instruction count from valgrind:\n{result.stderr[-2000:]}")
    return int(match.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the other checkout's root, e.g. main's")
    parser.add_argument("--no-bytecode", action="store_true", help="compile every module on every run")
    parser.add_argument("argv", nargs="*", help="advisor arguments (after --); default: " + " ".join(DEFAULT))
    args = parser.parse_args()
    argv = args.argv or DEFAULT
    with tempfile.TemporaryDirectory() as tmp:
        base = instructions(Path(args.baseline).resolve(), argv, bytecode=not args.no_bytecode, tmp=tmp)
        this = instructions(ROOT, argv, bytecode=not args.no_bytecode, tmp=tmp)
    mode = "no bytecode" if args.no_bytecode else "bytecode cached"
    print(f"advisor {' '.join(argv)} ({mode}): baseline {base / 1e6:.1f} M instructions, this tree "
          f"{this / 1e6:.1f} M, ratio {this / base:.3f}")


if __name__ == "__main__":
    main()

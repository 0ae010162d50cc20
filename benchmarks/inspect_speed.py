"""Cold wall time of `advisor inspect Qwen/Qwen2.5-7B` against `python -c "import torch"`.

Run: python benchmarks/inspect_speed.py [--repeat 5]
Prints each command's median cold time (a fresh interpreter per run) and the ratio.
Goal (issue 2): inspect under 0.5 s and under a quarter of the torch import.
"""

from __future__ import annotations

import argparse
import shutil
import sys

from _timing import cold_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--args", nargs="*", default=["inspect", "Qwen/Qwen2.5-7B"])
    args = parser.parse_args()
    exe = shutil.which("advisor")
    advisor_cmd = [exe, *args.args] if exe else [sys.executable, "-m", "advisor.cli.main", *args.args]
    t_advisor = cold_time(advisor_cmd, args.repeat)
    t_torch = cold_time([sys.executable, "-c", "import torch"], args.repeat)
    t_python = cold_time([sys.executable, "-c", "pass"], args.repeat)
    print(f"advisor {' '.join(args.args)}: {t_advisor:.3f} s (median of {args.repeat}, cold)")
    print(f"python -c 'import torch':        {t_torch:.3f} s")
    print(f"python -c 'pass':                {t_python:.3f} s")
    print(f"ratio advisor / torch import:    {t_advisor / t_torch:.2f}  (goal < 0.25)")
    print(f"goal < 0.5 s:                    {'met' if t_advisor < 0.5 else 'NOT met'}")


if __name__ == "__main__":
    main()

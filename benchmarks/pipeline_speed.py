"""Speed of the pipeline/expert mesh search: ``plan()`` for Llama-3.1-405B on 128 x 8 H100 (1024 GPUs),
``--policy fastest`` at sequence 8192, where every mesh family is searched (issue 23: under 100 ms).

    PYTHONPATH=$PWD python benchmarks/pipeline_speed.py [--repeat 7] [--baseline DIR]

Each repeat is a fresh process: imports and profiles are warmed by planning another model (8B on
2 x 8 H100), then the 405B plan is timed once with ``time.process_time`` (CPU time of this process,
less sensitive to the other jobs of a shared machine than wall time), its caches cold. Printed: the
median and the smallest of the repeats, the CPU time spent evaluating pipeline/expert meshes, and how
many such meshes were enumerated and evaluated (``evaluate_pipeline_meshes`` skips those a misfit
dominates). ``--baseline DIR`` runs another checkout (``PYTHONPATH=DIR``) interleaved, repeat by repeat.
Writes ``benchmarks/results/pipeline_speed.md`` when ``--write`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_MS = 100.0
ONE_RUN = r"""
import json, time
import advisor.planning.meshes as meshes
import advisor.planning.pipeline_meshes as pm
from advisor.planning.api import plan

spent = {"pp_s": 0.0, "evaluated": 0, "enumerated": 0}
evaluate, enumerate_pp = meshes.evaluate_meshes, pm.pipeline_meshes

def timed_evaluate(spec, hw, training, ms, **kw):
    staged = [m for m in ms if m.pp > 1 or m.ep > 1]
    start = time.process_time()
    out = evaluate(spec, hw, training, ms, **kw)
    if staged:
        spent["pp_s"] += time.process_time() - start
        spent["evaluated"] += len(staged)
    return out

def counted(*a, **kw):
    out = enumerate_pp(*a, **kw)
    spent["enumerated"] += len(out)
    return out

meshes.evaluate_meshes, meshes.pipeline_meshes = timed_evaluate, counted
plan("meta-llama/Llama-3.1-8B", "2x8xH100", policy="fastest", seq_len=8192)  # imports, profiles
spent.update(pp_s=0.0, evaluated=0, enumerated=0)
start = time.process_time()
result = plan("meta-llama/Llama-3.1-405B", "128x8xH100", policy="fastest", seq_len=8192)
spent["total_s"] = time.process_time() - start
spent["recommended"] = result.recommendation.mesh.label if result.recommendation.mesh else "none"
print(json.dumps(spent))
"""


def one_run(tree: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", ONE_RUN], env=env, cwd=tree, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(label: str, runs: list[dict]) -> str:
    total = [r["total_s"] * 1000 for r in runs]
    pp = [r["pp_s"] * 1000 for r in runs]
    return (f"| {label} | {statistics.median(total):.1f} | {min(total):.1f} | {statistics.median(pp):.1f} | "
            f"{runs[0]['enumerated']} | {runs[0]['evaluated']} | {runs[0]['recommended']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--baseline", type=Path, help="another checkout, timed interleaved with this one")
    parser.add_argument("--write", action="store_true", help="write benchmarks/results/pipeline_speed.md")
    args = parser.parse_args()
    trees = {"this tree": ROOT} | ({f"baseline ({args.baseline})": args.baseline} if args.baseline else {})
    runs: dict[str, list[dict]] = {label: [] for label in trees}
    for _ in range(args.repeat):
        for label, tree in trees.items():
            runs[label].append(one_run(tree))
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    lines = ["| tree | plan() CPU ms, median | smallest | pp/ep evaluation ms, median | pp/ep meshes enumerated | "
             "evaluated | recommended |", "|---|---:|---:|---:|---:|---:|---|"]
    lines += [summary(label, r) for label, r in runs.items()]
    lines += ["", f"{args.repeat} fresh processes per tree, interleaved; load average {' '.join(load)}; goal < "
              f"{GOAL_MS:.0f} ms: {'met' if statistics.median(r['total_s'] for r in runs['this tree']) * 1000 < GOAL_MS else 'NOT met'}."]
    print("\n".join(lines))
    if args.write:
        head = ["# Pipeline/expert mesh search speed", "",
                "Written by `benchmarks/pipeline_speed.py` (its docstring says what is timed): `plan()` for "
                "Llama-3.1-405B on 128x8xH100, `--policy fastest`, seq 8192, CPU time of one cold-cache plan in a "
                "warmed process.", ""]
        (ROOT / "benchmarks" / "results" / "pipeline_speed.md").write_text("\n".join(head + lines) + "\n")


if __name__ == "__main__":
    main()

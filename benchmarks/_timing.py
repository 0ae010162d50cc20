"""Shared timing helpers for the benchmark scripts.

``cold_time``: median wall time of a command, each run a fresh process (cold imports).
``cold_times``: the same command's median wall time and median CPU time (user + sys of the child,
``resource.getrusage(RUSAGE_CHILDREN)``): on a shared machine the wall time also counts waiting for
a core, the CPU time is the work the process did. ``bytecode_env``: the environment of an installed
copy, whose modules are compiled once (pip compiles a wheel's modules on install), for a sandbox
that sets PYTHONDONTWRITEBYTECODE and so recompiles every module on every run.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import time


def cold_time(cmd: list[str], repeat: int) -> float:
    """Median wall time of ``cmd`` run ``repeat`` times, each in a fresh process (cold imports)."""
    return cold_times(cmd, repeat)[0]


def _run(cmd: list[str], env: dict | None, cwd: str | None = None) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=cwd)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cold_times(cmd: list[str], repeat: int, *, env: dict | None = None) -> tuple[float, float]:
    """Median wall time and median CPU time (user + sys) of ``cmd``, each run a fresh process."""
    runs = [_run(cmd, env) for _ in range(repeat)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def paired_times(cmds: dict[str, list[str]], repeat: int, *, envs: dict[str, dict],
                 cwd: str | None = None) -> dict[str, tuple[float, float]]:
    """``cold_times`` for several variants of one command, interleaved run by run (a, b, a, b, ...) so
    that the machine's load falls on each alike; ``envs[name]`` is each variant's environment. Give a
    ``cwd`` outside every checkout when the variants differ by PYTHONPATH: ``python -m`` puts the
    working directory ahead of PYTHONPATH."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in cmds}
    for _ in range(repeat):
        for name, cmd in cmds.items():
            runs[name].append(_run(cmd, envs[name], cwd))
    return {name: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
            for name, rs in runs.items()}


def bytecode_env(env: dict, cache_dir: str) -> dict:
    """``env`` with bytecode written to and read from ``cache_dir`` (PYTHONPYCACHEPREFIX), as an
    installed copy has it; the first run of a command compiles, later runs load the bytecode."""
    out = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out["PYTHONPYCACHEPREFIX"] = cache_dir
    return out


def no_bytecode_env(env: dict) -> dict:
    """``env`` with no bytecode cache at all (PYTHONDONTWRITEBYTECODE=1): every module compiles on every run."""
    out = {k: v for k, v in env.items() if k != "PYTHONPYCACHEPREFIX"}
    out["PYTHONDONTWRITEBYTECODE"] = "1"
    return out


def load_average() -> float:
    return os.getloadavg()[0]

"""Shared timing helper for the benchmark scripts."""

from __future__ import annotations

import statistics
import subprocess
import time


def cold_time(cmd: list[str], repeat: int) -> float:
    """Median wall time of ``cmd`` run ``repeat`` times, each in a fresh process (cold imports)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)

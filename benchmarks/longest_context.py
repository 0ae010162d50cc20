"""The longest sequence a published setup fits, ours against the publisher's (``profiles/published_longest.json``).

    PYTHONPATH=$PWD python benchmarks/longest_context.py      # writes benchmarks/results/longest_context.md

For each case, the longest sequence length (micro-batch and everything else as the case states) whose estimated
total, with what the publisher's code held beyond our recipe (``publisher_code``, ``benchmarks/publisher_code.py``),
stays within the GPU's memory as the catalogue gives it (what ``advisor plan --seq-len max`` compares: the plan's
total, the cached blocks the allocator frees before it fails left out, against ``GpuProfile.memory_bytes``), found
by bisection on the length; the same search without the publisher's code is the run on today's libraries. Each
estimate is ``benchmarks/published_memory.estimate`` of the case at that length: the same planning and publisher code
that score the published memory figures. A case of kind ``oom-any-length`` ran out of memory at every length: it is
judged at its ``seq_len``. The error is ours / published - 1: positive, we would let a longer sequence start than
fitted (the side that runs out of memory).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

import published_memory
from profiles import PROFILES_DIR

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "benchmarks" / "results" / "longest_context.md"
LONGEST_LIMIT = 1 << 20  # tokens: the search's upper end
GIB = 2**30
LINE_MIN_ROWS = 3  # lengths of one model from one source that make a line worth fitting


def load_cases() -> list[dict]:
    return json.loads((PROFILES_DIR / "published_longest.json").read_text())["cases"]


def fits(case: dict, seq_len: int, *, publisher: bool = True, **overhead: float) -> bool:
    """Whether ``case`` at ``seq_len`` tokens fits its GPU (module docstring); ``publisher`` False: without the
    publisher's code (today's libraries); ``overhead``: allocator settings in place of the defaults."""
    at = dict(case, seq_len=seq_len, publisher_code=case.get("publisher_code", []) if publisher else [])
    est = published_memory.estimate(at, **overhead)
    _, total, _, _ = est.compared("oom")
    return total <= published_memory.plan_of(at).hardware.gpu_memory_bytes


def longest(case: dict, *, publisher: bool = True, **overhead: float) -> int | None:
    """The longest length that fits (None when not even one token does), by bisection: memory grows with it."""
    if not fits(case, 1, publisher=publisher, **overhead):
        return None
    low, high = 1, LONGEST_LIMIT  # low fits; high is taken not to
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(case, mid, publisher=publisher, **overhead) else (low, mid)
    return low


def score(case: dict) -> dict:
    """One case's row: ours with the publisher's code and with today's libraries, and the verdict."""
    if case["kind"] == "longest":
        ours, today = longest(case), longest(case, publisher=False)
        return dict(case=case, ours=ours, today=today,
                    error=None if ours is None else ours / case["figure"] - 1)
    if case["kind"] == "oom-any-length":
        return dict(case=case, fits=fits(case, case["seq_len"]), fits_today=fits(case, case["seq_len"], publisher=False))
    raise ValueError(f"{case['id']}: unknown kind {case['kind']!r}")


def memory_of(case: dict) -> int:
    """The GPU memory the case is planned on (the catalogue's, or the row's stated size)."""
    return published_memory.plan_of(case).hardware.gpu_memory_bytes


def fitted_lines(rows: list[dict]) -> list[dict]:
    """Where one source publishes the longest length of one model on several memory sizes, the straight line through
    them by least squares, memory = fixed + per_token x length, for the published lengths and for ours: the part of
    the difference that is a constant (fixed) and the part that grows with the length (per_token); ``residual``:
    the furthest a published row lies from its line, in bytes of memory (a few MiB: the rows follow a formula)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("ours") is not None:
            groups[(r["case"]["source"]["url"], r["case"]["model"])].append(r)
    out = []
    for (_, model), group in groups.items():
        if len(group) < LINE_MIN_ROWS:
            continue
        memory = [memory_of(r["case"]) for r in group]
        published = statistics.linear_regression([r["case"]["figure"] for r in group], memory)
        ours = statistics.linear_regression([r["ours"] for r in group], memory)
        residual = max(abs(m - published.intercept - published.slope * r["case"]["figure"])
                       for r, m in zip(group, memory))
        out.append(dict(model=model, rows=len(group), published=published, ours=ours, residual=residual))
    return out


def line_row(fitted: dict) -> str:
    """One model's line (``fitted_lines``) as the report's table row."""
    pub, ours = fitted["published"], fitted["ours"]
    return (f"| {fitted['model']} | {fitted['rows']} | {pub.slope / 2**20:.3f} | {ours.slope / 2**20:.3f} | "
            f"{ours.slope / pub.slope - 1:+.1%} | {pub.intercept / GIB:.2f} | {ours.intercept / GIB:.2f} | "
            f"{(ours.intercept - pub.intercept) / GIB:+.2f} | {fitted['residual'] / 2**20:.1f} |")


def summary(rows: list[dict]) -> str:
    errors = [abs(r["error"]) for r in rows if r.get("error") is not None]
    never = [r for r in rows if "fits" in r]
    return (f"**longest: {len(errors)} cases, ours / published - 1: median |error| {statistics.median(errors):.1%}, "
            f"max {max(errors):.1%}; setups that fit no length: judged not to fit {sum(not r['fits'] for r in never)} "
            f"of {len(never)}**")


def report(rows: list[dict]) -> str:
    lines = ["# Longest sequence: ours against published", "",
             "Written by `PYTHONPATH=$PWD python benchmarks/longest_context.py` from `profiles/published_longest.json` "
             "(sources, settings and assumptions there; the method is the script's docstring). Tokens a sample, "
             "micro-batch as stated. ours: the longest the estimate fits with the publisher's code "
             "(+ publisher_code); today: without it, today's libraries; error: ours / published - 1 (positive: "
             "we would start a longer sequence than fitted).", "", summary(rows), "",
             "| case | GPU | published | ours | error | today | publisher code |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        case = r["case"]
        code = ", ".join(case.get("publisher_code", [])) or "-"
        if "fits" in r:
            lines.append(f"| {case['id']} | {case['gpus']} | OOM at any length | "
                         f"{'fits' if r['fits'] else 'does not fit'} at {case['seq_len']:,} | - | "
                         f"{'fits' if r['fits_today'] else 'does not fit'} | {code} |")
            continue
        ours = "none" if r["ours"] is None else f"{r['ours']:,}"
        today = "none" if r["today"] is None else f"{r['today']:,}"
        error = "-" if r["error"] is None else f"{r['error']:+.1%}"
        lines.append(f"| {case['id']} | {case['gpus']} | {case['figure']:,} | {ours} | {error} | {today} | {code} |")
    fitted = fitted_lines(rows)
    if fitted:
        lines += ["", "## One model on several memory sizes: the line through the lengths", "",
                  "Memory (GiB, as each row is planned) = fixed + per-token x length, by least squares over the published "
                  "lengths and over ours. A published line that holds every row to a few MiB is a formula the publisher "
                  "drew (lengths measured on different cards would not fall on it so): the smaller cards' lengths are "
                  "then its extrapolation, and the difference is better read as the two parts of the line than as each "
                  "row's error.", "",
                  "| model | rows | published per token (MiB) | ours per token (MiB) | per token, ours / published - 1 | "
                  "published fixed (GiB) | ours fixed (GiB) | fixed, ours - published (GiB) | published rows off their "
                  "line, at most (MiB) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        lines += [line_row(f) for f in fitted]
    return "\n".join(lines) + "\n"


def main() -> None:
    text = report([score(case) for case in load_cases()])
    REPORT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()

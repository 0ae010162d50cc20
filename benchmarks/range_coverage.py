"""How often the range holds the measured figure, each source held out: leave-one-source-out over the
comparisons of ``benchmarks/error_table.py`` (each source's comparisons scored with a table built without that
source), per source and per stack, with the range's median width.

    PYTHONPATH=$PWD python benchmarks/range_coverage.py     # prints the lines; published_memory.py adds them to its report

A comparison's range is ``1 + low`` to ``1 + high`` times its estimate (the row ``ErrorTable.bound`` picks for its
key), so the figure is held exactly when ``low <= ratio <= high`` (the plan adds the CUDA context unscaled, and an
nvidia-smi comparison's ratio is taken without it: ``error_table.published_comparison``).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import error_table  # noqa: E402
from advisor.calibration import ErrorTable  # noqa: E402

OURS = ("h100-truth", "h100-stacks", "h200-stacks")  # our own measurements; the rest are published sources


class Scored(NamedTuple):
    comparison: error_table.Comparison
    low: float
    high: float

    @property
    def inside(self) -> bool:
        return self.low <= self.comparison.ratio <= self.high

    @property
    def width(self) -> float:
        return self.high - self.low


def table_of(found: list) -> ErrorTable:
    return ErrorTable.model_validate({"rows": error_table.build_rows(found)})


def score(found: list, table: ErrorTable) -> list[Scored]:
    out = []
    for c in found:
        row = table.bound(measured=c.measured, recipe=c.recipe, tuning=c.tuning, family=c.family)
        out.append(Scored(c, row.low, row.high))
    return out


def held_out(found: list) -> list[Scored]:
    """Each source's comparisons scored with the table built from every other source."""
    out = []
    for source in sorted({c.source for c in found}):
        mine = [c for c in found if c.source == source]
        out += score(mine, table_of([c for c in found if c.source != source]))
    return out


def _ceiling(scored: list[Scored], found: list) -> int:
    """How many of these comparisons lie within the hull (zero included) of every other source's comparisons of
    the same measured kind: the most a plain min-max of the other sources' data can hold."""
    count = 0
    for s in scored:
        c = s.comparison
        others = [o.ratio for o in found if o.source != c.source and o.measured == c.measured]
        count += min(0.0, *others) <= c.ratio <= max(0.0, *others)
    return count


def _line(name: str, scored: list[Scored]) -> str:
    hits = sum(s.inside for s in scored)
    widths = [100 * s.width for s in scored]
    missed = [f"{s.comparison.case} {100 * s.comparison.ratio:+.1f}% vs {100 * s.low:+.1f}..{100 * s.high:+.1f}%"
              for s in scored if not s.inside]
    text = (f"  - {name}: holds {hits} of {len(scored)} ({100 * hits / len(scored):.0f}%), median width "
            f"{statistics.median(widths):.1f} points")
    return text + (f"; missed: {'; '.join(missed)}" if missed else "")


def lines(found: list | None = None) -> list[str]:
    """The report's section: held-out coverage of the reserved range (what a plan's range is of) over the
    published cases, per source and per stack; then every comparison, allocated too; then in-sample."""
    found = error_table.comparisons() if found is None else found
    scored = held_out(found)
    reserved = [s for s in scored if s.comparison.measured == "reserved"]
    published = [s for s in reserved if s.comparison.source not in OURS]
    out = [
        "## The range, held out by source",
        "",
        "A plan's `memory_range` comes from `profiles/memory_error.json` (`python benchmarks/error_table.py`: every "
        "measured comparison, keyed by what was measured, stack and tuning; the rule is in that script's "
        "docstring). Below, each source's comparisons are scored with a table built without that source "
        "(`benchmarks/range_coverage.py`); the range holds a figure when truth / estimate - 1 lies in the row's "
        "low..high. Widths are high - low in points of the estimate.",
        "",
        _line("published reserved, unspecified and nvidia-smi figures (expressible), held out", published),
        _line("every reserved comparison (our H100 runs too), held out", reserved),
        _line("every comparison, allocated ones too (against an allocated range of the same table), held out", scored),
        f"  - min-max ceiling held out: {_ceiling(published, found)} of {len(published)} published reserved figures lie "
        "within the lowest..highest reserved ratio of every other source together, so no plain min-max of the other "
        "sources holds more (the table's rule pushes each end out by the farthest one source lay beyond the others)",
        _line("published reserved figures, in sample (a table built from every comparison found now, as benchmarks/error_table.py would write it)",
              [s for s in score(found, table_of(found)) if s.comparison.measured == "reserved"
               and s.comparison.source not in OURS]),
        "",
        "Held out, reserved (the plan's range), by source:",
    ]
    for source in sorted({s.comparison.source for s in reserved}):
        out.append(_line(source, [s for s in reserved if s.comparison.source == source]))
    out.append("Held out, reserved, by stack (recipe):")
    for recipe in sorted({s.comparison.recipe for s in reserved}):
        out.append(_line(recipe, [s for s in reserved if s.comparison.recipe == recipe]))
    out.append("Held out, allocated (the same table's allocated rows; the plan shows no allocated range), by source:")
    allocated = [s for s in scored if s.comparison.measured == "allocated"]
    for source in sorted({s.comparison.source for s in allocated}):
        out.append(_line(source, [s for s in allocated if s.comparison.source == source]))
    return out + [""]


if __name__ == "__main__":
    print("\n".join(lines()))

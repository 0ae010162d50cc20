"""Charts the CLI writes, as self-contained SVG: pure functions from the library's results to text.

- ``timeline_svg``: one GPU's memory over the simulated step (``advisor simulate --timeline``), one
  stacked column per segment of the step (``advisor.simulate.timeline``), phase bands above, block
  numbers below, and the analytic estimate's moments as dashed lines over the part of the step
  each describes.
- ``plan_svg``: per-GPU memory of every candidate of a plan (strategies, and meshes by their mesh) as
  stacked horizontal bars, one row each, with the GPU's capacity (``advisor plan --chart``).

Every drawn quantity also sits in a ``data-bytes`` attribute, so a test can read the figures back.
No torch import: ``plan`` stays torch-free.
"""

from __future__ import annotations

import math
import textwrap
from itertools import groupby
from xml.sax.saxutils import escape

from advisor.cli.plan_view import candidate_label, recommended_candidate
from advisor.cli.svg import COLORS, LABELS, Scale, attr, document, gib, legend, text, x_axis, y_axis
from advisor.planning.api import Plan
from advisor.planning.candidates import Candidate
from advisor.simulate.timeline import CATEGORIES, Segment, Timeline

PHASE_NAMES = {"forward": "forward", "loss": "loss", "backward": "backward", "optimizer_step": "optimizer step"}
PHASE_FILL = {"forward": "#e8f0f8", "loss": "#fbeee0", "backward": "#f3e8f5", "optimizer_step": "#eaf4e6"}
# Which segments each analytic moment describes (advisor.estimate.memory docstring).
MOMENTS = {
    "start_of_forward": ("start of forward", "#4d4d4d", "3 2"),
    "end_of_forward": ("end of forward", "#1b1b1b", "8 4"),
    "loss_backward": ("loss backward", "#7b3294", "4 3"),
    "block_backward": ("block backward", "#a6611a", "10 3 2 3"),
    "end_of_backward": ("end of backward", "#0571b0", "6 2 2 2"),
    "optimizer_step": ("optimizer step", "#008837", "2 3"),
}
WIDTH, HEIGHT = 1200, 600
LEFT, RIGHT_PANEL, TOP, BOTTOM = 78, 290, 92, 110
MAX_BLOCK_TICKS = 12


def _widths(segments: tuple[Segment, ...], plot_width: float) -> list[float]:
    """Equal columns, widened where a phase band is too narrow for its name (the loss, the optimizer step)."""
    runs = [(phase, len(list(run))) for phase, run in groupby(s.phase for s in segments)]
    need = {phase: 8 * len(PHASE_NAMES[phase]) + 12 for phase in PHASE_NAMES}
    unit = plot_width / len(segments)
    fixed = {i: need[phase] / count for i, (phase, count) in enumerate(runs) if count * unit < need[phase]}
    free = plot_width - sum(fixed[i] * runs[i][1] for i in fixed)
    unit = free / max(1, sum(count for i, (_, count) in enumerate(runs) if i not in fixed))
    return [fixed.get(i, unit) for i, (_, count) in enumerate(runs) for _ in range(count)]


def _moment_spans(segments: tuple[Segment, ...]) -> dict[str, list[int]]:
    spans: dict[str, list[int]] = {name: [] for name in MOMENTS}
    for i, s in enumerate(segments):
        if s.phase == "forward" and s.block is not None:  # the first block's forward to the last one's
            spans["start_of_forward"].append(i)
        elif s.phase == "backward" and s.block is None and i + 1 < len(segments) \
                and segments[i + 1].phase == "optimizer_step":
            spans["end_of_backward"].append(i)
        elif s.phase == "loss":
            spans["end_of_forward" if s.label == "loss" else "loss_backward"].append(i)
        elif s.phase == "backward" and s.block is not None:
            spans["block_backward"].append(i)
        elif s.phase == "optimizer_step":
            spans["optimizer_step"].append(i)
    return spans


def timeline_svg(timeline: Timeline, *, title: str, moments: dict[str, int] | None) -> str:
    """The step as stacked columns (live bytes at each segment's highest point) with the moments marked."""
    segs = timeline.segments
    right = WIDTH - RIGHT_PANEL
    widths = _widths(segs, right - LEFT)
    xs = [LEFT + sum(widths[:i]) for i in range(len(segs))]
    marks = dict(moments or {})
    scale = Scale(int(max([timeline.peak_bytes, *marks.values()]) * 1.1), top=TOP, bottom=HEIGHT - BOTTOM)
    body = [text(LEFT, 26, title, size=15, weight="bold"),
            text(LEFT, 46, "One GPU's memory over the simulated step: each column is the live memory at the highest "
                 "point of one part of the step;", size=11, fill="#555"),
            text(LEFT, 61, "dashed lines: the analytic estimate's moments, drawn over the part of the step "
                 "each describes.", size=11, fill="#555"),
            y_axis(scale, left=LEFT, right=right, label="GiB per GPU")]
    body += _phase_bands(segs, xs, widths, top=TOP - 22)
    body += _columns(segs, xs, widths, scale)
    body += _peak_note(segs, xs, widths, scale)
    body += _moment_lines(marks, _moment_spans(segs), xs, widths, scale, right=right)
    body += _segment_labels(segs, xs, widths, timeline.num_blocks, y=HEIGHT - BOTTOM)
    body.append(legend([(COLORS[c], LABELS[c]) for c in CATEGORIES], x=right + 24, y=TOP, title="memory"))
    body += _moment_legend(marks, x=right + 24, y=TOP + 140)
    return document("\n".join(body), width=WIDTH, height=HEIGHT, title=title)


def _phase_bands(segs: tuple[Segment, ...], xs: list[float], widths: list[float], *, top: float) -> list[str]:
    parts, start = [], 0
    for phase, run in groupby(s.phase for s in segs):
        count = len(list(run))
        x, w = xs[start], sum(widths[start:start + count])
        parts.append(f'<rect class="phase" data-phase="{phase}" x="{x:.1f}" y="{top:.1f}" width="{w:.1f}" '
                     f'height="18" fill="{PHASE_FILL[phase]}" stroke="white"/>')
        parts.append(text(x + w / 2, top + 13, PHASE_NAMES[phase], size=11, anchor="middle", cls="phase-label"))
        start += count
    return parts


def _columns(segs: tuple[Segment, ...], xs: list[float], widths: list[float], scale: Scale) -> list[str]:
    """One group per category; each column stacks the categories of its segment's peak, params at the bottom."""
    groups = []
    for cat in CATEGORIES:
        rects = []
        for i, seg in enumerate(segs):
            below = sum(getattr(seg.peak, c) for c in CATEGORIES[:CATEGORIES.index(cat)])
            value = getattr(seg.peak, cat)
            y_top, y_bottom = scale.y(below + value), scale.y(below)
            rects.append(f'<rect x="{xs[i]:.2f}" y="{y_top:.2f}" width="{widths[i]:.2f}" '
                         f'height="{y_bottom - y_top:.2f}" data-segment="{i}" data-bytes="{value}"/>')
        groups.append(f'<g class="category" data-category="{cat}" fill="{COLORS[cat]}" stroke="white" '
                      f'stroke-width="0.5">\n' + "\n".join(rects) + "\n</g>")
    hover = []  # an invisible column per segment whose tooltip gives its figures
    for i, seg in enumerate(segs):
        tip = f"{PHASE_NAMES[seg.phase]}: {seg.label}, peak {gib(seg.peak.total)}, " + ", ".join(
            f"{LABELS[c]} {gib(getattr(seg.peak, c))}" for c in CATEGORIES)
        hover.append(f'<rect class="segment" data-phase="{seg.phase}" data-label={attr(seg.label)} '
                     f'data-peak-bytes="{seg.peak.total}" x="{xs[i]:.2f}" y="{scale.top:.1f}" width="{widths[i]:.2f}" '
                     f'height="{scale.bottom - scale.top:.1f}" fill="transparent"><title>{tip}</title></rect>')
    return groups + hover


def _peak_note(segs: tuple[Segment, ...], xs: list[float], widths: list[float], scale: Scale) -> list[str]:
    top = max(range(len(segs)), key=lambda i: segs[i].peak.total)
    peak = segs[top].peak.total
    x, y = xs[top] + widths[top] / 2, scale.y(peak)
    anchor = "end" if x > (LEFT + WIDTH - RIGHT_PANEL) / 2 else "start"
    return [f'<circle class="peak" cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="#c00" data-bytes="{peak}"/>',
            text(x + (-6 if anchor == "end" else 6), y - 6, f"simulated peak {gib(peak)} ({segs[top].label})",
                 size=11, anchor=anchor, weight="bold", fill="#c00", halo=True)]


def _moment_lines(marks: dict[str, int], spans: dict[str, list[int]], xs: list[float], widths: list[float],
                  scale: Scale, *, right: float) -> list[str]:
    parts = []
    for name, value in marks.items():
        _, color, dash = MOMENTS[name]
        y = scale.y(value)
        parts.append(f'<line x1="{LEFT}" x2="{right:.1f}" y1="{y:.2f}" y2="{y:.2f}" stroke="{color}" '
                     f'stroke-opacity="0.35" stroke-width="1" stroke-dasharray="{dash}"/>')
        span = spans.get(name) or []
        x1 = xs[span[0]] if span else LEFT
        x2 = xs[span[-1]] + widths[span[-1]] if span else right
        parts.append(f'<line class="moment" data-moment="{name}" data-bytes="{value}" x1="{x1:.1f}" x2="{x2:.1f}" '
                     f'y1="{y:.2f}" y2="{y:.2f}" stroke="{color}" stroke-width="2.5" stroke-dasharray="{dash}"/>')
    return parts


def _moment_legend(marks: dict[str, int], *, x: float, y: float) -> list[str]:
    if not marks:
        return [text(x, y, "no analytic moments for this estimate", size=11, fill="#555")]
    parts = [text(x, y, "analytic estimate", size=12, weight="bold")]
    winner = max(marks, key=lambda name: marks[name])
    for i, (name, value) in enumerate(marks.items()):
        label, color, dash = MOMENTS[name]
        row = y + 20 + i * 20
        parts.append(f'<line x1="{x:.1f}" x2="{x + 26:.1f}" y1="{row - 4:.1f}" y2="{row - 4:.1f}" stroke="{color}" '
                     f'stroke-width="2.5" stroke-dasharray="{dash}"/>')
        parts.append(text(x + 32, row, f"{label}: {gib(value)}" + ("  (peak)" if name == winner else ""), size=12,
                          weight="bold" if name == winner else "normal"))
    return parts


def _segment_labels(segs: tuple[Segment, ...], xs: list[float], widths: list[float], num_blocks: int, *,
                    y: float) -> list[str]:
    """Block numbers under the columns (every k-th one when there are many), a bracket under each run of
    blocks, and the other segments' names (embeddings, norm, head, loss) slanted."""
    every = 1 if num_blocks <= MAX_BLOCK_TICKS else _round_up(math.ceil(num_blocks / MAX_BLOCK_TICKS))
    parts: list[str] = []
    for is_block, run in groupby(range(len(segs)), key=lambda i: segs[i].block is not None):
        run = list(run)
        if is_block:
            first, last = segs[run[0]].block, segs[run[-1]].block
            for i in run:
                block = segs[i].block
                if block % every == 0:
                    parts.append(text(xs[i] + widths[i] / 2, y + 13, str(block), size=9, anchor="middle",
                                      cls="block-label", extra=f' data-block="{block}" data-phase="{segs[i].phase}"'))
            x1, x2 = xs[run[0]] + 1, xs[run[-1]] + widths[run[-1]] - 1
            parts.append(f'<path d="M{x1:.1f} {y + 18:.1f} v4 H{x2:.1f} v-4" fill="none" stroke="#666"/>')
            parts.append(text((x1 + x2) / 2, y + 34, f"blocks {first} \u2192 {last}", size=11, anchor="middle",
                              cls="group-label"))
        else:
            for i in run:
                cx = xs[i] + widths[i] / 2
                parts.append(text(cx + 3, y + 10, segs[i].label, size=10, anchor="end", rotate=-60,
                                  cls="segment-label"))
    return parts


def _round_up(step: int) -> int:
    return next(n for n in (1, 2, 4, 5, 8, 10, 16, 20, 25, 50, 100, step) if n >= step)


BAR_PARTS = (*CATEGORIES, "allocator_gap", "outside_allocator")  # MemoryBreakdown fields, left to right
PLAN_WIDTH, PLAN_PANEL, PLAN_TOP, PLAN_BOTTOM, ROW = 1100, 250, 96, 30, 34
VALUE_ROOM = 96  # right of the longest bar: its GiB label


def _text_px(content: str, size: int) -> float:
    """About how wide ``content`` is drawn (DejaVu Sans averages 0.6 em a character, digits 0.64)."""
    return 0.62 * size * len(content)


def _details(cand: Candidate) -> str:
    """``micro-batch 4, checkpointing, fits`` under a bar's name."""
    if cand.memory_bytes is None:
        return "not available"
    ckpt = (", selective checkpointing" if cand.selective_checkpointing else ", checkpointing"
            ) if cand.activation_checkpointing else ""
    return f"micro-batch {cand.micro_batch_size}{ckpt}, {'fits' if cand.fits else 'does not fit'}"


def plan_svg(plan: Plan) -> str:
    """Per-GPU memory of every candidate as a stacked horizontal bar, one row each, named by strategy and
    mesh (``zero3 cp 8``): the peak view, then the runtime overhead (the calibrated allocator gap and the
    assumed CUDA context and NCCL buffers), with one GPU's capacity as a line. A bar past twice the
    capacity is cut there (an arrow marks it). Rows keep names of any length apart (bars side by side
    overlapped their labels once meshes were added)."""
    capacity = plan.hardware.gpu_memory_bytes
    bars = list(plan.candidates)
    totals = [c.memory_bytes.total for c in bars if c.memory_bytes is not None]
    ceiling = min(max([capacity, *totals]), 2 * capacity)
    names = [candidate_label(c) for c in bars]
    label_px = max([_text_px(n, 12) for n in names] + [_text_px(_details(c), 10) for c in bars])
    left, right = 24 + label_px + 14, PLAN_WIDTH - PLAN_PANEL
    height = max(PLAN_TOP + ROW * len(bars) + PLAN_BOTTOM, PLAN_TOP + 40 + 20 * len(BAR_PARTS) + 110)
    scale = Scale(int(ceiling * 1.04), top=right - VALUE_ROOM, bottom=left)  # bytes -> x
    title = (f"{plan.model.name} on {plan.hardware.world_size}x {plan.hardware.gpu.name}: "
             f"per-GPU memory by strategy{' and mesh' if any(c.mesh for c in bars) else ''} (estimate)")
    body = [text(24, 26, title, size=15, weight="bold"),
            text(24, 46, f"seq {plan.training.seq_len}, {plan.training.precision}, {plan.training.optimizer}; "
                 "each bar: what is live at its peak moment, then the allocator gap and the CUDA context; "
                 "\u2192: cut at the axis' end", size=11,
                 fill="#555"),
            x_axis(scale, top=PLAN_TOP - 8, bottom=PLAN_TOP + ROW * len(bars), label="GiB per GPU")]
    chosen = recommended_candidate(plan)
    for i, (cand, name) in enumerate(zip(bars, names)):
        body += _bar(cand, name, y=PLAN_TOP + i * ROW, scale=scale, recommended=cand is chosen)
    x = scale.y(capacity)
    body.append(f'<line class="capacity" data-bytes="{capacity}" x1="{x:.1f}" x2="{x:.1f}" y1="{PLAN_TOP - 8}" '
                f'y2="{PLAN_TOP + ROW * len(bars):.1f}" stroke="#c00" stroke-width="2" stroke-dasharray="6 4"/>')
    panel = right + 24
    body.append(legend([(COLORS[c], LABELS[c]) for c in BAR_PARTS], x=panel, y=PLAN_TOP, title="memory"))
    row = PLAN_TOP + 30 + 20 * len(BAR_PARTS)  # below the legend's swatches
    body.append(f'<line x1="{panel:.1f}" x2="{panel + 26:.1f}" y1="{row - 4}" y2="{row - 4}" stroke="#c00" '
                f'stroke-width="2" stroke-dasharray="6 4"/>')
    body.append(text(panel + 32, row, f"one {plan.hardware.gpu.name}", size=12))
    body.append(text(panel + 32, row + 16, f"{gib(capacity)}", size=12))
    if chosen is not None:
        body.append(text(panel, row + 44, "recommended:", size=12, weight="bold"))
        # The panel is narrow: a long mesh name breaks between its dimensions, the details go one per line.
        name = textwrap.wrap(candidate_label(chosen), int((PLAN_PANEL - 30) / _text_px("x", 12)))
        body.append(f'<text class="recommended" data-label={attr(candidate_label(chosen))} x="{panel:.1f}" '
                    f'y="{row + 60}" font-size="12" font-weight="bold" fill="#222">'
                    + "".join(f'<tspan x="{panel:.1f}" dy="{0 if i == 0 else 15}">{escape(part)}</tspan>'
                              for i, part in enumerate(name)) + "</text>")
        for i, detail in enumerate(_details(chosen).split(", ")):
            body.append(text(panel, row + 78 + 15 * (len(name) - 1 + i), detail, size=11, fill="#555"))
    return document("\n".join(body), width=PLAN_WIDTH, height=height, title=title)


def _bar(cand: Candidate, name: str, *, y: float, scale: Scale, recommended: bool) -> list[str]:
    mem = cand.memory_bytes
    left, middle = scale.bottom, y + ROW / 2
    weight = "bold" if recommended else "normal"
    parts = [text(left - 12, middle - 2, name + (" *" if recommended else ""), size=12, anchor="end",
                  cls="bar-label", weight=weight),
             text(left - 12, middle + 11, _details(cand), size=10, anchor="end", cls="bar-details",
                  fill="#888" if mem is None else ("#2a7" if cand.fits else "#c00"))]
    if mem is None:
        parts.append(text(left + 6, middle + 4, "n/a", size=11, fill="#888", extra=f" data-strategy={attr(cand.strategy)}"))
        return parts
    mesh = f" data-mesh={attr(cand.mesh.label)}" if cand.mesh is not None else ""
    group = [f'<g class="bar" data-strategy={attr(cand.strategy)} data-label={attr(name)}{mesh} '
             f'data-total-bytes="{mem.total}" stroke="white" stroke-width="0.5"><title>{escape(name)}: '
             f'{gib(mem.total)} per GPU, ' + ", ".join(f"{LABELS[p]} {gib(getattr(mem, p))}" for p in BAR_PARTS)
             + "</title>"]
    below, end = 0, scale.top  # a bar past the scale stops there: its value label keeps its room
    for part in BAR_PARTS:
        value = getattr(mem, part)
        x0, x1 = min(scale.y(below), end), min(scale.y(below + value), end)
        group.append(f'<rect class="part" data-part="{part}" data-bytes="{value}" x="{x0:.1f}" y="{y + 7:.1f}" '
                     f'width="{x1 - x0:.1f}" height="{ROW - 14}" fill="{COLORS[part]}"/>')
        below += value
    parts.append("\n".join(group) + "\n</g>")
    cut = scale.y(mem.total) > end
    parts.append(text(min(scale.y(mem.total), end) + 5, middle + 4, gib(mem.total) + (" \u2192" if cut else ""),
                      size=11, weight=weight, halo=True, cls="bar-value"))
    return parts

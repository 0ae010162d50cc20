"""SVG building blocks for the charts (``advisor.cli.charts``): escaping, a GiB axis, a legend, the
document and its HTML wrapper. Plain strings, no dependency, nothing fetched at view time (no
fonts, scripts or stylesheets from the network: the only URL is the SVG namespace)."""

from __future__ import annotations

import math
from xml.sax.saxutils import escape, quoteattr

from advisor.units import GIB

SVG_NS = "http://www.w3.org/2000/svg"
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
# One colour per memory category, shared by both charts (Tableau 10, colour-blind friendly order).
COLORS = {
    "params": "#4e79a7", "grads": "#f28e2b", "optimizer": "#e15759", "activations": "#59a14f",
    "temporary": "#edc948", "allocator_gap": "#bab0ac", "outside_allocator": "#79706e",
}
# The runtime overhead in its two parts: the allocator gap is calibrated (profiles/allocator_overhead.json),
# the CUDA context and NCCL buffers measured on an H100 at world size 1, assumed elsewhere (--context-gib).
LABELS = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer state",
          "activations": "activations", "temporary": "temporary buffers",
          "allocator_gap": "allocator gap (calibrated)", "outside_allocator": "context + NCCL"}


def attr(value: object) -> str:
    """An XML attribute value, quoted and escaped."""
    return quoteattr(str(value))


def text(x: float, y: float, content: str, *, size: int = 12, anchor: str = "start", cls: str = "",
         weight: str = "normal", fill: str = "#222", rotate: float | None = None, extra: str = "",
         halo: bool = False) -> str:
    """A label; ``halo`` outlines it in white so it stays readable over lines and bars."""
    turn = f' transform="rotate({rotate:g} {x:.1f} {y:.1f})"' if rotate else ""
    if halo:
        extra += ' stroke="white" stroke-width="3" stroke-linejoin="round" paint-order="stroke"'
    klass = f" class={attr(cls)}" if cls else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" '
            f'fill="{fill}"{klass}{turn}{extra}>{escape(content)}</text>')


def gib(n_bytes: int) -> str:
    return f"{n_bytes / GIB:.2f} GiB"


def tick_step(top_bytes: int, *, ticks: int = 6) -> float:
    """A round step in GiB (1, 2 or 5 times a power of ten) giving about ``ticks`` gridlines up to ``top_bytes``."""
    raw = max(top_bytes / GIB, 1e-9) / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)


class Scale:
    """Bytes to a pixel on one axis: ``bottom`` is zero's, ``top`` is ``max_bytes``'s (a y axis grows
    upward, so its ``top`` is the smaller pixel; on an x axis ``bottom`` is the left end)."""

    def __init__(self, max_bytes: int, *, top: float, bottom: float) -> None:
        self.max_bytes, self.top, self.bottom = max(max_bytes, 1), top, bottom

    def y(self, n_bytes: float) -> float:
        return self.bottom - (self.bottom - self.top) * n_bytes / self.max_bytes


def y_axis(scale: Scale, *, left: float, right: float, label: str) -> str:
    """Gridlines and tick labels in GiB, and the axis title."""
    step = tick_step(scale.max_bytes)
    parts = []
    count = int(scale.max_bytes / GIB / step + 1e-9)
    for i in range(count + 1):
        y = scale.y(i * step * GIB)
        parts.append(f'<line x1="{left:.1f}" x2="{right:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd" stroke-width="1"/>')
        parts.append(text(left - 6, y + 4, f"{i * step:g}", size=11, anchor="end", cls="tick"))
    middle = (scale.top + scale.bottom) / 2
    parts.append(text(left - 48, middle, label, size=12, anchor="middle", rotate=-90))
    parts.append(f'<line x1="{left:.1f}" x2="{left:.1f}" y1="{scale.top:.1f}" y2="{scale.bottom:.1f}" stroke="#888"/>')
    parts.append(f'<line x1="{left:.1f}" x2="{right:.1f}" y1="{scale.bottom:.1f}" y2="{scale.bottom:.1f}" stroke="#888"/>')
    return "\n".join(parts)


def x_axis(scale: Scale, *, top: float, bottom: float, label: str) -> str:
    """A horizontal GiB axis (``scale`` maps bytes to x): vertical gridlines, tick labels above the plot,
    the axis title above them."""
    step = tick_step(scale.max_bytes)
    parts = []
    count = int(scale.max_bytes / GIB / step + 1e-9)
    for i in range(count + 1):
        x = scale.y(i * step * GIB)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top:.1f}" y2="{bottom:.1f}" stroke="#ddd" stroke-width="1"/>')
        parts.append(text(x, top - 6, f"{i * step:g}", size=11, anchor="middle", cls="tick"))
    parts.append(text((scale.bottom + scale.top) / 2, top - 24, label, size=12, anchor="middle"))
    parts.append(f'<line x1="{scale.bottom:.1f}" x2="{scale.bottom:.1f}" y1="{top:.1f}" y2="{bottom:.1f}" stroke="#888"/>')
    return "\n".join(parts)


def legend(entries: list[tuple[str, str]], *, x: float, y: float, title: str = "") -> str:
    """Colour swatches with labels, one per line, from (colour, label) pairs."""
    parts = [text(x, y, title, size=12, weight="bold")] if title else []
    for i, (color, label) in enumerate(entries):
        top = y + 10 + i * 20
        parts.append(f'<rect x="{x:.1f}" y="{top:.1f}" width="14" height="14" fill="{color}"/>')
        parts.append(text(x + 20, top + 11, label, size=12))
    return "\n".join(parts)


def document(body: str, *, width: int, height: int, title: str) -> str:
    return (f'<svg xmlns="{SVG_NS}" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'font-family={attr(FONT)}>\n<title>{escape(title)}</title>\n'
            f'<rect width="{width}" height="{height}" fill="white"/>\n{body}\n</svg>\n')


def as_file(svg: str, path: str, *, title: str) -> str:
    """The SVG as written to ``path``: the SVG itself, or inside a bare HTML page for .html / .htm."""
    if not path.lower().endswith((".html", ".htm")):
        return svg
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>{escape(title)}</title></head>\n'
            f'<body style="margin:16px;background:#fff">\n{svg}</body>\n</html>\n')

"""One rank's memory over the simulated step, segment by segment: the data behind ``--timeline``.

``Timeline`` is a list of ``Segment``s in execution order: the forward of each top-level module on
the path to the blocks (embeddings, each block, the final norm, the head), the loss, the backward
of each of them in reverse, and the optimizer step. Each segment holds the per-category bytes at
its highest point (``peak``) and at its end (``end``). The highest point is read after every
operation the memory tracker sees, at the moment the tracker's own peak is updated, so the
largest segment peak is exactly the step's measured peak (``SimulatedStep.peak_allocated``).

``TimelineRecorder`` fills it during the simulated step (``advisor.simulate.step``): a second
``ModTracker`` (torch.distributed._tools.mod_tracker) gives forward and backward hooks on every
module, of which the recorder keeps the segment boundaries. Rendering lives in
``advisor.cli.charts``; this module imports torch only inside the recorder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from advisor.frozen import validated_copy

CATEGORIES = ("params", "grads", "optimizer", "activations", "temporary")
SegmentPhase = Literal["forward", "loss", "backward", "optimizer_step"]


class CategoryBytes(BaseModel):
    """Live bytes by category, as ``SimulatedStep`` splits its peak."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    params: int = 0
    grads: int = 0
    optimizer: int = 0
    activations: int = 0
    temporary: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, name) for name in CATEGORIES)


class Segment(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    phase: SegmentPhase
    label: str = Field(description="What ran: 'block 3', a module name ('embed_tokens', 'lm_head'), "
                                   "'loss' or 'optimizer step'.")
    block: int | None = Field(default=None, description="The block's index, for a block's segment.")
    peak: CategoryBytes = Field(description="Live bytes at the segment's highest point.")
    end: CategoryBytes = Field(description="Live bytes when the segment ended.")


class Timeline(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    segments: tuple[Segment, ...]
    num_blocks: int

    @property
    def peak_bytes(self) -> int:
        return max(s.peak.total for s in self.segments)


class TimelineRecorder:
    """Cuts the measured step into segments at module hooks and phase marks.

    ``read()`` returns the live bytes by category (from the memory tracker); ``stops`` maps the id
    of each module that opens a segment to its label and block index. Call ``on_op`` after every
    operation the tracker counts (``watch`` arranges it), ``mark(phase)`` at the end of each phase.
    """

    def __init__(self, read: Callable[[], dict[str, int]], stops: dict[int, tuple[str, int | None]],
                 *, extra: CategoryBytes | None = None) -> None:
        self._read = read
        self._stops = stops
        self._extra = extra or CategoryBytes()  # memory outside the tracked step (DDP buckets)
        self._segments: list[Segment] = []
        self._open: tuple[str, int | None, int | None] = ("", None, None)  # label, block, module id
        self._phase: SegmentPhase = "forward"
        self._high = self._live()

    def _live(self) -> dict[str, int]:
        live = self._read()
        return {name: live.get(name, 0) + getattr(self._extra, name) for name in CATEGORIES}

    def on_op(self) -> None:
        live = self._live()
        if sum(live.values()) > sum(self._high.values()):
            self._high = live

    def _close(self, label: str, block: int | None, phase: SegmentPhase) -> None:
        """End the open segment. Time between two modules (a mask, FSDP's post-backward reduce-scatter)
        is part of the segment before it; before the first module of a phase, part of the one after."""
        end = CategoryBytes(**self._live())
        peak = CategoryBytes(**self._high) if sum(self._high.values()) >= end.total else end
        last = self._segments[-1] if self._segments else None
        if label:
            self._segments.append(Segment(phase=phase, label=label, block=block, peak=peak, end=end))
        elif last is not None and last.phase == phase:
            bigger = peak if peak.total > last.peak.total else last.peak
            self._segments[-1] = validated_copy(last, {"peak": bigger, "end": end})
        else:
            return  # carry the highest point into the next segment
        self._high = end.model_dump()

    def _enter(self, module: Any, phase: SegmentPhase) -> None:
        stop = self._stops.get(id(module))
        if stop is None:
            return
        label, block, _ = self._open
        if self._phase == "loss":  # the loss's backward runs before any module's backward starts
            self._close("loss backward", None, "loss")
        else:
            self._close(label, block, self._phase)
        self._phase = phase
        self._open = (stop[0], stop[1], id(module))

    def _leave(self, module: Any) -> None:
        label, block, opened = self._open
        if module is not None and id(module) == opened:
            self._close(label, block, self._phase)
            self._open = ("", None, None)

    def mark(self, phase: str) -> None:
        """The end of a phase of the step: 'forward' (the loss is computed), 'backward', 'optimizer_step'."""
        label, block, _ = self._open
        if phase == "forward":  # what ran after the last module's forward is the loss
            if label:
                self._close(label, block, "forward")
            self._close("loss", None, "loss")
            self._phase = "loss"
        elif phase == "backward":
            self._close(label, block, "backward")
            self._phase = "optimizer_step"
        else:
            self._close("optimizer step", None, "optimizer_step")
        self._open = ("", None, None)

    def timeline(self) -> Timeline:
        return Timeline(segments=tuple(self._segments),
                        num_blocks=sum(1 for _, block in self._stops.values() if block is not None))

    @contextlib.contextmanager
    def watch(self, tracker: Any) -> Iterator[TimelineRecorder]:
        """Hooks on every module (a ModTracker of our own) and a call after every operation the tracker
        counts (wrapping its ``_update_peak_stats``, where it updates its own peak), while inside."""
        from torch.distributed._tools.mod_tracker import ModTracker

        original = tracker._update_peak_stats

        def update_peak_stats(*args: Any, **kwargs: Any) -> None:
            original(*args, **kwargs)
            self.on_op()

        hooks = ModTracker()

        def forward_hook(module: Any, *_: Any) -> None:
            if not hooks.is_bw:  # a checkpointed block's recompute belongs to its backward
                self._enter(module, "forward")

        def forward_post_hook(module: Any, *_: Any) -> None:
            if not hooks.is_bw:
                self._leave(module)

        hooks.register_user_hooks(forward_hook, forward_post_hook, lambda module, _: self._enter(module, "backward"),
                                  lambda module, _: self._leave(module))
        tracker._update_peak_stats = update_peak_stats
        try:
            with hooks:
                self._high = self._live()  # what the tracker holds as it starts
                yield self
        finally:
            del tracker._update_peak_stats


def segment_stops(net: Any, blocks: list[Any]) -> dict[int, tuple[str, int | None]]:
    """The modules that open a segment: each block, and every other child with parameters of the modules
    on the path from the root to the blocks (embeddings, final norm, head), labelled by attribute name."""
    stops: dict[int, tuple[str, int | None]] = {id(b): (f"block {i}", i) for i, b in enumerate(blocks)}
    block_ids = set(stops)
    holders = {id(m) for m in net.modules()
               if id(m) not in block_ids and any(id(c) in block_ids for c in m.modules())}
    for module in net.modules():
        if id(module) not in holders:
            continue
        for name, child in module.named_children():
            # Parameterless ones (rotary tables, dropout) join the segment before them.
            if id(child) not in holders and id(child) not in block_ids and next(child.parameters(), None) is not None:
                stops[id(child)] = (name, None)
    return stops

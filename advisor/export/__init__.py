"""Export a plan as a launcher or framework config: one module per format, one row per format.

The formats are the rows of ``advisor.export.formats.FORMAT_TABLE`` (name, what it can express, its
mesh support, its recipe, its module); ``FORMATS`` joins each row with its module's ``build`` (plan ->
dict, list or str), ``render`` (plan -> file text) and ``render_target`` (resolved target -> file text).
What gets written is decided once in ``target.py`` (``resolve_target`` for a plan, ``cpu_target`` for the
CPU test config, which needs no GPU plan); files are written by ``write.py``. Importing this package
imports PyYAML (through ``accelerate.py``); ``advisor plan`` never imports it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from advisor.export.formats import FORMAT_TABLE, ExportFormatRow, get_format_row
from advisor.export.target import ExportOptions, ExportTarget, cpu_target, resolve_target
from advisor.model.spec import ModelSpec
from advisor.planning.api import Plan
from advisor.training import TrainingConfig

# (target, model, options) -> file text
TargetRenderer = Callable[[ExportTarget, ModelSpec, ExportOptions | None], str]


@dataclass(frozen=True)
class ExportFormat:
    """A format table row with its module's renderers."""

    row: ExportFormatRow
    build: Callable[[Plan, ExportOptions | None], Any]
    render: Callable[[Plan, ExportOptions | None], str]
    render_target: TargetRenderer

    @property
    def name(self) -> str:
        return self.row.name

    @property
    def default_filename(self) -> str:
        return self.row.default_filename

    @property
    def summary(self) -> str:
        return self.row.summary


def _join(row: ExportFormatRow) -> ExportFormat:
    module = importlib.import_module(row.module)
    return ExportFormat(row, module.build, module.render, module.render_target)


FORMATS: dict[str, ExportFormat] = {row.name: _join(row) for row in FORMAT_TABLE}


def get_format(name: str) -> ExportFormat:
    """The format called ``name``; ValueError naming the choices otherwise."""
    return FORMATS[get_format_row(name).name]


def export_text(plan: Plan, fmt: str, options: ExportOptions | None = None) -> tuple[str, ExportTarget]:
    """The file text for ``fmt`` and the target it describes (its ``notes`` are for the user)."""
    export_format = get_format(fmt)
    target = resolve_target(plan, export_format.name, options)
    return export_format.render_target(target, plan.model, options), target


def export_cpu_text(model: ModelSpec, training: TrainingConfig, fmt: str, options: ExportOptions, *,
                    strategy: str | None = None) -> tuple[str, ExportTarget]:
    """The CPU test config (``options.cpu``) for ``fmt``: no GPU plan is made (``cpu_target``)."""
    export_format = get_format(fmt)
    target = cpu_target(model, training, export_format.name, options, strategy=strategy)
    return export_format.render_target(target, model, options), target


__all__ = ["FORMATS", "ExportFormat", "ExportOptions", "ExportTarget", "cpu_target", "export_cpu_text", "export_text",
           "get_format", "resolve_target"]

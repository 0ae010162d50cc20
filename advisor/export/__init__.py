"""Export a plan as a launcher or framework config: one module per format, registered here.

``FORMATS`` maps a format name (the CLI's ``--format`` choices) to its builder (plan -> dict, list
or str), its renderer (plan -> file text) and its default file name. What gets written is decided
once in ``target.py``; files are written by ``write.py``. Importing this package imports PyYAML
(through ``accelerate.py``); ``advisor plan`` never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from advisor.planning.api import Plan
from advisor.export.accelerate import build_accelerate, render_accelerate
from advisor.export.deepspeed import build_deepspeed, render_deepspeed
from advisor.export.lightning import build_lightning, render_lightning
from advisor.export.target import ExportOptions, ExportTarget, FormatName, resolve_target
from advisor.export.torchrun import build_torchrun, render_torchrun
from advisor.export.trainer import build_trainer_args, render_trainer_args


@dataclass(frozen=True)
class ExportFormat:
    name: FormatName
    build: Callable[[Plan, ExportOptions | None], Any]
    render: Callable[[Plan, ExportOptions | None], str]
    default_filename: str
    summary: str


FORMATS: dict[str, ExportFormat] = {
    f.name: f
    for f in (
        ExportFormat("accelerate", build_accelerate, render_accelerate, "accelerate_config.yaml",
                     "accelerate launch --config_file YAML"),
        ExportFormat("deepspeed-json", build_deepspeed, render_deepspeed, "ds_config.json", "DeepSpeed JSON config"),
        ExportFormat("torchrun", build_torchrun, render_torchrun, "launch.sh", "torchrun command line (shell)"),
        ExportFormat("trainer-args", build_trainer_args, render_trainer_args, "training_args.json",
                     "Hugging Face TrainingArguments keys (JSON)"),
        ExportFormat("lightning", build_lightning, render_lightning, "lightning_strategy.py",
                     "Lightning strategy snippet (Python)"),
    )
}


def get_format(name: str) -> ExportFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown export format '{name[:40]}'; choose from {', '.join(FORMATS)}") from None


def export_text(plan: Plan, fmt: str, options: ExportOptions | None = None) -> tuple[str, ExportTarget]:
    """The file text for ``fmt`` and the target it describes (its ``notes`` are for the user)."""
    export_format = get_format(fmt)
    return export_format.render(plan, options), resolve_target(plan, export_format.name, options)


__all__ = ["FORMATS", "ExportFormat", "ExportOptions", "ExportTarget", "export_text", "get_format", "resolve_target"]

"""Export a plan as a launcher or framework config: one module per format, registered here.

``FORMATS`` maps a format name (the CLI's ``--format`` choices) to its builder (plan -> dict, list
or str), its renderer (plan -> file text), its target renderer (resolved target -> file text) and
its default file name. What gets written is decided once in ``target.py`` (``resolve_target`` for
a plan, ``cpu_target`` for the CPU test config, which needs no GPU plan); files are written by
``write.py``. Importing this package imports PyYAML
(through ``accelerate.py``); ``advisor plan`` never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from advisor.export.accelerate import accelerate_text, build_accelerate, render_accelerate
from advisor.export.deepspeed import build_deepspeed, deepspeed_text, render_deepspeed
from advisor.export.lightning import build_lightning, lightning_text, render_lightning
from advisor.export.target import ExportOptions, ExportTarget, FormatName, cpu_target, resolve_target
from advisor.export.torchrun import build_torchrun, render_torchrun, torchrun_text
from advisor.export.trainer import build_trainer_args, render_trainer_args, trainer_text
from advisor.model.spec import ModelSpec
from advisor.planning.api import Plan
from advisor.training import TrainingConfig

# (target, model, options) -> file text
TargetRenderer = Callable[[ExportTarget, ModelSpec, ExportOptions | None], str]


@dataclass(frozen=True)
class ExportFormat:
    name: FormatName
    build: Callable[[Plan, ExportOptions | None], Any]
    render: Callable[[Plan, ExportOptions | None], str]
    render_target: TargetRenderer
    default_filename: str
    summary: str


FORMATS: dict[str, ExportFormat] = {
    f.name: f
    for f in (
        ExportFormat("accelerate", build_accelerate, render_accelerate,
                     lambda target, model, options: accelerate_text(target, options), "accelerate_config.yaml",
                     "accelerate launch --config_file YAML"),
        ExportFormat("deepspeed-json", build_deepspeed, render_deepspeed,
                     lambda target, model, options: deepspeed_text(target, model), "ds_config.json",
                     "DeepSpeed JSON config"),
        ExportFormat("torchrun", build_torchrun, render_torchrun,
                     lambda target, model, options: torchrun_text(target, options), "launch.sh",
                     "torchrun command line (shell)"),
        ExportFormat("trainer-args", build_trainer_args, render_trainer_args,
                     lambda target, model, options: trainer_text(target, model), "training_args.json",
                     "Hugging Face TrainingArguments keys (JSON)"),
        ExportFormat("lightning", build_lightning, render_lightning,
                     lambda target, model, options: lightning_text(target), "lightning_strategy.py",
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

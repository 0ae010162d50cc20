"""A ``torchrun`` command line for a plan, rendered as a small shell script.

torchrun only starts processes (one per GPU, ``torch.distributed.run``); the strategy itself is
the script's job (``wrappers.wrap()``, or the script's own DDP/FSDP/DeepSpeed code), so the header
states it. Several nodes use static rendezvous (``--master-addr/--master-port/--node-rank``, the
same scheme as the accelerate config's ``rdzv_backend: static``), with marked placeholders.
"""

from __future__ import annotations

import shlex

from advisor.model.spec import ModelSpec
from advisor.planning.api import Plan
from advisor.export.target import (
    DEFAULT_PORT, PLACEHOLDER_IP, PLACEHOLDER_RANK, ExportOptions, ExportTarget, resolve_target,
)


def build_torchrun(plan: Plan, options: ExportOptions | None = None) -> list[str]:
    """The argv: ``torchrun --nproc-per-node N --nnodes M ... train.py args``."""
    return torchrun_argv(resolve_target(plan, "torchrun", options), options)


def torchrun_argv(target: ExportTarget, options: ExportOptions | None = None) -> list[str]:
    """``build_torchrun`` for a resolved target."""
    options = options or ExportOptions()
    argv = ["torchrun", "--nproc-per-node", str(target.gpus_per_node), "--nnodes", str(target.num_nodes)]
    if target.multi_node:
        argv += ["--node-rank", PLACEHOLDER_RANK, "--master-addr", PLACEHOLDER_IP, "--master-port", str(DEFAULT_PORT)]
    else:
        argv += ["--standalone"]  # single node: a free port and a local rendezvous, nothing to fill in
    return argv + [options.script, *options.script_args]


def render_torchrun(plan: Plan, options: ExportOptions | None = None) -> str:
    return torchrun_text(resolve_target(plan, "torchrun", options), options)


def torchrun_text(target: ExportTarget, options: ExportOptions | None = None) -> str:
    """``render_torchrun`` for a resolved target."""
    argv = torchrun_argv(target, options)
    per = "process" if target.cpu else "GPU"
    lines = ["#!/usr/bin/env bash", f"# torchrun command written by dp-advisor: {target.summary}.",
             "# torchrun starts the processes; the script applies the strategy (e.g. wrappers.wrap()).",
             f"# Per-{per} batch size in the script: {target.micro_batch_size}."]
    lines += [f"# {note}" for note in target.notes]
    if target.multi_node:
        lines.append(f"# Run on each of the {target.num_nodes} nodes after filling in {PLACEHOLDER_RANK} "
                     f"(0..{target.num_nodes - 1}) and {PLACEHOLDER_IP} (the rank-0 node).")
    if target.cpu:
        lines.append("# CPU test: the script must use the gloo backend.")
    lines += ["set -euo pipefail", shlex.join(argv) + ' "$@"']
    return "\n".join(lines) + "\n"


# The format table's interface (advisor.export.formats: this module is a row's ``module``).
build, render = build_torchrun, render_torchrun


def render_target(target: ExportTarget, model: ModelSpec, options: ExportOptions | None = None) -> str:
    """The file text for a resolved target (``advisor.export.export_text``)."""
    return torchrun_text(target, options)

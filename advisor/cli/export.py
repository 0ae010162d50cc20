"""``advisor export`` and ``advisor launch``: the plan written as a launcher config, and run.

A thin skin like ``cli.py``: parse options, call ``advisor.planning.api.plan``, render with
``advisor.export``, write with ``advisor.export.write``, launch with ``advisor.export.launch``. Bad input
raises ``ValueError`` (``cli.main`` prints one line, exit code 2). Registered on the ``advisor``
group in ``cli.py``; the export modules (PyYAML) are imported only when a command runs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from advisor.cli.options import plan_kwargs, plan_options
from advisor.export.formats import FORMAT_NAMES  # the format table (pure data: no yaml import)

def _differs(path: str, text: str) -> bool:
    """An existing file at ``path`` whose contents are not ``text`` (what the launch would refuse without --force)."""
    try:
        return Path(path).is_file() and Path(path).read_text() != text
    except (OSError, UnicodeDecodeError):
        return True


def _script_problem(script: str, *, here: bool = False) -> str | None:
    """Why ``script`` is not a training script advisor launch can run (None: a file), as the refusal says it."""
    path = Path(script)
    if path.is_file():
        return None
    if path.is_dir():
        return "a directory, not a file"
    return "not a regular file (a pipe or device)" if path.exists() else "no such file" + (" here" if here else "")


# --config-file's refusals: launch writes a file accelerate reads, and has no stdout to offer instead (advisor export has)
_CONFIG_FILE = {"example": "accelerate_config.yaml", "stdout": None}


def _plan(params: dict[str, Any], fmt: str):
    """Call ``advisor.planning.api.plan`` with only the options the user gave (shared parsing: cli_options),
    on the format's own recipe unless ``--recipe`` is given: the exported run is the run that was planned."""
    from advisor.export.formats import format_plan_options
    from advisor.planning.api import plan

    kwargs = format_plan_options(fmt, plan_kwargs(params))
    _refuse_pins_the_format_cannot_write(fmt, kwargs)
    return plan(**kwargs)


def _refuse_pins_the_format_cannot_write(fmt: str, kwargs: dict[str, Any]) -> None:
    """A pinned degree the format cannot carry: the format's own reason (and which format can), before its recipe's
    plan refuses the same degree for the stack that runs it."""
    from advisor.export.formats import get_format_row

    row = get_format_row(fmt)
    staged = any(kwargs.get(key) is not None for key in ("pp_schedule", "virtual_stages", "pp_layers"))
    pinned = [dim for dim, key in (("tp", "tp"), ("cp", "cp"), ("dp_replicate", "hybrid"), ("pp", "pp"), ("ep", "ep"))
              if (kwargs.get(key) or 1) > 1 or (dim == "pp" and staged)]
    missing = [dim for dim in pinned if dim not in row.mesh_dims]
    if set(missing) & {"pp", "ep"}:
        raise ValueError(f"the {fmt} format cannot express the pinned {' and '.join(missing)} (pipeline / expert "
                         f"parallelism): {row.pp_ep_gap}")
    if missing:
        raise ValueError(f"the {fmt} format cannot express the pinned {' and '.join(missing)}: {row.mesh_gap}")


def _recipe_note(params: dict[str, Any], fmt: str, target, path: str | None = None) -> None:
    """After a successful export: which recipe planned it, when the format chose it (bad input stays one line), and
    the command that shows this plan: where the file runs DeepSpeed with its launcher's defaults, which the plan
    assumed (``format_plan_options``) and no plan option asks for, ``advisor plan --from`` the file."""
    from advisor.export.formats import get_format_row

    row = get_format_row(fmt)
    if params.get("recipe") is None:
        with_defaults = target.engine == "deepspeed" and row.zero_defaults is not None
        shows = (f"advisor plan --from {path or 'THE_FILE'} ... shows this plan, with {row.zero_defaults}'s DeepSpeed "
                 "defaults" if with_defaults else f"advisor plan ... --recipe {row.recipe} shows this plan")
        click.echo(f"advisor: note: planned with recipe {row.recipe}, the stack that runs --format {fmt} ({shows}; "
                   "--recipe to choose another)", err=True)


# plan() arguments that are not TrainingConfig fields
_NOT_TRAINING = ("model", "gpus", "nodes", "interconnect", "trainable_params", "strategy", "trust_remote_code", "tp",
                 "cp", "hybrid", "trace", "cache_dir")


def _options(*, cpu: bool, hybrid: str | int | None, processes: int | None, script: str = "train.py",
             script_args: tuple[str, ...] = ()):
    """Export options; ``--hybrid N`` pins the plan's mesh (the export writes it), ``on|off`` check it."""
    from advisor.export import ExportOptions

    hybrid = hybrid if isinstance(hybrid, str) else "auto"
    if processes is not None and not cpu:
        click.echo("advisor: warning: --processes sets the --cpu test config's processes; ignored without --cpu "
                   "(one process per GPU)", err=True)
    return ExportOptions(cpu=cpu, hybrid=hybrid, processes=processes or 2, script=script,
                         script_args=tuple(script_args))


def _export_text(params: dict[str, Any], fmt: str, options):
    """The file text and target: from the plan, or for ``--cpu`` the CPU test config (no GPU plan)."""
    from advisor.export import export_cpu_text, export_text

    if not options.cpu:
        return export_text(_plan(params, fmt), fmt, options)
    from advisor.model.sources import resolve_model
    from advisor.planning.api import resolve_trainable, training_from_options

    ignored = [f"--{name}" for name in ("gpus", "nodes", "interconnect") if params.get(name)]
    if ignored:
        click.echo(f"advisor: warning: {', '.join(ignored)} ignored with --cpu: the CPU test config runs "
                   f"{options.processes} processes on this machine (--processes)", err=True)
    kwargs = plan_kwargs(params, need_gpus=False)
    if kwargs.get("seq_len") == "max":
        raise ValueError("--seq-len max searches the GPUs' memory, and the --cpu test config plans no GPU: give a "
                         "length (--seq-len N)")
    spec = resolve_trainable(resolve_model(kwargs["model"], trust_remote_code=kwargs["trust_remote_code"]),
                             kwargs["trainable_params"])
    training = training_from_options({k: v for k, v in kwargs.items() if k not in _NOT_TRAINING})
    return export_cpu_text(spec, training, fmt, options, strategy=kwargs["strategy"])


def _echo_notes(notes: tuple[str, ...]) -> None:
    for note in notes:
        click.echo(f"advisor: note: {note}", err=True)


_CPU = click.option("--cpu", is_flag=True,
                    help="A CPU-only test config: DDP on gloo, fp32, on this machine (no --gpus needed).")
_PROCESSES = click.option("--processes", type=click.IntRange(1, 1024), default=None,
                          help="Processes of the --cpu test config (default 2).")


@click.command()
@plan_options
@click.option("-o", "--output", default=None, help="File to write ('-' for stdout; default per format).")
@click.option("--format", "fmt", type=click.Choice(FORMAT_NAMES), default="accelerate", show_default=True)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@_CPU
@_PROCESSES
def export(output: str | None, fmt: str, force: bool, cpu: bool, processes: int | None, **params: Any) -> None:
    """Write the recommended strategy as a launcher config (accelerate YAML by default)."""
    from advisor.export import get_format
    from advisor.export.write import write_or_keep, written

    text, target = _export_text(params, fmt, _options(cpu=cpu, hybrid=params.get("hybrid"), processes=processes))
    if output == "-":
        click.echo(text, nl=False)
        _echo_notes(target.notes)
        if not cpu:
            _recipe_note(params, fmt, target)
        return
    if output is not None and not output.strip():
        raise ValueError("-o/--output is empty: give a file name, or - for stdout")
    path, changed = write_or_keep(get_format(fmt).default_filename if output is None else output, text, force=force)
    _echo_notes(target.notes)
    if not cpu:
        _recipe_note(params, fmt, target, str(path))
    click.echo(f"{written(path, changed)} ({fmt}: {target.strategy} on {target.engine}, {target.world_size} "
               f"process{'es' if target.world_size != 1 else ''})")


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@plan_options
@click.option("--config-file", default="accelerate_config.yaml", show_default=True,
              help="Where to write the accelerate config that is launched.")
@click.option("--force", is_flag=True, help="Overwrite an existing, different config file.")
@click.option("--dry-run", is_flag=True, help="Print the command; write no config and run nothing.")
@_CPU
@_PROCESSES
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def launch(config_file: str, force: bool, dry_run: bool, cpu: bool, processes: int | None, script: str,
           script_args: tuple[str, ...], **params: Any) -> None:
    """Plan, write the accelerate config, and run SCRIPT under `accelerate launch`."""
    from advisor.export.write import check_writable, write_export
    from advisor.export.launch import build_launch_command, check_launchable, cuda_refusal, find_placeholders, \
        format_command, local_gpus, parse_config, run_launch

    if script.startswith("-"):  # an option click did not know, taken for the script: accelerate's own
        raise ValueError(f"{script} {' '.join(script_args[:1])}: advisor launch does not pass options to accelerate "
                         "(the written config sets them, from the plan: use --processes with --cpu, --gpus "
                         "otherwise); the script comes first, then its own arguments")
    if config_file == "-" or not config_file.strip():  # accelerate reads the config from a file
        raise ValueError(f"--config-file {config_file or repr(config_file)}: advisor launch writes the config to a file "
                         "that accelerate reads; give a file name (advisor export -o - prints the config)")
    try:  # what the launch refuses to write, refused by --dry-run too (before seconds of planning)
        check_writable(config_file, **_CONFIG_FILE)
    except ValueError as err:
        raise ValueError(f"--config-file {config_file}: {err}") from None
    options = _options(cpu=cpu, hybrid=params.get("hybrid"), processes=processes, script=script,
                       script_args=script_args)
    text, target = _export_text(params, "accelerate", options)
    config = parse_config(text, where=config_file)
    command = build_launch_command(config_file, script, script_args)
    refusal = cuda_refusal(config, local_gpus())
    if dry_run:  # writes nothing: the next launch with other options must not find a stale config
        _echo_notes(target.notes)
        missing = find_placeholders(config)
        if missing:
            click.echo(f"advisor: note: fill in {', '.join(missing)} in {config_file} before launching", err=True)
        if refusal:
            click.echo(f"advisor: note: advisor launch would refuse to run this here: {refusal}", err=True)
        problem = _script_problem(script, here=True)
        if problem:
            click.echo(f"advisor: note: {script}: {problem}; advisor launch checks it before writing anything",
                       err=True)
        click.echo(f"advisor: note: --dry-run wrote nothing; advisor launch writes {config_file} (advisor export "
                   "-o - shows it)" + (", which exists with other contents: the launch needs --force to overwrite it"
                                       if not force and _differs(config_file, text) else ""), err=True)
        click.echo(format_command(command))
        return
    if refusal:  # before anything is written: a refused launch leaves the config on disk as it was
        raise ValueError(refusal)
    problem = _script_problem(script)
    if problem:
        raise ValueError(f"{script}: {problem} (the training script advisor launch runs)")
    path = write_export(config_file, text, force=force, **_CONFIG_FILE)
    _echo_notes(target.notes)
    check_launchable(path)
    click.echo(f"advisor: running {format_command(command)}", err=True)
    code = run_launch(command, config_path=path)
    if code:
        sys.exit(code)

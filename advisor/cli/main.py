"""The ``advisor`` command: a thin skin over the library. Parses options, calls the library,
renders. Exit codes: 0 ok, 2 bad input (one line on stderr), 3 nothing fits, 1 internal error."""

from __future__ import annotations

import json
import os
import sys
from importlib import import_module
from pathlib import Path

import click

from advisor.cli.options import EXIT_NOTHING_FITS, chart_path, plan_kwargs, plan_options, refuse_hybrid_switch

EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 1


def _fail(message: str, code: int) -> None:
    from advisor.cli.text import printable  # a file's key or an option's value may hold a NUL or an escape

    click.echo(f"advisor: error: {printable(' '.join(str(message).split()))}", err=True)
    sys.exit(code)


class LazyGroup(click.Group):
    """A group whose listed subcommands are imported only when named (click's documented pattern,
    "Lazily Loading Subcommands"): ``advisor plan`` never loads compare, simulate or export."""

    def __init__(self, *args, lazy_subcommands: dict[str, str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_subcommands = lazy_subcommands or {}  # name -> "module:attribute"

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_subcommands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_subcommands and cmd_name not in self.commands:
            module, _, attribute = self.lazy_subcommands[cmd_name].partition(":")
            self.add_command(getattr(import_module(module), attribute), name=cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             lazy_subcommands={"compare": "advisor.cli.compare:compare", "simulate": "advisor.cli.simulate:simulate",
                               "export": "advisor.cli.export:export", "launch": "advisor.cli.export:launch"})
@click.version_option(package_name="dp-advisor")
def cli() -> None:
    """Which data-parallel strategy should this training job use, and does it fit?

    \b
    advisor plan --model Qwen/Qwen2.5-7B --gpus 2xA100
    advisor inspect meta-llama/Llama-3.1-8B
    advisor gpus
    """


@cli.command()
@click.argument("model")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("--trust-remote-code", is_flag=True, help="Allow the model's own code to run (off by default).")
def inspect(model: str, as_json: bool, trust_remote_code: bool) -> None:
    """Describe MODEL: a bundled id, a local directory or config.json, a Hub id, or a size like 7.5B."""
    from advisor.estimate.activations import shape_of
    from advisor.model.sources import resolve_model

    from advisor.simulate.profile_cache import default_cache_dir

    # the meta-device count of a family without a formula is kept where plan keeps it (seconds; then milliseconds)
    spec = resolve_model(model, trust_remote_code=trust_remote_code, cache_dir=default_cache_dir(),
                         size_as="MODEL (a size)")
    note = shape_of(spec).note  # what the estimates cannot model from this description
    if as_json:
        doc = spec.model_dump()
        doc.update(frozen_params=spec.frozen_params, active_params=spec.active_params, note=note)
        click.echo(json.dumps(doc, indent=2))
        return
    from advisor.cli.render import print_table, spec_table

    print_table(spec_table(spec))
    if note:
        click.echo(f"note: {note}")


@cli.command()
@plan_options
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON document.")
@click.option("--verify", is_flag=True, help="Also run the chosen step in PyTorch (fake tensors, CPU) and compare; "
              "where the simulator cannot run it (offload, a mesh, a quantised base) the plan is printed with a note.")
@click.option("--chart", "chart_file", metavar="FILE", callback=chart_path,
              help="Also write the per-strategy bars to FILE (a name ending .svg or .html).")
@click.option("--force", is_flag=True, help="Overwrite an existing --chart file.")
@click.option("--verbose", "-v", is_flag=True, help="Also print memory per component, bars, every reason and assumption.")
def plan(as_json: bool, verify: bool, chart_file: str | None, force: bool, verbose: bool, from_file: str | None,
         **options) -> None:
    """Estimate per-GPU memory of every strategy and recommend one that fits.

    \b
    advisor plan --model Qwen/Qwen2.5-7B --gpus 2xA100
    advisor plan --params 70B --gpus 2x8xH100 --seq-len 4096 --json
    advisor plan -m meta-llama/Llama-3.1-8B -g 4xA10G --trainable-params 1% --strategy zero3
    advisor plan -m Qwen/Qwen2.5-7B -g A100 --from accelerate_config.yaml

    Exit code 3 when nothing fits (the output says how many of these GPUs would).
    """
    from advisor.planning.api import plan as make_plan

    refuse_hybrid_switch(options)
    read = None
    if from_file is not None:  # a shared plan option; read here too so the values taken can be shown
        from advisor.cli.from_file import apply_config_file

        options, read = apply_config_file(from_file, options)
    kwargs = plan_kwargs(options)  # --policy is a shared plan option (advisor/cli/options.py)
    tracing = TraceProgress(str(kwargs.get("model") or "the model"))
    try:
        result = make_plan(**kwargs, progress=tracing)
    except ValueError as exc:  # an option the file set: say where it came from
        if read is None:
            raise
        from advisor.cli.from_file import from_file_origin
        from advisor.planning.smallest import NothingFits  # exit 3 stays exit 3

        kind = NothingFits if isinstance(exc, NothingFits) else ValueError
        raise kind(from_file_origin(str(exc), read)) from None
    tracing.finish()
    if chart_file:
        _write_chart(result, chart_file, force=force)
    checked = skipped = None
    if verify and result.recommendation is not None:
        from advisor.cli.simulate import verify_with_progress
        from advisor.simulate.verify import unverified_reason

        skipped = unverified_reason(result, strategy=kwargs.get("strategy"))  # the plan stands, unverified
        if skipped is None:
            checked = verify_with_progress(result, strategy=kwargs.get("strategy"))
        else:
            click.echo(f"note: --verify: not simulated: {skipped}", err=True)
    if as_json:
        doc = result.model_dump(mode="json")
        if checked is not None:
            doc["verification"] = checked.model_dump(mode="json")
        if skipped is not None:
            doc["verification_skipped"] = skipped
        if read is not None:
            from advisor.cli.from_file import from_file_doc

            doc["from_file"] = from_file_doc(read)
        click.echo(json.dumps(doc, indent=2))
    else:
        from advisor.cli.plan_view import print_plan

        if read is not None:
            from advisor.cli.from_file import render_from_file

            render_from_file(read)
        print_plan(result, verbose=verbose)
        if checked is not None:
            from advisor.cli.simulate import print_verification

            print_verification(checked)
    if result.recommendation is None:
        click.get_current_context().exit(EXIT_NOTHING_FITS)


class TraceProgress:
    """Tracing a family with no activation formula takes seconds: one line on stderr when it starts and
    one with the time it took (stdout stays the plan, or the one JSON document of --json). The library
    calls this with None when a trace starts and with its seconds when it ends (``advisor.plan(progress=)``)."""

    def __init__(self, model: str) -> None:
        self.model, self.seconds, self.started = model, 0.0, False

    def __call__(self, seconds: float | None) -> None:
        if seconds is None and not self.started:
            self.started = True
            click.echo(f"advisor: tracing {self.model}'s activations on fake tensors (no formula covers this job; "
                       "cached for the next plan)...", err=True)
        elif seconds is not None:
            self.seconds += seconds

    def finish(self) -> None:
        if self.started:
            click.echo(f"advisor: traced in {self.seconds:.1f} s", err=True)


def _write_chart(result, path: str, *, force: bool) -> None:
    from advisor.cli.charts import plan_svg
    from advisor.cli.svg import as_file
    from advisor.export.write import CHART, write_or_keep, written

    svg = plan_svg(result)
    click.echo(written(*write_or_keep(path, as_file(svg, path, title=f"{result.model.name}: memory by strategy"),
                                      force=force, **CHART)), err=True)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def gpus(as_json: bool) -> None:
    """List the bundled GPU profiles (figures from vendor datasheets, cited in profiles/gpus.json)."""
    from advisor.hardware.catalog import load_catalog

    catalog = load_catalog()
    if as_json:
        click.echo(json.dumps({"gpus": [g.model_dump() for g in catalog.gpus]}, indent=2))
        return
    from advisor.cli.render import gpu_table, print_table

    print_table(gpu_table(catalog.gpus, {i.name: i for i in catalog.interconnects}))
    defaults = ", ".join(f"{k} -> {v}" for k, v in sorted(catalog.defaults.ambiguous.items()))
    click.echo(f"Short names resolve to: {defaults}")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON document: each id with its architecture and counts.")
def models(as_json: bool) -> None:
    """List the bundled model ids (usable offline), with their size and family."""
    from advisor.model.bundled import bundled_model_ids
    from advisor.model.sources import resolve_model
    from advisor.model.spec import size_label

    specs = [resolve_model(model_id) for model_id in bundled_model_ids()]
    if as_json:
        keys = ("architecture", "model_type", "total_params", "num_layers", "hidden_size", "vocab_size",
                "max_position_embeddings")
        click.echo(json.dumps({"models": [{"id": spec.name, **{key: getattr(spec, key) for key in keys},
                                           "active_params": spec.active_params} for spec in specs]}, indent=2))
        return
    width = max(len(spec.name) for spec in specs)
    for spec in specs:
        click.echo(f"{spec.name:<{width}}  {size_label(spec.total_params):>7}  {spec.model_type or ''}")


def main(argv: list[str] | None = None) -> None:
    """Entry point: turn bad input into one line and exit code 2, our own bugs into one line and exit
    code 1, Ctrl-C into one line and exit code 130; never a traceback."""
    from pydantic import ValidationError

    try:
        code = cli.main(args=argv, prog_name="advisor", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        _fail("interrupted", 130)
    except click.exceptions.NoArgsIsHelpError as err:  # bare `advisor`: click's help page, as a click group prints it
        err.show()
        sys.exit(err.exit_code)
    except click.UsageError as err:
        hint = f" (see advisor {err.ctx.command_path.split(' ', 1)[-1]} --help)" if err.ctx and " " in err.ctx.command_path else " (see advisor --help)"
        _fail(err.format_message() + hint, EXIT_BAD_INPUT)
    except click.ClickException as err:
        _fail(err.format_message(), EXIT_BAD_INPUT)
    except ValidationError as err:  # the user's input is validated (and reworded) at the edges: this is ours
        _fail(_internal(err), EXIT_INTERNAL)
    except (ValueError, OSError) as err:
        # export, launch: no plan to write or run is "nothing fits" (plan and compare exit 3 themselves); the module
        # that defines it is loaded wherever a plan was made, and left unloaded otherwise (start-up)
        smallest = sys.modules.get("advisor.planning.smallest")
        nothing = smallest is not None and isinstance(err, smallest.NothingFits)
        _fail(str(err), EXIT_NOTHING_FITS if nothing else EXIT_BAD_INPUT)
    except RecursionError as err:
        _fail(_internal(err), EXIT_INTERNAL)
    except Exception as err:  # noqa: BLE001 - a bug: one line that says where, not a traceback
        _fail(_internal(err), EXIT_INTERNAL)
    if isinstance(code, int) and code:
        sys.exit(code)


def _internal(err: BaseException) -> str:
    """One line for a bug in dp-advisor: the exception, its first line, and the innermost frame of ours."""
    import traceback

    frames = [frame for frame in traceback.extract_tb(err.__traceback__)
              if "/advisor/" in frame.filename or "/wrappers/" in frame.filename]
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    first = (str(err).strip().splitlines() or [""])[0][:200]
    return (f"internal error ({type(err).__name__}: {first}){where}; this is a bug in dp-advisor, not in your "
            "input: please report it with the command line")


def console() -> None:
    """The ``advisor`` script: ``main()``, then, when the command imported torch (a traced plan, simulate,
    wrap checks), a direct exit once the output is flushed. The interpreter's teardown of torch and
    transformers costs 0.7-1.4 s of CPU (benchmarks/results/trace_speed.md) and does nothing a finished
    command needs: files are closed by their ``with`` blocks and child processes are joined."""
    try:
        main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if "torch" not in sys.modules:
        sys.exit(code)
    if code is not None and not isinstance(code, int):  # what sys.exit("message") would print
        print(code, file=sys.stderr)
        code = 1
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


if __name__ == "__main__":  # pragma: no cover
    console()

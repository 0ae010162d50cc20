"""``advisor plan --from FILE``: the settings a training config fixes, merged under the options typed.

The file is read by ``advisor.planning.config_formats.read_config_file`` (pure: no click); here its
settings become the plan options the user did not type, so an explicit option always wins over the
file (and the override is reported). Two settings need the cluster: the file's process count fills in
a ``--gpus NAME`` given without one (``--gpus A100`` + ``num_processes: 8`` plans 8 x A100), and a
gradient accumulation becomes ``--global-batch`` once the micro-batch and the data-parallel size are
known. ``render_from_file`` prints one line per value taken; ``from_file_doc`` is the ``--json`` section.
"""

from __future__ import annotations

from typing import Any

import click
from pydantic import BaseModel, ConfigDict

from advisor.cli.text import printable
from advisor.planning.config_file import ConfigFile
from advisor.training import MAX_GLOBAL_BATCH

# Settings that are not one plan option: the cluster size, and accumulation (it becomes --global-batch).
_CLUSTER = ("num_gpus", "nodes", "gradient_accumulation")


class Override(BaseModel):
    """A value the file gives that an option typed on the command line replaced."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    option: str
    file_value: str
    given: str


class FromFile(BaseModel):
    """What ``--from`` did: the file read, the values overridden, and the settings worked out from it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: ConfigFile
    overridden: tuple[Override, ...]
    derived: tuple[str, ...]


def flag(option: str) -> str:
    if option.startswith("zero."):  # no CLI flag: a DeepSpeed size the plan takes from the file
        return f"DeepSpeed {option.removeprefix('zero.')}"
    return {"num_gpus": "--gpus", "lora_rank": "--lora"}.get(option, f"--{option.replace('_', '-')}")


def shown(option: str, setting: int | str) -> str:
    """The typed options a file's setting stands for: a switch as its flag alone."""
    if option in ("activation_offload", "dora"):
        return flag(option)
    if option == "double_quant":
        return "--double-quant" if setting else "--no-double-quant"
    if option == "gradient_accumulation":
        return f"gradient accumulation {setting}"
    return f"{flag(option)} {setting}"


def apply_config_file(path: str, options: dict[str, Any], *, need_gpus: bool = True) -> tuple[dict[str, Any], FromFile]:
    """``options`` (parsed CLI values, None where not typed) with the file's settings filled in, and
    ``from_file`` cleared (it has been applied). ``need_gpus=False`` (the ``--cpu`` test config) leaves
    the GPUs alone: the file's process count and accumulation are not applied."""
    from advisor.planning.config_formats import read_config_file
    from advisor.planning.config_torchtune import UNMAPPED_MODEL

    config = read_config_file(path)
    merged, overridden, derived = {**options, "from_file": None}, [], []
    for option, setting in config.settings.items():
        if option in _CLUSTER or option == "global_batch":
            continue
        typed = options.get(option)
        if option == "model" and options.get("params") is not None:  # --params given: a size, not the file's model
            overridden.append(Override(option=option, file_value=str(setting), given=f"--params {options['params']}"))
            continue
        if option == "pp_layers":  # layer counts per pipeline rank, as --pp-layers parses them
            setting = tuple(int(part) for part in str(setting).split(","))
        if typed is None:
            merged[option] = str(setting) if option == "micro_batch" else setting
        elif str(typed).lower() != str(setting).lower():
            overridden.append(Override(option=option, file_value=str(setting), given=str(typed)))
    if config.settings.get("frozen_base") is not None and options.get("frozen_base") is None and \
            options.get("quantize") is not None:  # a typed quantised base: the file's dtype loads no weight it plans
        merged["frozen_base"] = None
        overridden.append(Override(option="frozen_base", file_value=str(config.settings["frozen_base"]),
                                   given=f"--quantize {options['quantize']}"))
    said = next((note for note in config.notes if UNMAPPED_MODEL in note), None)
    if said is not None and merged.get("model") is None and merged.get("params") is None:
        # the file names a model the planner does not map: say so, not only "give --model or --params"
        raise ValueError(f"--from {config.path}: {said} (a Hub id or a local config folder) or --params")
    if need_gpus or merged.get("gpus") is not None:
        _apply_implied_count(config, merged, derived)
        _apply_count(config, merged, overridden)
        _apply_global_batch(config, merged, overridden, derived)
        _apply_accumulation(config, merged, overridden, derived)
    return merged, FromFile(config=config, overridden=tuple(overridden), derived=tuple(derived))


def _gpus(merged: dict[str, Any]) -> str:
    if merged.get("gpus") is None:
        from advisor.cli.options import require_local_gpus

        merged["gpus"] = require_local_gpus()
    return merged["gpus"]


def _world_size(merged: dict[str, Any]) -> int:
    from advisor.hardware.cluster import parse_gpus

    return parse_gpus(_gpus(merged), nodes=merged.get("nodes"), interconnect=merged.get("interconnect")).world_size


def _apply_implied_count(config: ConfigFile, merged: dict[str, Any], derived: list[str]) -> None:
    """A file that gives no process count but its global batch, micro-batch and accumulation (a DeepSpeed JSON:
    DeepSpeed checks train_batch_size = micro-batch x accumulation x GPUs) implies its data-parallel GPUs: they fill
    in ``--gpus NAME`` as a file's process count does (one data-parallel rank a GPU: no tp, cp or pp typed)."""
    settings = config.settings
    total, micro, steps = (settings.get(key) for key in ("global_batch", "micro_batch", "gradient_accumulation"))
    if settings.get("num_gpus") is not None or None in (total, micro, steps) or merged.get("gpus") is None:
        return
    from advisor.hardware.cluster import has_count

    pinned = any((merged.get(key) or 1) > 1 for key in ("tp", "cp", "pp"))
    world, rest = divmod(int(total), int(micro) * int(steps))
    if has_count(_gpus(merged)) or pinned or rest or world < 1 or str(merged.get("micro_batch")) != str(micro):
        return
    merged["gpus"] = f"{world}x{_gpus(merged).strip()}"
    derived.append(f"{world} GPU{'s' if world != 1 else ''}: its global batch {total} over micro-batch {micro} x "
                   f"gradient accumulation {steps} (--gpus NAME without a count takes them)")


def _apply_count(config: ConfigFile, merged: dict[str, Any], overridden: list[Override]) -> None:
    """The file's process count: fills in ``--gpus NAME``; a count typed in ``--gpus`` wins."""
    settings = config.settings
    world, nodes = settings.get("num_gpus"), settings.get("nodes")
    if world is None:
        return
    from advisor.hardware.cluster import has_count

    gpus = _gpus(merged)
    if merged.get("nodes") is not None and int(merged["nodes"]) != int(nodes or 1):
        overridden.append(Override(option="nodes", file_value=f"{nodes or 1} machines", given=str(merged["nodes"])))
    if not has_count(gpus):
        per_node = int(world) // int(nodes or 1)
        merged["gpus"] = f"{per_node}x{gpus.strip()}"
        if nodes is not None and merged.get("nodes") is None:
            merged["nodes"] = nodes
    elif _world_size(merged) != world:
        overridden.append(Override(option="num_gpus", file_value=f"{world} process{'es' if world != 1 else ''}", given=gpus))
        if nodes is not None and merged.get("nodes") is None and int(nodes) > 1:  # the typed count's nodes win too
            overridden.append(Override(option="nodes", file_value=f"{nodes} machines", given=gpus))
            if merged.get("hybrid") is not None and merged.get("hybrid") == config.settings.get("hybrid"):
                # the file's replicas were its machines (HYBRID_SHARD), which the typed GPUs replace
                merged.pop("hybrid")
                overridden.append(Override(option="hybrid", file_value=f"{config.settings['hybrid']} replicas",
                                           given=gpus))


def _data_parallel(merged: dict[str, Any]) -> int:
    return max(_world_size(merged) // ((merged.get("tp") or 1) * (merged.get("cp") or 1) * (merged.get("pp") or 1)), 1)


def _apply_global_batch(config: ConfigFile, merged: dict[str, Any], overridden: list[Override],
                        derived: list[str]) -> None:
    """The file's global batch (DeepSpeed's train_batch_size, torchtitan's global_batch_size); when it is
    one micro-batch per data-parallel GPU it says no accumulation, the plan's default, and is not pinned."""
    total = config.settings.get("global_batch")
    if total is None:
        return
    if merged.get("global_batch") is not None:
        if str(merged["global_batch"]) != str(total):
            overridden.append(Override(option="global_batch", file_value=str(total), given=str(merged["global_batch"])))
        return
    micro = merged.get("micro_batch")
    steps = config.settings.get("gradient_accumulation")
    if steps is not None and micro is not None and str(micro).strip().isdigit() \
            and int(micro) * int(steps) * _data_parallel(merged) != int(total):
        # DeepSpeed checks train_batch_size = micro x steps x world; planning it would change one of the file's values
        world, rest = divmod(int(total), int(micro) * int(steps))
        if rest:  # no GPU count gives it
            raise ValueError(f"--from {config.path}: its global batch {total} is not a multiple of micro-batch {micro} "
                             f"x gradient accumulation {steps} = {int(micro) * int(steps)}, so no number of GPUs gives "
                             "it (DeepSpeed checks train_batch_size = micro-batch x accumulation x GPUs): change the "
                             "micro-batch, the accumulation or the global batch, or pass --global-batch")
        raise ValueError(f"--from {config.path}: its global batch {total} over micro-batch {micro} x gradient "
                         f"accumulation {steps} = {world} data-parallel GPUs, but these options give "
                         f"{_data_parallel(merged)}: pass the --gpus the file was written for, or --global-batch")
    pipelined = (merged.get("pp") or 1) > 1  # a pipeline's micro-batches a step come from the global batch
    if not pipelined and micro is not None and str(micro).strip().isdigit() \
            and int(micro) * _data_parallel(merged) == int(total):
        derived.append(f"global batch {total} = micro-batch {micro} x {_data_parallel(merged)} data-parallel GPUs: "
                       "no gradient accumulation")
        return
    merged["global_batch"] = int(total)


def _apply_accumulation(config: ConfigFile, merged: dict[str, Any], overridden: list[Override],
                        derived: list[str]) -> None:
    """Gradient accumulation in the file: ``--global-batch = micro-batch x steps x data-parallel GPUs``."""
    steps = config.settings.get("gradient_accumulation")
    pipelined = (merged.get("pp") or 1) > 1  # a pipeline's single micro-batch a step is pinned too (its default is 4 x pp)
    if steps is None or (int(steps) == 1 and not pipelined) or "global_batch" in config.settings:
        return  # one step is the plan's default; a global batch in the file already says it
    if merged.get("global_batch") is not None and "global_batch" not in config.settings:
        overridden.append(Override(option="gradient_accumulation", file_value=str(steps),
                                   given=f"--global-batch {merged['global_batch']}"))
        return
    micro = merged.get("micro_batch")
    if micro is None or not str(micro).strip().isdigit():
        derived.append(f"gradient accumulation {steps} is not used: the file gives no micro-batch (give "
                       "--micro-batch, or --global-batch)")
        return
    data_parallel = _data_parallel(merged)
    if int(micro) * int(steps) * data_parallel > MAX_GLOBAL_BATCH:
        raise ValueError(f"--from {config.path}: gradient accumulation {steps} x micro-batch {micro} x {data_parallel} "
                         f"data-parallel GPUs is {int(micro) * int(steps) * data_parallel:,} samples a step, above "
                         f"--global-batch's bound {MAX_GLOBAL_BATCH:,}")
    merged["global_batch"] = int(micro) * int(steps) * data_parallel
    derived.append(f"--global-batch {merged['global_batch']} = micro-batch {micro} x gradient accumulation "
                   f"{steps} x {data_parallel} data-parallel GPUs")


def summary_lines(done: FromFile) -> list[str]:
    """What --from did in a few lines, for the commands that do not print the plan (export, simulate, ...)."""
    config = done.config
    taken = ", ".join(shown(v.option, v.setting) for v in config.values if v.option != "gradient_accumulation")
    lines = [f"--from {config.path} ({config.title}): {taken or 'nothing the plan uses'}"]
    lines += [f"--from: {o.given} given overrides the file's {flag(o.option)} {o.file_value}" for o in done.overridden]
    return [printable(line) for line in lines + list(done.derived) + list(config.notes)]


def from_file_doc(done: FromFile) -> dict[str, Any]:
    """The ``from_file`` section of ``advisor plan --json``."""
    config = done.config
    return {"path": config.path, "format": config.format,
            "values": [v.model_dump() for v in config.values],
            "overridden": [o.model_dump() for o in done.overridden],
            "derived": list(done.derived), "not_read": list(config.not_read), "notes": list(config.notes)}


def _echo(line: str) -> None:
    """A line of what the file holds: its keys and values as it wrote them, a control character escaped."""
    click.echo(printable(line))


def render_from_file(done: FromFile) -> None:
    """One line per value taken (several options set by one key share its line), then what was not read."""
    config = done.config
    _echo(f"From {config.path} ({config.title}):")
    lines: dict[tuple[str, str], list[str]] = {}
    replaced = {o.option: o.given for o in done.overridden}
    for value in config.values:
        setting = shown(value.option, value.setting)
        if value.option in replaced:
            setting += f" (overridden: {replaced[value.option]} given)"
        lines.setdefault((value.key, value.value), []).append(setting)
    for (key, said), settings in lines.items():
        _echo(f"  {key}: {said} -> {', '.join(settings)}")
    for line in done.derived:
        _echo(f"  {line}")
    if config.not_read:
        _echo(f"  not read ({len(config.not_read)}, no effect on the plan or not modelled): "
              f"{', '.join(config.not_read)}")
    for note in config.notes:
        _echo(f"  note: {note}")
    click.echo("")


def from_file_origin(message: str, read: FromFile) -> str:
    """``message`` (a plan's one-line refusal) with where the option it opens with came from, where --from's file
    set it: ``--tp 3 does not divide the 8 GPUs (...); --tp 3 is parallelism.tensor_parallel_degree in tt.toml``."""
    for value in read.config.values:
        said = shown(value.option, value.setting)
        if said.startswith("--") and message.startswith(said):  # not one the command line overrode with another
            return f"{message}; {said} is {value.key} in {read.config.path}"
    return message

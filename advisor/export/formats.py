"""The export formats as one table: one row per format, read by the CLI, the target resolver and the renderers.

A row says everything the rest of ``advisor.export`` needs to know about a format without importing its
renderer: its name (the CLI's ``--format`` choice), its default file, which (strategy, engine) pairs it can
write (``runs``), which mesh dimensions it can carry (``mesh_dims``) and why not the others (``mesh_gap``),
how it carries context parallelism (``cp_as``), the recipe row of ``profiles/recipes.json`` an export in
this format is planned with (``recipe``: the stack that really runs the exported file), and the module
that renders it (``module``: it defines ``build``, ``render`` and ``render_target``).

Adding a format is one row here and one module. Pure data: no file access, no torch or yaml import.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from advisor.recipes import MeshDim, RecipeName, ZeroDefaultsSource, zero_config_defaults

FormatName = Literal["accelerate", "deepspeed-json", "torchrun", "trainer-args", "lightning", "torchtitan"]
# Which (strategy, engine) pairs a format writes (``advisor.export.target.expresses`` reads the strategy
# table's Implementation fields for each kind): ``launcher`` DDP, FSDP2 and every DeepSpeed stage (no
# one-process DataParallel, no torch ZeroRedundancyOptimizer); ``deepspeed`` DeepSpeed only; ``any`` all;
# ``fsdp2`` torch DDP and FSDP2 only (torchtitan: no DeepSpeed, no ZeroRedundancyOptimizer).
Runs = Literal["launcher", "deepspeed", "any", "fsdp2"]
# How a format carries the plan's optimizer: ``note`` (no key: a note names the constructor), ``trainer``
# (TrainingArguments.optim), ``torchtitan`` ([optimizer] name and implementation).
OptimizerKey = Literal["note", "trainer", "torchtitan"]


class ExportFormatRow(BaseModel):
    """One export format (module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: FormatName
    summary: str = Field(description="One line for --help: what the file is.")
    default_filename: str = Field(description="File written when -o is not given.")
    module: str = Field(description="The module that renders it (build, render, render_target).")
    recipe: RecipeName = Field(description="The recipe row an export in this format plans with.")
    runs: Runs = Field(description="Which (strategy, engine) pairs it can write.")
    mesh_dims: tuple[MeshDim, ...] = Field(description="Mesh dimensions (> 1) it can carry.")
    mesh_gap: str = Field(default="", description="Why it cannot carry the other dimensions, and what to use.")
    cp_as: Literal["ring", "ulysses"] = Field(default="ring", description="How it runs cp: ring attention, or "
                                              "DeepSpeed's Ulysses sequence parallelism (splits attention by heads).")
    optimizer_key: OptimizerKey = Field(default="note", description="How the file names the plan's optimizer.")
    pp_ep_gap: str = Field(default="", description="Why it cannot carry pipeline or expert parallelism (when "
                           "mesh_dims lacks pp / ep).")
    mesh_note: str = Field(default="", description="What the script must do with the mesh in this format, if anything.")
    applies_mesh: bool = Field(default=False, description="The framework's own trainer applies every degree the file "
                               "names (torchtitan's train.py: parallelize and pipeline from its [parallelism]), so no "
                               "line tells a script how to load tp or run cp.")
    selective_key: bool = Field(default=False, description="It has a key for selective (per-op) activation "
                                "checkpointing; else a note says to ask wrap() for it.")
    checkpointing_key: Literal["never", "fsdp", "always"] = Field(
        default="never", description="Whether the file itself turns full activation checkpointing on: 'always' (a key, "
        "or code and an instruction of its own, as the Lightning snippet writes), 'fsdp' (only where it writes torch "
        "FSDP: accelerate's fsdp_activation_checkpointing), 'never' (a note tells the script to: "
        "advisor.export.target.checkpointing_notes).")
    compile_key: bool = Field(default=False, description="It has a key for --compile (torch.compile on the blocks); "
                              "else a note says what the script must do (advisor.export.optimizer.stack_notes).")
    float8_key: bool = Field(default=False, description="It has a key for --float8 (torchao Float8Linear); else a note.")
    cpu_test: bool = Field(default=True, description="It can write the --cpu gloo test config.")
    cpu_note: str = Field(default="", description="The --cpu test config's first note when the format starts its "
                          "own processes ({processes} is filled in); empty: the launcher's note.")
    zero_defaults: ZeroDefaultsSource | None = Field(default=None, description="A file that cannot carry DeepSpeed's "
                                                     "bucket sizes and overlap runs these defaults "
                                                     "(profiles/zero_defaults.json), so its plan assumes them; None: "
                                                     "the file writes the plan's.")


# Mesh facts from the consumers' own code (advisor.export.mesh_target's docstring cites them).
FORMAT_TABLE: tuple[ExportFormatRow, ...] = (
    ExportFormatRow(name="accelerate", summary="accelerate launch --config_file YAML",
                    default_filename="accelerate_config.yaml", module="advisor.export.accelerate", recipe="trainer",
                    compile_key=True, float8_key=True, checkpointing_key="fsdp",
                    runs="launcher", mesh_dims=("dp_replicate", "dp_shard", "cp", "tp"), zero_defaults="accelerate",
                    pp_ep_gap="accelerate 1.15's ParallelismConfig has dp_replicate, dp_shard, tp and cp sizes only (no pipeline "
                              "or expert degree); use --format torchtitan"),
    ExportFormatRow(name="deepspeed-json", summary="DeepSpeed JSON config", default_filename="ds_config.json",
                    module="advisor.export.deepspeed", recipe="deepspeed", runs="deepspeed",
                    mesh_dims=("dp_shard", "cp"), cp_as="ulysses",
                    pp_ep_gap="a DeepSpeed JSON carries ZeRO, not the model's split: pipeline stages are a "
                              "deepspeed.pipe.PipelineModule built in the script, and DeepSpeed runs them with ZeRO-1 "
                              "at most (ZeRO-2/3 are incompatible with its pipeline engine); experts are "
                              "deepspeed.moe.layer.MoE(ep_size=...) in the model code; use --format torchtitan",
                    mesh_gap="DeepSpeed has no tensor parallelism or hybrid sharding equivalent to FSDP2's here "
                             "(only Ulysses sequence parallelism, for cp); use --format accelerate or torchrun"),
    ExportFormatRow(name="torchrun", summary="torchrun command line (shell)", default_filename="launch.sh",
                    module="advisor.export.torchrun", recipe="torch", runs="any",
                    mesh_dims=("dp_replicate", "dp_shard", "cp", "tp"),
                    pp_ep_gap="the launched script's loop (loss.backward(), optimizer.step()) cannot step pipeline "
                              "stages, which wrappers.wrap_pipeline returns to be stepped by their schedule, and "
                              "wrap() does not compose expert parallelism with FSDP2 (wrappers.experts shards experts "
                              "alone); use --format torchtitan"),
    ExportFormatRow(name="trainer-args", summary="Hugging Face TrainingArguments keys (JSON)",
                    default_filename="training_args.json", module="advisor.export.trainer", recipe="trainer", compile_key=True,
                    checkpointing_key="always",
                    runs="launcher", optimizer_key="trainer", mesh_dims=("dp_replicate", "dp_shard", "cp", "tp"),
                    pp_ep_gap="TrainingArguments.parallelism_config is accelerate's ParallelismConfig: dp_replicate, "
                              "dp_shard, tp and cp sizes only (no pipeline or expert degree); use --format torchtitan",
                    mesh_note="parallelism_config holds accelerate ParallelismConfig arguments: build "
                              "TrainingArguments(..., parallelism_config=ParallelismConfig(**args.pop("
                              "\"parallelism_config\")))."),
    ExportFormatRow(name="lightning", summary="Lightning strategy snippet (Python)",
                    default_filename="lightning_strategy.py", module="advisor.export.lightning", recipe="lightning",
                    runs="launcher", mesh_dims=("dp_replicate", "dp_shard"), zero_defaults="lightning",
                    selective_key=True, checkpointing_key="always",
                    cpu_note="CPU test config: Lightning starts the {processes} processes itself (DDP on gloo).",
                    pp_ep_gap="Lightning's ModelParallelStrategy has data_parallel_size and tensor_parallel_size only; "
                              "use --format torchtitan",
                    mesh_gap="Lightning's ModelParallelStrategy needs the script's own parallelize function for "
                             "tp/cp (the snippet writes FSDP2 and HSDP only); use --format accelerate or torchrun"),
    ExportFormatRow(name="torchtitan", summary="torchtitan job config (TOML, torchtitan <= 0.2.2)",
                    default_filename="torchtitan_job.toml", module="advisor.export.torchtitan", recipe="torchtitan",
                    compile_key=True, float8_key=True,
                    runs="fsdp2", optimizer_key="torchtitan", cpu_test=False, selective_key=True,
                    checkpointing_key="always", applies_mesh=True,
                    mesh_dims=("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep")),
)

FORMAT_ROWS: dict[str, ExportFormatRow] = {row.name: row for row in FORMAT_TABLE}
FORMAT_NAMES: tuple[str, ...] = tuple(FORMAT_ROWS)
assert sorted(FORMAT_NAMES) == sorted(get_args(FormatName)), "one row per FormatName"


def get_format_row(name: str) -> ExportFormatRow:
    """The row called ``name``; ValueError naming the choices otherwise."""
    try:
        return FORMAT_ROWS[name]
    except KeyError:
        raise ValueError(f"unknown export format '{name[:40]}'; choose from {', '.join(FORMAT_NAMES)}") from None


def format_plan_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The ``plan()`` options an export in format ``name`` plans with, so the exported run is the run that
    was planned: the format's recipe row unless ``recipe`` is given, and where its file cannot carry
    DeepSpeed's bucket sizes, the defaults the run will get (``zero``, read on the deepspeed engine only)
    unless given."""
    row = get_format_row(name)
    planned = {**options, "recipe": options.get("recipe") or row.recipe}
    if row.zero_defaults is not None and planned.get("zero") is None:
        planned["zero"] = zero_config_defaults(row.zero_defaults)
    return planned

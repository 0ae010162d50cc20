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

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from advisor.recipes import RecipeName

FormatName = Literal["accelerate", "deepspeed-json", "torchrun", "trainer-args", "lightning"]
# Which (strategy, engine) pairs a format writes (``advisor.export.target.expresses`` reads the strategy
# table's Implementation fields for each kind): ``launcher`` DDP, FSDP2 and every DeepSpeed stage (no
# one-process DataParallel, no torch ZeroRedundancyOptimizer); ``deepspeed`` DeepSpeed only; ``any`` all.
Runs = Literal["launcher", "deepspeed", "any"]
MeshDim = Literal["dp_replicate", "dp_shard", "cp", "tp"]


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
    optimizer_key: bool = Field(default=False, description="The file names the optimizer (TrainingArguments.optim); "
                                "else a note names the constructor the plan assumed.")
    mesh_note: str = Field(default="", description="What the script must do with the mesh in this format, if anything.")
    cpu_note: str = Field(default="", description="The --cpu test config's first note when the format starts its "
                          "own processes ({processes} is filled in); empty: the launcher's note.")


# Mesh facts from the consumers' own code (advisor.export.mesh_target's docstring cites them).
FORMAT_TABLE: tuple[ExportFormatRow, ...] = (
    ExportFormatRow(name="accelerate", summary="accelerate launch --config_file YAML",
                    default_filename="accelerate_config.yaml", module="advisor.export.accelerate", recipe="trainer",
                    runs="launcher", mesh_dims=("dp_replicate", "dp_shard", "cp", "tp")),
    ExportFormatRow(name="deepspeed-json", summary="DeepSpeed JSON config", default_filename="ds_config.json",
                    module="advisor.export.deepspeed", recipe="deepspeed", runs="deepspeed",
                    mesh_dims=("dp_shard", "cp"), cp_as="ulysses",
                    mesh_gap="DeepSpeed has no tensor parallelism or hybrid sharding equivalent to FSDP2's here "
                             "(only Ulysses sequence parallelism, for cp); use --format accelerate or torchrun"),
    ExportFormatRow(name="torchrun", summary="torchrun command line (shell)", default_filename="launch.sh",
                    module="advisor.export.torchrun", recipe="torch", runs="any",
                    mesh_dims=("dp_replicate", "dp_shard", "cp", "tp")),
    ExportFormatRow(name="trainer-args", summary="Hugging Face TrainingArguments keys (JSON)",
                    default_filename="training_args.json", module="advisor.export.trainer", recipe="trainer",
                    runs="launcher", optimizer_key=True, mesh_dims=("dp_replicate", "dp_shard", "cp", "tp"),
                    mesh_note="parallelism_config holds accelerate ParallelismConfig arguments: build "
                              "TrainingArguments(..., parallelism_config=ParallelismConfig(**args.pop("
                              "\"parallelism_config\")))."),
    ExportFormatRow(name="lightning", summary="Lightning strategy snippet (Python)",
                    default_filename="lightning_strategy.py", module="advisor.export.lightning", recipe="lightning",
                    runs="launcher", mesh_dims=("dp_replicate", "dp_shard"),
                    cpu_note="CPU test config: Lightning starts the {processes} processes itself (DDP on gloo).",
                    mesh_gap="Lightning's ModelParallelStrategy needs the script's own parallelize function for "
                             "tp/cp (the snippet writes FSDP2 and HSDP only); use --format accelerate or torchrun"),
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

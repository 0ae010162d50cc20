"""The export target of a plan whose recommendation runs on a device mesh (tp / cp / HSDP).

What each format can carry of a mesh, from the consumers' own code:

- accelerate (1.15): ``distributed_type: FSDP`` (FSDP2) plus ``parallelism_config`` with
  ``parallelism_config_{dp_replicate,dp_shard,tp,cp}_size`` (``commands/launch.py`` turns them into
  ``PARALLELISM_CONFIG_*`` variables that ``ParallelismConfig.__post_init__`` reads). The launcher
  accepts a parallelism config only with FSDP2 (``_validate_launch_command``), and the Accelerator
  needs a dimension for FSDP to shard over (dp_shard x cp >= 2): the planner only proposes such meshes.
- trainer-args (transformers 5.x): ``TrainingArguments.parallelism_config`` takes an accelerate
  ``ParallelismConfig``; the JSON carries its constructor arguments, the script builds the object.
- torchrun: launches any script; the script builds the mesh (``wrappers.wrap``).
- deepspeed-json: DeepSpeed has no ring attention; its equivalent of context parallelism is Ulysses
  sequence parallelism (Jacobs et al. 2023; accelerate ``ParallelismConfig(sp_backend="deepspeed",
  sp_size=N)``), which the script sets (accelerate's launcher refuses a parallelism config without
  FSDP2). Ulysses splits attention by heads, so sp must divide them. Tensor parallelism and HSDP
  have no DeepSpeed equivalent here: unavailable, with the reason.
- lightning: ``ModelParallelStrategy`` needs the script's own parallelize function: unavailable.

Pure functions: no file access, no torch or yaml import.
"""

from __future__ import annotations

from advisor.export.formats import get_format_row
from advisor.mesh import ParallelDims
from advisor.strategies import STRATEGIES


def mesh_unavailable(fmt: str, mesh: ParallelDims, *, num_attention_heads: int | None) -> str | None:
    """Why ``fmt`` cannot carry ``mesh``, or None when it can (the format table's ``mesh_dims``, ``cp_as``)."""
    row = get_format_row(fmt)
    used = [*mesh.shape, *(["ep"] if getattr(mesh, "ep", 1) > 1 else [])]
    missing = [dim for dim in used if dim not in row.mesh_dims]
    if set(missing) & {"pp", "ep"}:
        return f"the {fmt} format cannot express mesh {mesh.label} (pipeline / expert parallelism): {row.pp_ep_gap}"
    if missing:
        return f"the {fmt} format cannot express mesh {mesh.label}: {row.mesh_gap}"
    if row.cp_as == "ulysses" and mesh.cp > 1 and (num_attention_heads is None or num_attention_heads % mesh.cp):
        return (f"{fmt}: Ulysses sequence parallelism (DeepSpeed's equivalent of --cp {mesh.cp}) splits "
                f"attention by heads, and {mesh.cp} does not divide the model's {num_attention_heads} heads")
    return None


def mesh_notes(fmt: str, mesh: ParallelDims, *, seq_len: int) -> list[str]:
    """What the script must do for the mesh in this format, one line each."""
    pipeline = [("pp", mesh.pp)] if getattr(mesh, "pp", 1) > 1 else []
    experts = [("ep", mesh.ep)] if getattr(mesh, "ep", 1) > 1 else []
    dims = ", ".join(f"{name} {degree}" for name, degree in
                     (*pipeline, ("dp_replicate", mesh.dp_replicate), ("dp_shard", mesh.dp_shard), ("cp", mesh.cp),
                      ("tp", mesh.tp), *experts))
    notes = [f"Device mesh {mesh.label} ({dims}; FSDP2 shards over dp_shard x cp, torchtitan's layout)."]
    if get_format_row(fmt).cp_as == "ulysses":
        notes.append(
            f"Ulysses sequence parallelism of degree {mesh.cp} stands in for the plan's ring-attention cp {mesh.cp} "
            "(DeepSpeed has no ring attention): in the script, Accelerator(parallelism_config=ParallelismConfig("
            f"sp_backend=\"deepspeed\", sp_size={mesh.cp}, sp_handler=DeepSpeedSequenceParallelConfig(sp_seq_length="
            f"{seq_len}, sp_attn_implementation=\"sdpa\")), deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=THIS_FILE)). "
            "Memory and time were planned for ring attention on FSDP2; Ulysses moves all-to-alls instead.")
        return notes
    if get_format_row(fmt).applies_mesh:  # the framework loads and parallelizes the model itself
        applied = [part for degree, part in (
            (mesh.tp, "tensor parallelism with sequence parallelism and a loss parallel over the vocabulary"),
            (mesh.cp, "context parallelism"), (getattr(mesh, "pp", 1), "the pipeline"),
            (getattr(mesh, "ep", 1), "expert parallelism")) if degree > 1]
        return [*notes, "torchtitan's trainer builds this mesh from [parallelism] and applies it itself"
                + (f" ({', '.join(applied)}), as the torchtitan recipe planned it." if applied else ".")]
    if mesh.tp > 1:
        notes.append(f"Tensor parallelism {mesh.tp}: load the model with tp_plan=\"auto\" on the mesh's \"tp\" "
                     "dimension (transformers' own TP plan; accelerate does this from parallelism_config). The plan "
                     "counts that plan as wrappers.wrap() runs it: no sequence parallelism (norms and residual "
                     "stream whole on every TP rank), logits gathered, a tied embedding replicated over tp.")
    if mesh.cp > 1:
        notes.append(f"Context parallelism {mesh.cp} needs SDPA attention and the forward inside "
                     "accelerator.maybe_context_parallel(buffers=[input_ids, shift_labels, position_ids], "
                     "buffer_seq_dims=[1, 1, 1]) with labels shifted and positions made before it (a shard's chunks "
                     "are not neighbours; wrappers.tensor_parallel.prepare_context_parallel_input builds them) and "
                     f"model(..., labels=shift_labels, shift_labels=shift_labels); sequences must be a multiple of "
                     f"{2 * mesh.cp} tokens.")
    if get_format_row(fmt).mesh_note:
        notes.append(get_format_row(fmt).mesh_note)
    return notes


def mesh_engine(fmt: str, strategy: str) -> tuple[str, str]:
    """(strategy, engine) that ``fmt`` writes for a mesh plan's FSDP2 ``strategy``."""
    if get_format_row(fmt).runs == "deepspeed":
        return "zero3", "deepspeed"  # ZeRO-3 is what FSDP2's zero3 is on DeepSpeed
    assert STRATEGIES[strategy].on("torch").shard_params, strategy
    return strategy, "torch"

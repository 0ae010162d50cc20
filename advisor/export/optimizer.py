"""The plan's optimizer as each format spells it: the Trainer's ``optim`` name, or a note for the script.

The plan's memory counts the optimizer (``--optimizer``) and how AdamW/Adam steps (the recipe's
``optimizer_impl``, or ``--optimizer-impl``): a fused step holds no state-sized temporary, a foreach step
one (``advisor.estimate.states``). The exported run must step the same way, so:

- ``trainer-args`` writes ``optim`` (transformers 5.x ``OptimizerNames``; ``trainer_optimizer.py``):
  ``adamw_torch_fused`` is ``torch.optim.AdamW(fused=True)``; ``adamw_torch`` is ``torch.optim.AdamW``
  with its defaults, which steps foreach on CUDA (``torch/optim/optimizer.py``
  ``_default_to_fused_or_foreach``); ``sgd`` is ``torch.optim.SGD`` (momentum from ``optim_args``);
  ``adafactor`` is transformers' Adafactor; ``adamw_bnb_8bit`` bitsandbytes' 8-bit AdamW. A for-loop
  AdamW and plain Adam have no ``optim`` name (``_get_adamw_torch`` passes no ``foreach`` and ignores
  ``optim_args``): the note says to hand the Trainer the optimizer (``Trainer(optimizers=(opt, None))``).
- ``--compile`` and ``--float8`` are keys where the format has one (the format table's ``compile_key`` /
  ``float8_key``); elsewhere a note, next to optimizer-in-backward's, says what the script must do.
- Every other format carries no optimizer key: a note names the constructor the plan assumed
  (``stack_notes``, which also says when the plan used another recipe than the format's row).

Pure functions: no torch or transformers import.
"""

from __future__ import annotations

from typing import Any

from advisor.export.formats import get_format_row
from advisor.recipes import OptimizerImpl, zero_config_defaults
from advisor.training import Optimizer, TrainingConfig

_SGD_MOMENTUM = 0.9  # what the plan's sgd-momentum means (advisor.simulate.step runs the same)


def optimizer_constructor(opt: Optimizer, impl: OptimizerImpl) -> str:
    """The constructor the plan assumed, as the script would write it."""
    flag = {"fused": "fused=True", "foreach": "foreach=True", "for-loop": "foreach=False"}[impl]
    return {
        "adamw": f"torch.optim.AdamW(params, {flag})",
        "adam": f"torch.optim.Adam(params, {flag})",
        "sgd": "torch.optim.SGD(params)",
        "sgd-momentum": f"torch.optim.SGD(params, momentum={_SGD_MOMENTUM})",
        "adafactor": "transformers.optimization.Adafactor(params, scale_parameter=False, relative_step=False)",
        "adamw-8bit": "bitsandbytes.optim.AdamW8bit(params)",
        "adamw-8bit-paged": "bitsandbytes.optim.PagedAdamW8bit(params)",
    }[opt]


def trainer_optim(opt: Optimizer, impl: OptimizerImpl) -> tuple[dict[str, Any], str | None]:
    """``TrainingArguments`` keys for the plan's optimizer, and a note when no key expresses it."""
    if opt == "adamw" and impl == "fused":
        return {"optim": "adamw_torch_fused"}, None
    if opt == "adamw" and impl == "foreach":
        return {"optim": "adamw_torch"}, None
    if opt in ("sgd", "sgd-momentum"):
        keys: dict[str, Any] = {"optim": "sgd"}
        if opt == "sgd-momentum":
            keys["optim_args"] = f"momentum={_SGD_MOMENTUM}"
        return keys, None
    if opt == "adafactor":
        return {"optim": "adafactor"}, None
    if opt == "adamw-8bit":
        return {"optim": "adamw_bnb_8bit"}, None
    if opt == "adamw-8bit-paged":
        return {"optim": "paged_adamw_8bit"}, None
    return {}, (f"The plan assumes {optimizer_constructor(opt, impl)}, which has no TrainingArguments optim name "
                f"(the Trainer's default is adamw_torch_fused): build it in the script and pass "
                f"Trainer(optimizers=(optimizer, None)).")


def optimizer_note(opt: Optimizer, impl: OptimizerImpl, *, recipe: str, engine: str, cpu_adam: bool = False) -> str:
    """For formats with no optimizer key: what the script must build so the run is the one planned. ``cpu_adam``:
    DeepSpeed steps an offloaded optimizer on the CPU, the step the plan times, and refuses a torch optimizer
    there (runtime/engine.py: ZeRO-Offload with a client optimizer other than its own raises unless
    zero_force_ds_cpu_optimizer is false, which would then step torch's AdamW on the CPU)."""
    if cpu_adam and opt in ("adam", "adamw"):
        return ("Optimizer: the plan times DeepSpeed's CPU Adam (offload_optimizer): build "
                f"deepspeed.ops.adam.DeepSpeedCPUAdam(params, adamw_mode={opt == 'adamw'}) and pass it to "
                "deepspeed.initialize, or pass none and add an \"optimizer\" section of type "
                f"{'AdamW' if opt == 'adamw' else 'Adam'} to this file (DeepSpeed builds its CPU Adam for it); a torch "
                "optimizer is refused with offload_optimizer.")
    deepspeed = (" (on DeepSpeed, an \"optimizer\" section of type AdamW in the JSON runs its FusedAdam when the "
                 "optimizer is not offloaded: the same "
                 "fused step)" if engine == "deepspeed" and opt in ("adam", "adamw") and impl == "fused" else "")
    return (f"Optimizer: the plan assumes {optimizer_constructor(opt, impl)} (recipe {recipe}, {impl} step); "
            f"build it so in the script{deepspeed}.")


def stack_notes(training: TrainingConfig, fmt: str, *, engine: str, offloads_optimizer: bool = False,
                zero3: bool = False) -> list[str]:
    """The recipe and optimizer the plan assumed, where the file cannot say it (advisor.export.optimizer); ``zero3``:
    the file runs DeepSpeed ZeRO stage 3."""
    row, recipe = get_format_row(fmt), training.recipe.name
    notes = []
    if training.optimizer_in_backward:  # no format has a key for it (advisor.estimate.in_backward)
        notes.append("The plan steps the optimizer in backward (--optimizer-in-backward): no file says it; in the "
                     "script build one optimizer per parameter and a post-accumulate-grad hook that steps it and frees "
                     "its gradient, as torchtune.training.register_optim_in_bwd_hooks does, or the run holds every "
                     "gradient the plan did not count.")
    notes += _script_notes(training, fmt, compile_key=row.compile_key, float8_key=row.float8_key)
    if (training.accumulation_sync == "every_micro_batch" and training.global_batch_size is not None
            and engine == "torch" and fmt == "accelerate"):  # advisor.estimate.accumulation: no accelerate config key
        notes.append("The plan reduce-scatters gradients every micro-batch (--accumulation-sync every_micro_batch): "
                     "no accelerate config key says it; pass Accelerator(gradient_accumulation_plugin="
                     "GradientAccumulationPlugin(num_steps=..., sync_each_batch=True)) in the script, or "
                     "accelerator.accumulate() keeps FSDP's unsharded gradients the plan did not count.")
    if recipe != row.recipe:
        notes.append(f"Planned with recipe {recipe}; the {fmt} file runs the {row.recipe} stack "
                     f"(profiles/recipes.json): plan with --recipe {row.recipe} (advisor export does unless "
                     f"--recipe is given) for its optimizer step, frozen-base dtype and loss.")
    if engine == "deepspeed" and row.zero_defaults is not None:
        notes.append(_zero_defaults_note(training, row.zero_defaults, zero3=zero3))
    opt, impl = training.optimizer, training.optimizer_implementation
    if row.optimizer_key == "trainer":
        note = trainer_optim(opt, impl)[1]
        return notes + ([note] if note else [])
    if row.optimizer_key == "torchtitan":  # [optimizer] name and implementation (advisor.export.torchtitan)
        return notes
    cpu_adam = engine == "deepspeed" and offloads_optimizer and fmt != "accelerate"  # accelerate swaps in CPU Adam
    return notes + [optimizer_note(opt, impl, recipe=recipe, engine=engine, cpu_adam=cpu_adam)]


def _zero_defaults_note(training: TrainingConfig, source: str, *, zero3: bool = False) -> str:
    """The DeepSpeed sizes a file that cannot set them runs with, and whether the plan assumed them."""
    zero = training.zero
    if zero is None or zero != zero_config_defaults(source):
        return (f"This file does not set DeepSpeed's bucket sizes or overlap_comm, so the run gets {source}'s defaults "
                f"(profiles/zero_defaults.json), not the sizes this plan assumed: plan it with advisor export, which "
                f"does, or use --format deepspeed-json.")
    # DeepSpeed resolves an unset overlap_comm to stage == 3 (zero_defaults.json's source): on under ZeRO-3
    overlap = zero.overlap_comm or zero3
    return (f"DeepSpeed runs with {source}'s defaults, which this file does not set and the plan assumed "
            f"(profiles/zero_defaults.json): reduce_bucket_size {zero.reduce_bucket_size:,}, overlap_comm "
            f"{str(overlap).lower()}; --format deepspeed-json writes and plans smaller buckets.")


def _script_notes(training: TrainingConfig, fmt: str, *, compile_key: bool, float8_key: bool) -> list[str]:
    """--compile / --float8 where the format has no key: the script must do it, or the run is eager bf16."""
    notes = []
    if training.compile and not compile_key:  # advisor.estimate.compile_time
        notes.append(f"The plan compiles each decoder block (--compile): no {fmt} key says it; in the script call "
                     "block.compile() (torch.compile, inductor) on every decoder block, as torchtitan's apply_compile "
                     "does (wrappers.wrap(..., compile=True) does it), or the run is eager and slower than planned.")
    if training.float8 and not float8_key:  # advisor.estimate.float8_time
        gather = ", enable_fsdp_float8_all_gather=True" if training.float8_all_gather else ""
        notes.append(f"The plan trains the blocks' linears in float8 (--float8): no {fmt} key says it; in the script "
                     "call torchao.float8.convert_to_float8_training(model, config=Float8LinearConfig(..."
                     f"{gather}), module_filter_fn=...) on the blocks' linears (both dims multiples of 16, not the "
                     "head) before sharding (wrappers.wrap(..., float8=True) does it), or the run is bf16 and slower "
                     "than planned.")
    return notes

"""The stacks users run, measured on a real CUDA GPU: Hugging Face ``Trainer`` (its default fused AdamW,
fp32 or bf16-loaded weights, PEFT LoRA over a bf16 base), ``wrappers.wrap()`` in a plain loop, and the
three AdamW implementations under the torch recipe.

Run (on a machine with one CUDA GPU): ``python benchmarks/gpu_stacks.py --out DIR``. Each case builds its
model from a bundled config with random weights on the GPU and trains three steps; the peaks of steps 2-3
(allocated and reserved) are what the plan is compared with. ``Trainer`` and ``wrap()`` cases also carry the
line the product itself prints (``wrappers.measured``: the ``AdvisorCallback`` / ``wrap()`` watcher) and
the figures it planned on the spot. Writes ``DIR/gpu_stacks.jsonl``, one JSON object per case; the
estimate is recomputed here later by ``benchmarks/gpu_stacks_report.py`` (so a change of the estimate
re-scores the stored measurements without a GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import io
import json
import platform
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEVICE = "cuda"  # a CPU smoke run of the script replaces it
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import accuracy  # noqa: E402  (the bundled model keys)

# (name, model key, micro-batch, seq, checkpointing, weights dtype, LoRA rank, Trainer optim)
TRAINER_CASES = [
    ("trainer-fp32w", "qwen0.5b", 4, 1024, False, "float32", None, "adamw_torch_fused"),
    ("trainer-fp32w-foreach", "qwen0.5b", 4, 1024, False, "float32", None, "adamw_torch"),
    ("trainer-fp32w-ckpt", "qwen0.5b", 8, 2048, True, "float32", None, "adamw_torch_fused"),
    ("trainer-fp32w", "llama1b", 2, 2048, True, "float32", None, "adamw_torch_fused"),
    ("trainer-bf16w", "qwen0.5b", 4, 1024, False, "bfloat16", None, "adamw_torch_fused"),
    ("trainer-bf16w", "llama1b", 4, 2048, False, "bfloat16", None, "adamw_torch_fused"),
    ("trainer-lora", "llama1b", 4, 2048, False, "bfloat16", 16, "adamw_torch_fused"),
    ("trainer-lora-ckpt", "qwen0.5b", 8, 2048, True, "bfloat16", 16, "adamw_torch_fused"),
    ("trainer-lora", "mha350m", 4, 2048, False, "bfloat16", 16, "adamw_torch_fused"),
]
# (model key, strategy, world, micro-batch, seq, checkpointing, AdamW implementation): the torch recipe
IMPL_CASES = [
    ("qwen0.5b", "ddp", 2, 1, 256, False, "fused"), ("qwen0.5b", "ddp", 2, 1, 256, False, "for-loop"),
    ("qwen0.5b", "ddp", 2, 1, 256, False, "foreach"), ("qwen0.5b", "zero3", 8, 1, 256, False, "fused"),
    ("mha350m", "zero3", 4, 1, 256, False, "foreach"), ("mha350m", "ddp", 2, 2, 1024, False, "fused"),
    ("llama1b", "zero3", 8, 1, 1024, True, "fused"), ("qwen0.5b", "zero3", 8, 1, 256, True, "foreach"),
]
# Gemma 2 2B as its config.json gives it (google/gemma-2-2b): eager attention with soft-capping, four norms a
# block, a 256k tied vocabulary. Registered beside accuracy.MODELS by ``register_models``.
GEMMA2_2B = dict(
    model_type="gemma2", architectures=["Gemma2ForCausalLM"], hidden_size=2304, intermediate_size=9216,
    num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=256000,
    max_position_embeddings=8192, sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
    query_pre_attn_scalar=256, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
    _name_or_path="hand/gemma-2-2b",
)
EXTRA_MODELS = {"gemma2-2b": GEMMA2_2B, "llama8b": "meta-llama/Llama-3.1-8B", "qwen3b": "Qwen/Qwen2.5-3B",
                "mistral7b": "mistralai/Mistral-7B-v0.1", "qwen7b": "Qwen/Qwen2.5-7B"}
# (model key, strategy, world, micro-batch, seq, checkpointing): eager attention, the torch recipe (foreach AdamW)
EAGER_CASES = [
    ("gemma2-2b", "zero3", 8, 1, 2048, False), ("gemma2-2b", "zero3", 8, 1, 4096, True),
    ("gemma2-2b", "zero2", 8, 1, 1024, False), ("mha350m", "zero3", 8, 1, 4096, False),
    ("mha350m", "ddp", 2, 1, 4096, True),
]


# (model key, strategy, world, micro-batch, seq, checkpointing, compile): torchtitan's train.py as the torchtitan
# recipe row plans it: its FSDP2 units (the embedding, the final norm + head), fused AdamW, bf16-mixed, the loss over
# the logits eager, or with --compile compiled beside the blocks; Llama-3.1-8B at its llama3_8b.toml settings first
# (local batch 1, 8,192 tokens, selective per-op AC)
TITAN_CASES = [
    ("llama8b", "zero3", 8, 1, 8192, "selective", False), ("llama8b", "zero3", 8, 2, 4096, True, False),
    ("llama8b", "zero2", 8, 1, 2048, True, False), ("mha350m", "zero3", 8, 2, 2048, False, False),
    ("llama8b", "zero3", 8, 1, 8192, "selective", True), ("mha350m", "zero3", 8, 2, 2048, False, True),
]
# (model key, strategy, world, micro-batch, seq): --activation-offload (wrappers.activation_offload, pinned host
# memory) under full checkpointing, the torch recipe (foreach AdamW, bf16-mixed)
ACTOFF_CASES = [("llama1b", "zero3", 8, 4, 4096), ("qwen0.5b", "ddp", 1, 8, 2048), ("llama8b", "zero3", 8, 2, 8192)]
# Trainer with gradient accumulation: (name, model key, micro-batch, seq, checkpointing, weights dtype, LoRA rank,
# Trainer optim, gradient_accumulation_steps)
ACCUM_CASES = [
    ("trainer-fp32w-accum", "qwen0.5b", 4, 1024, False, "float32", None, "adamw_torch_fused", 4),
    ("trainer-lora-accum", "llama1b", 4, 2048, False, "bfloat16", 16, "adamw_torch_fused", 2),
]


# Trainer on one GPU at the sizes posts publish: LoRA over a bf16 7-8B base, a bf16-loaded 3B full fine-tune (pure
# bf16): (name, model key, micro-batch, seq, checkpointing, weights dtype, LoRA rank, Trainer optim)
TRAINER_8B_CASES = [
    ("trainer-lora-8b", "llama8b", 1, 4096, False, "bfloat16", 16, "adamw_torch_fused"),
    ("trainer-lora-8b-ckpt", "llama8b", 4, 4096, True, "bfloat16", 16, "adamw_torch_fused"),
    ("trainer-lora-8b", "llama8b", 1, 1024, False, "bfloat16", 16, "adamw_torch_fused"),
]
TRAINER_MORE_CASES = [
    ("trainer-bf16w-3b-ckpt", "qwen3b", 4, 2048, True, "bfloat16", None, "adamw_torch_fused"),
    ("trainer-bf16w-3b", "qwen3b", 1, 4096, False, "bfloat16", None, "adamw_torch_fused"),
    ("trainer-lora-7b-ckpt", "mistral7b", 2, 4096, True, "bfloat16", 16, "adamw_torch_fused"),
    ("trainer-lora-7b", "mistral7b", 1, 2048, False, "bfloat16", 16, "adamw_torch_fused"),
]


# LoRA over a bf16 base without the Trainer's bf16=True (pure bf16, no autocast: fms-acceleration's setting): PEFT's
# adapters stay fp32 and compute in fp32 (Recipe.pure_adapters_fp32): (name, model key, micro-batch, seq,
# checkpointing, weights dtype, LoRA rank, Trainer optim); run with bf16=False
TRAINER_PURE_CASES = [
    ("trainer-lora-pure", "llama1b", 4, 2048, False, "bfloat16", 16, "adamw_torch_fused"),
    ("trainer-lora-pure", "qwen0.5b", 8, 2048, False, "bfloat16", 16, "adamw_torch_fused"),
    ("trainer-lora-pure", "mistral7b", 1, 4096, False, "bfloat16", 16, "adamw_torch_fused"),
    ("trainer-lora-pure-ckpt", "mistral7b", 4, 4096, True, "bfloat16", 16, "adamw_torch_fused"),
]


# The same Trainer job under a cap on what the caching allocator may reserve (torch.cuda.set_per_process_memory_fraction,
# set once the model is built): does a checkpointed run train where its reserved peak, uncapped, would not fit?
# (name, model key, micro-batch, seq, checkpointing, weights dtype, LoRA rank, Trainer optim, cap GiB)
CAP_CASES = [
    ("trainer-lora-8b-ckpt-cap", "llama8b", 4, 4096, True, "bfloat16", 16, "adamw_torch_fused", cap)
    for cap in (47.5, 45.0, 43.5)
] + [  # ``--only cap2``: the same model without checkpointing (uncapped 40.01 GiB allocated, 41.28 reserved)
    ("trainer-lora-8b-cap", "llama8b", 1, 4096, False, "bfloat16", 16, "adamw_torch_fused", cap)
    for cap in (42.0, 41.0, 40.5)
]


# FSDP1 as HF Trainer ran it through accelerate's FSDP1 plugin in fms-acceleration's reference runs (the published set's
# fms-mistral7b-lora-fsdp rows): 2 ranks (rank 0 of a fake group), FULL_SHARD with PEFT's wrap policy, BACKWARD_PRE,
# limit_all_gathers, use_orig_params=False (accelerate's default), no MixedPrecision (pure bf16 weights), foreach AdamW
# over the adapters, LoRA r16 alpha 16 on q, k, v, o. (model key, micro-batch, seq, LoRA dropout, adapter dtype
# (PEFT's autocast_adapter_dtype gives float32), use_orig_params, checkpointing: "reentrant" / "non-reentrant" (the
# model's own, as the Trainer's gradient_checkpointing=True applies it; transformers 4.48 defaults to reentrant, and
# TRL's enable_input_require_grads with it) or "wrapper" (accelerate's fsdp_activation_checkpointing)). Each case runs
# in a process of its own (in one process a case's model outlived it under FSDP1 and the fake group). Run with the
# image's libraries, and with the publisher's (transformers 4.48.1, peft 0.13.2, accelerate 1.0.1 first on PYTHONPATH;
# each row records the versions it ran).
FSDP1_CASES = [
    ("mistral7b", 2, 4096, 0.1, "float32", False, "reentrant"), ("mistral7b", 4, 4096, 0.1, "float32", False, "reentrant"),
    ("mistral7b", 2, 4096, 0.0, "bfloat16", False, "reentrant"), ("mistral7b", 2, 4096, 0.1, "float32", False, "wrapper"),
]
# The first two through the Trainer itself (``trainer_fsdp1_case``): (model key, micro-batch, seq)
TRAINER_FSDP1_CASES = [("mistral7b", 2, 4096), ("mistral7b", 4, 4096)]


def register_models() -> None:
    """Add the configs only this benchmark measures to ``accuracy.MODELS`` (the report's estimate reads them)."""
    accuracy.MODELS.update(EXTRA_MODELS)


# (model key, micro-batch, seq, checkpointing): wrap() in one process, its own plan and watcher
WRAP_CASES = [("qwen0.5b", 4, 1024, False), ("llama1b", 2, 2048, True)]


def _clean() -> None:
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def _model(key: str, dtype: str, lora_rank: int | None):
    import torch

    from advisor.model.meta import build_meta_model
    from advisor.simulate.model import materialize, resolve_config

    cfg = dict(resolve_config(accuracy.MODELS[key])[1], use_cache=False, attn_implementation="sdpa")
    net = build_meta_model(cfg)
    materialize(net, device=DEVICE, real=True)
    if dtype == "bfloat16":
        net.to(torch.bfloat16)  # what from_pretrained(dtype="auto") gives for a bf16 checkpoint
    if lora_rank is not None:
        import peft

        net = peft.get_peft_model(net, peft.LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, task_type="CAUSAL_LM"))
    return net, cfg


class _Tokens:
    def __init__(self, vocab: int, seq: int, n: int) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _step_peaks(peaks: dict):
    """A Trainer callback that writes into ``peaks`` the allocated and reserved peaks of steps 2-3."""
    import torch
    from transformers import TrainerCallback

    class Peaks(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            torch.cuda.synchronize()
            if state.global_step == 1:
                torch.cuda.reset_peak_memory_stats()
            elif state.global_step == 3:
                peaks["allocated"] = torch.cuda.max_memory_allocated()
                peaks["reserved"] = torch.cuda.max_memory_reserved()
            return control

    return Peaks()


def _fms_lora(net, dropout: float, *, fp32_adapters: bool):
    """fms-acceleration's standard-peft adapters: LoRA r16, alpha 16 on q, k, v, o (PEFT upcasts them to fp32 unless
    ``fp32_adapters`` is False)."""
    import peft

    return peft.get_peft_model(net, peft.LoraConfig(r=16, lora_alpha=16, lora_dropout=dropout, task_type="CAUSAL_LM",
                                                    target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
                               autocast_adapter_dtype=fp32_adapters)


def trainer_case(name: str, key: str, mb: int, seq: int, ckpt: bool, dtype: str, rank: int | None,
                 optim: str, workdir: Path, accum: int = 1, cap_gib: float | None = None, bf16: bool = True) -> dict:
    import torch
    from transformers import Trainer, TrainingArguments

    from wrappers.callbacks import AdvisorCallback

    _clean()
    net, cfg = _model(key, dtype, rank)
    if cap_gib is not None:  # the cap counts from here: building the model in fp32 first takes more
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(cap_gib * 2**30 / torch.cuda.get_device_properties(0).total_memory)
    retries = torch.cuda.memory_stats().get("num_alloc_retries", 0)
    peaks: dict = {}

    args = TrainingArguments(output_dir=str(workdir / name), per_device_train_batch_size=mb, max_steps=3,
                             bf16=bf16, optim=optim, gradient_checkpointing=ckpt, report_to=[], save_strategy="no",
                             logging_steps=100, dataloader_num_workers=0, remove_unused_columns=False,
                             learning_rate=1e-5, disable_tqdm=True, use_cpu=DEVICE == "cpu",
                             gradient_accumulation_steps=accum)
    advisor = AdvisorCallback(seq_len=seq, gpus="1xH100")
    trainer = Trainer(model=net, args=args, train_dataset=_Tokens(cfg["vocab_size"], seq, 3 * mb * accum),
                      callbacks=[advisor, _step_peaks(peaks)])
    printed = io.StringIO()
    oom = None
    try:
        with contextlib.redirect_stdout(printed):
            trainer.train()
    except torch.cuda.OutOfMemoryError as err:
        if cap_gib is None:
            raise
        oom = str(err).splitlines()[0][:300]
    finally:
        if cap_gib is not None:
            torch.cuda.set_per_process_memory_fraction(1.0)
    planned = advisor.verdict.planned if advisor.verdict is not None else None
    extra = {} if cap_gib is None else dict(cap_gib=cap_gib, oom=oom,
                                            alloc_retries=torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries)
    extra.update({} if bf16 else {"bf16": False})
    row = dict(kind="trainer-cap" if cap_gib is not None else "trainer", name=name, model=key, micro_batch=mb,
               seq_len=seq, checkpointing=ckpt, **extra,
               weights=dtype, lora_rank=rank, optim=optim, accumulation=accum, allocated=peaks.get("allocated"),
               reserved=peaks.get("reserved"),
               product_line=advisor.memory.line if advisor.memory is not None else None,
               product_verdict=[ln for ln in printed.getvalue().splitlines() if ln.startswith("advisor")],
               planned_allocated=getattr(planned, "peak_allocated", None),
               planned_reserved=getattr(planned, "reserved", None),
               wrapped=type(trainer.model_wrapped).__name__,
               param_dtypes=sorted({str(p.dtype) for p in net.parameters()}),
               trainable=sum(p.numel() for p in net.parameters() if p.requires_grad))
    del trainer, net
    return row


def wrap_case(key: str, mb: int, seq: int, ckpt: bool) -> dict:
    import torch

    from wrappers import wrap
    from wrappers.launch_env import read_launch_env

    _clean()
    net, cfg = _model(key, "float32", None)
    ids = torch.randint(0, cfg["vocab_size"], (mb, seq), device=DEVICE)
    loader = torch.utils.data.DataLoader(_Tokens(cfg["vocab_size"], seq, 4 * mb), batch_size=mb)
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):
        model, optimizer, loader = wrap(net, torch.optim.AdamW(net.parameters(), lr=1e-5), loader, activation_checkpointing=ckpt, seq_len=seq,
                                        env=read_launch_env({}))
        for _ in range(3):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    memory = getattr(model, "advisor_memory", None)
    row = dict(kind="wrap", model=key, micro_batch=mb, seq_len=seq, checkpointing=ckpt,
               product_line=memory.line if memory is not None else None,
               printed=[ln for ln in printed.getvalue().splitlines() if "Warning" not in ln and "warn(" not in ln][:16],
               optimizer_defaults={k: v for k, v in optimizer.defaults.items() if k in ("fused", "foreach")})
    del model, optimizer, net
    return row


def impl_case(key: str, strategy: str, world: int, mb: int, seq: int, ckpt: bool, impl: str) -> dict:
    import gpu_truth

    peaks = gpu_truth.measure(key, strategy, world, mb, seq, ckpt, optimizer_impl=impl)
    return dict(kind="impl", model=key, strategy=strategy, world=world, micro_batch=mb, seq_len=seq, checkpointing=ckpt,
                optimizer_impl=impl, step1=peaks.step1, allocated=peaks.step2, step3=peaks.step3,
                reserved=peaks.reserved)


# (model key, micro-batch, seq, checkpointing): a Lightning Trainer on one GPU (bf16-mixed, AdamW from
# configure_optimizers), with AdvisorLightningCallback's plan and its measured line
LIGHTNING_CASES = [("qwen0.5b", 4, 1024, False), ("llama1b", 2, 2048, True)]


def lightning_case(key: str, mb: int, seq: int, ckpt: bool) -> dict:
    import lightning
    import torch

    from wrappers.callbacks import AdvisorLightningCallback

    _clean()
    net, cfg = _model(key, "float32", None)
    if ckpt:
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = net

        def training_step(self, batch, index):
            return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-5)

    peaks: dict = {}

    class Peaks(lightning.Callback):
        def on_train_batch_end(self, trainer, *args, **kwargs):
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            if trainer.global_step == 1:
                torch.cuda.reset_peak_memory_stats()
            elif trainer.global_step == 3 and "allocated" not in peaks:
                peaks["allocated"] = torch.cuda.max_memory_allocated()
                peaks["reserved"] = torch.cuda.max_memory_reserved()

    advisor = AdvisorLightningCallback(micro_batch_size=mb, seq_len=seq, gpus="1xH100", activation_checkpointing=ckpt)
    loader = torch.utils.data.DataLoader(_Tokens(cfg["vocab_size"], seq, 3 * mb), batch_size=mb)
    trainer = lightning.Trainer(accelerator="gpu" if DEVICE == "cuda" else "cpu", devices=1, precision="bf16-mixed",
                                max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, callbacks=[advisor, _step_peaks(peaks)])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        trainer.fit(Module(), loader)
    planned = advisor.verdict.planned if advisor.verdict is not None else None
    row = dict(kind="lightning", model=key, micro_batch=mb, seq_len=seq, checkpointing=ckpt,
               allocated=peaks.get("allocated"), reserved=peaks.get("reserved"),
               product_line=advisor.memory.line if advisor.memory is not None else None,
               product_verdict=[ln for ln in printed.getvalue().splitlines() if ln.startswith("advisor")],
               planned_allocated=getattr(planned, "peak_allocated", None),
               planned_reserved=getattr(planned, "reserved", None), strategy=type(trainer.strategy).__name__)
    del trainer, net
    return row


def eager_case(key: str, strategy: str, world: int, mb: int, seq: int, ckpt: bool) -> dict:
    import gpu_truth

    peaks = gpu_truth.measure(key, strategy, world, mb, seq, ckpt, attention="eager")
    return dict(kind="eager", model=key, strategy=strategy, world=world, micro_batch=mb, seq_len=seq,
                checkpointing=ckpt, optimizer_impl="foreach", step1=peaks.step1, allocated=peaks.step2,
                step3=peaks.step3, reserved=peaks.reserved)


def titan_case(key: str, strategy: str, world: int, mb: int, seq: int, ckpt: bool | str, compile: bool) -> dict:
    import gpu_truth

    peaks = gpu_truth.measure(key, strategy, world, mb, seq, ckpt, optimizer_impl="fused", compile=compile,
                              compiled_loss=compile, outer_units=True, fresh_cache=True,
                              root_reshard_after_forward=False)  # the recipe row's fsdp_root_reshards
    return dict(kind="titan", model=key, strategy=strategy, world=world, micro_batch=mb, seq_len=seq,
                checkpointing=ckpt, compile=compile, optimizer_impl="fused", head_kept=True, step1=peaks.step1,
                allocated=peaks.step2,
                step3=peaks.step3, reserved=peaks.reserved)


def actoff_case(key: str, strategy: str, world: int, mb: int, seq: int) -> dict:
    import gpu_truth

    peaks = gpu_truth.measure(key, strategy, world, mb, seq, True, activation_offload=True, fresh_cache=True)
    return dict(kind="actoff", model=key, strategy=strategy, world=world, micro_batch=mb, seq_len=seq,
                checkpointing=True, optimizer_impl="foreach", step1=peaks.step1, allocated=peaks.step2,
                step3=peaks.step3, reserved=peaks.reserved)


def fsdp1_case(key: str, mb: int, seq: int, dropout: float, adapters: str, orig_params: bool, ckpt: str,
               op_trace: Path | None = None) -> dict:
    """One FSDP1 LoRA job as ``FSDP1_CASES`` describes it, rank 0 of a fake group of 2; the peaks of steps 2-3, each
    phase's own (forward with the loss, backward, optimizer step) and the allocator's cache emptied once wrapped.
    ``op_trace``: the second step's operator log (``op_trace.OpTrace``) written there as JSON."""
    import functools

    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (CheckpointImpl,
                                                                             apply_activation_checkpointing,
                                                                             checkpoint_wrapper)
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from peft.utils.other import fsdp_auto_wrap_policy

    import gpu_truth
    from wrappers.blocks import find_blocks

    if DEVICE == "cuda":
        _clean()
    net, cfg = _model(key, "bfloat16", None)
    net = _fms_lora(net, dropout, fp32_adapters=adapters == "float32")
    if ckpt != "wrapper":  # the Trainer's gradient_checkpointing=True: the model's own, before wrapping
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": ckpt == "reentrant"})
        net.enable_input_require_grads()
    kinds = {type(b) for b in find_blocks(net)}
    gpu_truth._init_group(2)
    try:
        wrapped = FSDP(net, sharding_strategy=ShardingStrategy.FULL_SHARD, auto_wrap_policy=fsdp_auto_wrap_policy(net),
                       backward_prefetch=BackwardPrefetch.BACKWARD_PRE, limit_all_gathers=True,
                       use_orig_params=orig_params, device_id=torch.device(DEVICE, 0) if DEVICE == "cuda" else torch.device("cpu"))
        if ckpt == "wrapper":
            apply_activation_checkpointing(wrapped, check_fn=lambda m: type(m) in kinds, checkpoint_wrapper_fn=functools.partial(
                checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
        opt = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=1e-5, foreach=True)
        ids = torch.randint(0, cfg["vocab_size"], (mb, seq), device=DEVICE)
        gc.collect()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        phases = {"forward": 0, "backward": 0, "optimizer_step": 0}
        reserved = dict(phases)
        at_start = 0

        def mark(phase: str | None) -> None:
            if DEVICE != "cuda":
                return
            torch.cuda.synchronize()
            if phase is not None:
                phases[phase] = max(phases[phase], torch.cuda.max_memory_allocated())
                reserved[phase] = max(reserved[phase], torch.cuda.max_memory_reserved())
            torch.cuda.reset_peak_memory_stats()

        for step in range(3):
            if step == 1:
                mark(None)
                at_start = torch.cuda.memory_allocated() if DEVICE == "cuda" else 0
            trace = None
            if op_trace is not None and step == 1:
                from op_trace import OpTrace

                trace = OpTrace(lambda: (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()))
            with trace or contextlib.nullcontext():
                loss = wrapped(input_ids=ids, labels=ids).loss
                mark("forward" if step else None)
                loss.backward()
                del loss
                mark("backward" if step else None)
                opt.step()
                opt.zero_grad(set_to_none=True)
                mark("optimizer_step" if step else None)
            if trace is not None:
                op_trace.write_text(json.dumps(trace.rows))
        units = len(FSDP.fsdp_modules(wrapped))
        trainable = sum(p.numel() for p in net.parameters() if p.requires_grad)
    finally:
        import torch.distributed as dist

        dist.destroy_process_group()
    row = dict(kind="fsdp1", model=key, strategy="zero3", world=2, micro_batch=mb, seq_len=seq, checkpointing=True,
               checkpoint_impl=ckpt, lora_rank=16, lora_dropout=dropout, adapters=adapters, use_orig_params=orig_params,
               optimizer_impl="foreach", allocated=max(phases.values()), phases=phases, at_step_start=at_start,
               reserved=max(reserved.values()), reserved_phases=reserved, units=units, trainable=trainable)
    del wrapped, net, opt
    return row


def trainer_fsdp1_case(key: str, mb: int, seq: int, workdir: Path) -> dict:
    """``FSDP1_CASES``' first jobs through the Trainer itself (accelerate's FSDP1 plugin, PEFT's wrap policy set by the
    Trainer), rank 0 of a fake group of 2 set up as ``accelerate launch`` would leave the environment."""
    import os

    import torch
    from transformers import Trainer, TrainingArguments

    import gpu_truth

    _clean()
    net, cfg = _model(key, "bfloat16", None)
    net = _fms_lora(net, 0.1, fp32_adapters=True)
    net.enable_input_require_grads()  # TRL's SFTTrainer with a PEFT config and gradient checkpointing
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT="29573")
    gpu_truth._init_group(2)
    peaks: dict = {}

    args = TrainingArguments(output_dir=str(workdir / "fsdp1"), per_device_train_batch_size=mb, max_steps=3, bf16=False,
                             optim="adamw_torch", gradient_checkpointing=True,
                             gradient_checkpointing_kwargs={"use_reentrant": True}, report_to=[], save_strategy="no",
                             logging_steps=100, dataloader_num_workers=0, remove_unused_columns=False,
                             learning_rate=1e-5, disable_tqdm=True, fsdp="full_shard auto_wrap",
                             fsdp_config={"version": 1, "backward_prefetch": "backward_pre", "use_orig_params": False,
                                          "limit_all_gathers": True})
    try:
        trainer = Trainer(model=net, args=args, train_dataset=_Tokens(cfg["vocab_size"], seq, 6 * mb))
        trainer.add_callback(_step_peaks(peaks))
        trainer.train()
        wrapped = type(trainer.model_wrapped).__name__
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    return dict(kind="trainer-fsdp1", model=key, strategy="zero3", world=2, micro_batch=mb, seq_len=seq,
                checkpointing=True, checkpoint_impl="reentrant", lora_rank=16, lora_dropout=0.1, adapters="float32",
                use_orig_params=False, optimizer_impl="foreach", allocated=peaks.get("allocated"),
                reserved=peaks.get("reserved"), wrapped=wrapped)


# BERT-large sequence classification under the Trainer, as transformers' single-GPU docs measured it on a V100 (the
# published set's hfdocs- rows: 512 tokens, eager attention, batch 4 or batch 1 with 4 micro-batches a step, gradient
# checkpointing, fp16, Adafactor), with today's default optimizer (adamw_torch_fused), plus batches, SDPA and a LoRA
# around them: what the GPU allocates and reserves, what nvidia-smi shows and the step's seconds.
# (name, micro-batch, checkpointing, precision: fp32 / fp16 / bf16, Trainer optim, accumulation, attention, LoRA rank)
BERT_CASES = [
    ("bert-bs4", 4, False, "fp32", "adamw_torch_fused", 1, "eager", None),
    ("bert-bs1-ga4", 1, False, "fp32", "adamw_torch_fused", 4, "eager", None),
    ("bert-bs1-ga4-gc", 1, True, "fp32", "adamw_torch_fused", 4, "eager", None),
    ("bert-bs4-fp16", 4, False, "fp16", "adamw_torch_fused", 1, "eager", None),
    ("bert-bs1-ga4-gc-fp16", 1, True, "fp16", "adamw_torch_fused", 4, "eager", None),
    ("bert-bs4-adafactor", 4, False, "fp32", "adafactor", 1, "eager", None),
    ("bert-bs1-ga4-gc-fp16-adafactor", 1, True, "fp16", "adafactor", 4, "eager", None),
    ("bert-bs4-foreach", 4, False, "fp32", "adamw_torch", 1, "eager", None),
    ("bert-bs2", 2, False, "fp32", "adamw_torch_fused", 1, "eager", None),
    ("bert-bs8", 8, False, "fp32", "adamw_torch_fused", 1, "eager", None),
    ("bert-bs16-fp16", 16, False, "fp16", "adamw_torch_fused", 1, "eager", None),
    ("bert-bs16-gc", 16, True, "fp32", "adamw_torch_fused", 1, "eager", None),
    ("bert-bs4-sdpa", 4, False, "fp32", "adamw_torch_fused", 1, "sdpa", None),
    ("bert-bs16-bf16-sdpa", 16, False, "bf16", "adamw_torch_fused", 1, "sdpa", None),
    ("bert-bs8-fp16-lora", 8, False, "fp16", "adamw_torch_fused", 1, "eager", 16),
    ("bert-bs16-bf16-sdpa-lora", 16, False, "bf16", "adamw_torch_fused", 1, "sdpa", 16),
]
BERT = "google-bert/bert-large-uncased"
BERT_STEPS = 6  # memory peaks over steps 2-6, seconds a step over steps 3-6


def _nvml_used() -> int | None:
    """What nvidia-smi shows used on GPU 0 (bytes), or None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
    except Exception:  # no NVML on a CPU smoke run
        return None


class _Labelled:
    """Random token rows of ``seq`` with one class label each (the hfdocs runs: labels of one class)."""

    def __init__(self, vocab: int, seq: int, n: int) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def _timed_peaks(peaks: dict, times: list[float], *, nvidia_smi: bool = False):
    """A Trainer callback that writes into ``peaks`` the allocated and reserved peaks of steps 2 to ``BERT_STEPS``
    (``nvidia_smi``: and NVML's used memory with the reserved bytes at that moment) and appends to ``times`` the
    synchronised seconds of steps 3 on."""
    import time

    import torch
    from transformers import TrainerCallback

    class Measure(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            peaks["t0"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            if state.global_step >= 3:
                times.append(time.perf_counter() - peaks["t0"])
            if state.global_step == 1 and DEVICE == "cuda":
                torch.cuda.reset_peak_memory_stats()
            elif state.global_step == BERT_STEPS and DEVICE == "cuda":
                peaks["allocated"] = torch.cuda.max_memory_allocated()
                peaks["reserved"] = torch.cuda.max_memory_reserved()
                if nvidia_smi:
                    peaks["nvidia_smi"] = _nvml_used()
                    peaks["reserved_now"] = torch.cuda.memory_reserved()
            return control

    return Measure()


def bert_case(name: str, mb: int, ckpt: bool, precision: str, optim: str, accum: int, attention: str,
              rank: int | None, workdir: Path, seq: int = 512) -> dict:
    from transformers import Trainer, TrainingArguments

    from advisor.model.bundled import load_bundled_config
    from advisor.model.heads import resolve_head
    from advisor.model.meta import build_meta_model
    from advisor.simulate.heads import head_config
    from advisor.simulate.model import materialize

    if DEVICE == "cuda":
        _clean()
    head = resolve_head("sequence-classification", 2, architecture="BertForMaskedLM", config=None)
    cfg = dict(head_config(load_bundled_config(BERT), head), attn_implementation=attention)
    net = build_meta_model(cfg)
    materialize(net, device=DEVICE, real=True)
    if rank is not None:
        import peft

        net = peft.get_peft_model(net, peft.LoraConfig(r=rank, lora_alpha=2 * rank, task_type="SEQ_CLS"))
    peaks: dict = {}
    times: list[float] = []

    args = TrainingArguments(output_dir=str(workdir / name), per_device_train_batch_size=mb, max_steps=BERT_STEPS,
                             fp16=precision == "fp16", bf16=precision == "bf16", optim=optim,
                             gradient_checkpointing=ckpt, gradient_accumulation_steps=accum, report_to=[],
                             save_strategy="no", logging_steps=100, dataloader_num_workers=0,
                             remove_unused_columns=False, learning_rate=1e-5, disable_tqdm=True,
                             use_cpu=DEVICE == "cpu")
    trainer = Trainer(model=net, args=args, train_dataset=_Labelled(cfg["vocab_size"], seq, BERT_STEPS * mb * accum),
                      callbacks=[_timed_peaks(peaks, times, nvidia_smi=True)])
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    row = dict(kind="bert", name=name, model=BERT, task="sequence-classification", micro_batch=mb, seq_len=seq,
               checkpointing=ckpt, precision=precision, optim=optim, accumulation=accum, attention=attention,
               lora_rank=rank, allocated=peaks.get("allocated"), reserved=peaks.get("reserved"),
               nvidia_smi=peaks.get("nvidia_smi"), reserved_at_nvidia_smi=peaks.get("reserved_now"),
               step_seconds=sorted(times)[len(times) // 2] if times else None, steps_timed=len(times),
               wrapped=type(trainer.model_wrapped).__name__,
               trainable=sum(p.numel() for p in net.parameters() if p.requires_grad))
    del trainer, net
    return row


# Seconds a step of decoders under the Trainer on one GPU, beside BERT's: pure fp32 (the Trainer's default without
# bf16=True / fp16=True: fp32 matmuls on the CUDA cores), bf16 autocast, and a small micro-batch where launches decide.
# (name, model key, micro-batch, seq, precision: fp32 / bf16 / fp16)
SPEED_CASES = [
    ("speed-qwen0.5b-fp32", "qwen0.5b", 4, 1024, "fp32"), ("speed-llama1b-fp32", "llama1b", 2, 2048, "fp32"),
    ("speed-qwen0.5b-bf16", "qwen0.5b", 4, 1024, "bf16"), ("speed-qwen0.5b-bf16-small", "qwen0.5b", 1, 256, "bf16"),
    ("speed-llama1b-bf16", "llama1b", 2, 2048, "bf16"),
]


BERT_FLOOR_CASES = [("bert-bs1-fp16", 1, False, "fp16", "adamw_torch_fused", 1, "eager", None)]  # launches decide


def speed_case(name: str, key: str, mb: int, seq: int, precision: str, workdir: Path) -> dict:
    """A causal LM under the Trainer (fused AdamW, fp32 weights, autocast as ``precision`` says): peaks over steps
    2-6 and the median seconds of steps 3-6, as ``bert_case`` times them."""
    from transformers import Trainer, TrainingArguments

    if DEVICE == "cuda":
        _clean()
    net, cfg = _model(key, "float32", None)
    peaks: dict = {}
    times: list[float] = []

    args = TrainingArguments(output_dir=str(workdir / name), per_device_train_batch_size=mb, max_steps=BERT_STEPS,
                             fp16=precision == "fp16", bf16=precision == "bf16", optim="adamw_torch_fused",
                             report_to=[], save_strategy="no", logging_steps=100, dataloader_num_workers=0,
                             remove_unused_columns=False, learning_rate=1e-5, disable_tqdm=True,
                             use_cpu=DEVICE == "cpu")
    trainer = Trainer(model=net, args=args, train_dataset=_Tokens(cfg["vocab_size"], seq, BERT_STEPS * mb),
                      callbacks=[_timed_peaks(peaks, times)])
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    row = dict(kind="speed", name=name, model=key, micro_batch=mb, seq_len=seq, checkpointing=False,
               precision=precision, optim="adamw_torch_fused", allocated=peaks.get("allocated"),
               reserved=peaks.get("reserved"), step_seconds=sorted(times)[len(times) // 2] if times else None,
               steps_timed=len(times))
    del trainer, net
    return row


def context_row() -> dict:
    """What nvidia-smi shows before CUDA starts, and with CUDA's context and one small tensor on the GPU (the hfdocs
    page's own measurement: ``torch.ones((1, 1)).to("cuda")``)."""
    import torch

    before = _nvml_used()
    torch.ones((1, 1)).to(DEVICE)
    torch.cuda.synchronize()
    return dict(kind="context", before_cuda=before, with_context=_nvml_used(),
                reserved=torch.cuda.memory_reserved())


# The README's first command's remedy: Qwen2.5-7B, zero3 over 2 ranks (rank 0 of a fake group), fused AdamW,
# micro-batch 1, 2,048 tokens, no checkpointing (``advisor plan -m Qwen/Qwen2.5-7B -g 2xA100 --optimizer-impl fused``)
HEADLINE_CASES = [("qwen7b", "zero3", 2, 1, 2048, False)]
# The README's LoRA command as the Trainer runs it (``advisor plan -m Qwen/Qwen2.5-7B -g 1xRTX4090 --lora 16``: one
# GPU, micro-batch 1, 2,048 tokens, checkpointing), the base loaded in bf16: a ``trainer`` row
HEADLINE_TRAINER_CASES = [("trainer-lora-7b-readme", "qwen7b", 1, 2048, True, "bfloat16", 16, "adamw_torch_fused")]


# The same job under caps on what the caching allocator may reserve (set before the model is built; building it in
# fp32 takes about 46 GiB at most): an A100-80GB's 79.15 GiB less the 1.3 GiB outside the allocator with NCCL
# (profiles/allocator_overhead.json measured_context), the plan's total less that context, and below it
HEADLINE_CAPS = (77.85, 68.5, 64.0)
BERT_MORE_CASES = [  # the compute-bound end of the same model: seconds a step where launches no longer decide
    ("bert-bs64-fp16", 64, False, "fp16", "adamw_torch_fused", 1, "eager", None),
    ("bert-bs64-bf16-sdpa", 64, False, "bf16", "adamw_torch_fused", 1, "sdpa", None),
    ("bert-bs32", 32, False, "fp32", "adamw_torch_fused", 1, "eager", None),
]


def headline_case(key: str, strategy: str, world: int, mb: int, seq: int, ckpt: bool,
                  cap_gib: float | None = None) -> dict:
    import torch

    import gpu_truth

    if cap_gib is not None:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(cap_gib * 2**30 / torch.cuda.get_device_properties(0).total_memory)
    retries = torch.cuda.memory_stats().get("num_alloc_retries", 0)
    oom = None
    try:
        peaks = gpu_truth.measure(key, strategy, world, mb, seq, ckpt, optimizer_impl="fused", fresh_cache=True)
    except torch.cuda.OutOfMemoryError as err:
        if cap_gib is None:
            raise
        peaks, oom = None, str(err).splitlines()[0][:300]
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        if cap_gib is not None:
            torch.cuda.set_per_process_memory_fraction(1.0)
    extra = {} if cap_gib is None else dict(cap_gib=cap_gib, oom=oom,
                                            alloc_retries=torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries)
    return dict(kind="headline", model=key, strategy=strategy, world=world, micro_batch=mb, seq_len=seq,
                checkpointing=ckpt, optimizer_impl="fused", **extra, step1=getattr(peaks, "step1", None),
                allocated=getattr(peaks, "step2", None), step3=getattr(peaks, "step3", None),
                reserved=getattr(peaks, "reserved", None))


# Groups whose cases each run in a process of their own: (case function, cases)
ISOLATED = {"fsdp1": (fsdp1_case, FSDP1_CASES), "trainer-fsdp1": (trainer_fsdp1_case, TRAINER_FSDP1_CASES)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_stacks.jsonl")
    parser.add_argument("--case", default="", help=argparse.SUPPRESS)  # GROUP:INDEX, one case of ISOLATED in this process
    parser.add_argument("--only", default="", help="run the groups named (trainer, wrap, impl, eager, lightning, titan, actoff, "
                        "accum, trainer8b, trainer-more, cap, cap2, fsdp1, trainer-fsdp1, trainer-pure, bert, bert-more, speed, headline, headline-cap), comma-separated")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_stacks: no CUDA device", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    import peft
    import transformers

    register_models()
    groups = ({args.case.split(":")[0]} if args.case else set(args.only.split(",")) if args.only
              else {"trainer", "wrap", "impl", "eager", "lightning", "titan", "actoff", "accum", "trainer8b", "trainer-more"})
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, transformers=transformers.__version__,
               peft=peft.__version__, python=platform.python_version())
    jobs = []
    if "impl" in groups:
        jobs += [(impl_case, c) for c in IMPL_CASES]
    if "trainer" in groups:
        jobs += [(trainer_case, (*c, args.out / "runs")) for c in TRAINER_CASES]
    if "wrap" in groups:
        jobs += [(wrap_case, c) for c in WRAP_CASES]
    if "eager" in groups:
        jobs += [(eager_case, c) for c in EAGER_CASES]
    if "lightning" in groups:
        jobs += [(lightning_case, c) for c in LIGHTNING_CASES]
    if "titan" in groups:
        jobs += [(titan_case, c) for c in TITAN_CASES]
    if "actoff" in groups:
        jobs += [(actoff_case, c) for c in ACTOFF_CASES]
    if "trainer8b" in groups:
        jobs += [(trainer_case, (*c, args.out / "runs")) for c in TRAINER_8B_CASES]
    if "cap" in groups:
        jobs += [(trainer_case, (*c[:8], args.out / "runs", 1, c[8])) for c in CAP_CASES[:3]]
    if "cap2" in groups:
        jobs += [(trainer_case, (*c[:8], args.out / "runs", 1, c[8])) for c in CAP_CASES[3:]]
    if "trainer-more" in groups:
        jobs += [(trainer_case, (*c, args.out / "runs")) for c in TRAINER_MORE_CASES]
    if "trainer-pure" in groups:
        jobs += [(trainer_case, (*c, args.out / "runs", 1, None, False)) for c in TRAINER_PURE_CASES]
    if "accum" in groups:
        jobs += [(trainer_case, (*c[:8], args.out / "runs", c[8])) for c in ACCUM_CASES]
    if "bert" in groups:
        jobs += [(context_row, ())] + [(bert_case, (*c, args.out / "runs")) for c in BERT_CASES]
    if "headline-cap" in groups:
        jobs += [(headline_case, (*HEADLINE_CASES[0], cap)) for cap in HEADLINE_CAPS]
    if "speed" in groups:
        jobs += [(speed_case, (*c, args.out / "runs")) for c in SPEED_CASES]
        jobs += [(bert_case, (*c, args.out / "runs")) for c in BERT_FLOOR_CASES]
    if "bert-more" in groups:
        jobs += [(bert_case, (*c, args.out / "runs")) for c in BERT_MORE_CASES]
    if "headline" in groups:
        jobs += [(headline_case, c) for c in HEADLINE_CASES]
        jobs += [(trainer_case, (*c, args.out / "runs")) for c in HEADLINE_TRAINER_CASES]
    if args.case:  # one case of a group that runs each case in its own process
        group, index = args.case.split(":")
        fn, cases = ISOLATED[group]
        jobs = [(fn, (*cases[int(index)], *((args.out / "runs",) if fn is trainer_fsdp1_case else ())))]
    for group, (_, cases) in ISOLATED.items():
        if group in groups and not args.case:
            for index in range(len(cases)):
                subprocess.run([sys.executable, __file__, "--out", str(args.out), "--case", f"{group}:{index}"], check=False)
    env.update(accelerate=importlib.metadata.version("accelerate"))
    with open(args.out / "gpu_stacks.jsonl", "a") as fh:
        for fn, case in jobs:
            try:
                row = fn(*case)
            except Exception as err:  # one broken case must not cost the others' device time
                row = dict(kind=fn.__name__, case=[str(c) for c in case], error=f"{type(err).__name__}: {err}",
                           trace=traceback.format_exc()[-1500:])
            row["env"] = env
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            print(json.dumps({k: v for k, v in row.items() if k not in ("env", "trace")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The pre-flight callbacks in real trainers on the CPU (a tiny Llama; the GPUs are named with
``gpus=``, since the check is against the cluster the run is for)."""

from __future__ import annotations

import re
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from wrappers.callbacks import AdvisorCallback, hf_strategy, hf_training


class _Tokens(Dataset):
    def __init__(self, seq_len: int) -> None:
        self.ids = torch.randint(0, 128, (16, seq_len), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, vocab_size=128))


def _trainer(tmp_path, callback) -> Trainer:
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=3, use_cpu=True,
                             report_to=[], save_strategy="no", logging_strategy="no")
    return Trainer(model=_model(), args=args, train_dataset=_Tokens(16), callbacks=[callback])


def test_trainer_run_prints_the_verdict_once_and_trains(tmp_path, capsys):
    callback = AdvisorCallback(seq_len=16, gpus="1xA100")
    trainer = _trainer(tmp_path, callback)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("advisor:")]
    assert trainer.state.global_step == 3 and callback.verdict.fits is True
    assert len(lines) == 1 and lines[0].endswith("GiB per GPU: fits")
    assert "ddp on 1xA100, micro-batch 2, seq 16, fp32, checkpointing off" in lines[0]


def test_strict_stops_before_the_first_step_with_advice(tmp_path, capsys):
    # 2 x 4,000,000 tokens x 128 vocabulary x (2 + 4 + 4) bytes of logits alone are 9.5 GiB, and the
    # loss backward holds 3 x 4 bytes per logit more (11.4 GiB): over a 24 GB card at any strategy.
    callback = AdvisorCallback(seq_len=4_000_000, gpus="1xRTX4090", strict=True)
    trainer = _trainer(tmp_path, callback)
    with pytest.raises(RuntimeError, match="does not fit.*advisor: advice:"):
        trainer.train()
    assert trainer.state.global_step == 0
    assert "advisor: advice:" in capsys.readouterr().out


def test_trainer_settings_are_read_as_the_trainer_runs_them(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=8,
                             activation_checkpointing=True, optim="adafactor", use_cpu=True, report_to=[])
    training = hf_training(args, _model(), seq_len=None)
    assert (training.micro_batch_size, training.global_batch_size, training.activation_checkpointing) == (4, 32, "on")
    assert (training.optimizer, training.precision, training.seq_len) == ("adafactor", "fp32", 2048)
    assert hf_strategy(SimpleNamespace(deepspeed=None, fsdp=["full_shard", "offload"])) == ("zero3_offload", "torch")
    assert hf_strategy(SimpleNamespace(deepspeed=None, fsdp=["shard_grad_op"])) == ("zero2", "torch")
    stage2 = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    assert hf_strategy(SimpleNamespace(deepspeed=stage2, fsdp=None)) == ("zero2_offload", "deepspeed")
    assert hf_strategy(SimpleNamespace(deepspeed=None, fsdp=None)) == ("ddp", "torch")


def test_the_trainers_gradient_accumulation_sync_is_read(tmp_path):
    """accelerate's no_sync by default (FSDP holds unsharded gradients until the last micro-batch); the
    accelerator_config's sync_each_batch reduce-scatters every micro-batch (advisor.estimate.accumulation)."""
    kwargs = dict(output_dir=str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=4,
                  use_cpu=True, report_to=[])
    default = hf_training(TrainingArguments(**kwargs), _model(), seq_len=16)
    synced = hf_training(TrainingArguments(**kwargs, accelerator_config={
        "gradient_accumulation_kwargs": {"sync_each_batch": True}}), _model(), seq_len=16)
    assert (default.accumulation_mode, synced.accumulation_mode) == ("last_micro_batch", "every_micro_batch")


def test_trls_activation_offloading_is_read(tmp_path):
    """TRL's SFTConfig adds ``activation_offloading`` to the TrainingArguments: planned under checkpointing
    (advisor.estimate.activation_offload); without checkpointing planned without it (not modelled there)."""
    kwargs = dict(output_dir=str(tmp_path), per_device_train_batch_size=2, use_cpu=True, report_to=[])
    checkpointed = TrainingArguments(**kwargs, gradient_checkpointing=True)
    checkpointed.activation_offloading = True  # what SFTConfig carries
    plain = TrainingArguments(**kwargs)
    plain.activation_offloading = True
    assert hf_training(checkpointed, _model(), seq_len=16).activation_offload is True
    assert hf_training(plain, _model(), seq_len=16).activation_offload is False
    assert hf_training(TrainingArguments(**kwargs, gradient_checkpointing=True), _model(), seq_len=16
                       ).activation_offload is False


@pytest.mark.parametrize("optim, impl", [("adamw_torch_fused", "fused"), ("adamw_torch", "foreach")])
def test_the_trainer_is_planned_with_its_own_recipe_and_optimizer_implementation(tmp_path, optim, impl):
    """Issue 19 item 1: the callback plans with the ``trainer`` recipe row (fused AdamW by default, as
    TrainingArguments' default optim is adamw_torch_fused) and the implementation ``optim`` names."""
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, optim=optim, use_cpu=True,
                             report_to=[])
    training = hf_training(args, _model(), seq_len=16)
    assert (training.recipe.name, training.optimizer_implementation) == ("trainer", impl)


def test_lightning_fit_runs_the_check(tmp_path, capsys):
    lightning = pytest.importorskip("lightning")
    from wrappers.callbacks import AdvisorLightningCallback

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _model()

        def training_step(self, batch, index):
            return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    callback = AdvisorLightningCallback(micro_batch_size=2, seq_len=16, gpus="1xH100")
    trainer = lightning.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                                callbacks=[callback])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Module(), torch.utils.data.DataLoader(_Tokens(16), batch_size=2))
    assert trainer.global_step == 2 and callback.verdict.fits is True
    # The plan saw the Llama inside the LightningModule, not an opaque module, with Lightning's recipe row.
    assert callback.verdict.plan.model.model_type == "llama"
    assert callback.verdict.plan.training.recipe.name == "lightning"
    assert "ddp on 1xH100, micro-batch 2, seq 16, fp32" in capsys.readouterr().out


def test_strict_advice_leaves_the_headroom():
    """The advice is a plan with --micro-batch auto, which stops at 90% of the GPU (headroom 0.1): it
    proposed micro-batch 16 at 23.1 of 23.5 GiB (98%) before. 200,000 tokens per sample: the fp32 logits
    and their loss (128 x ~22 bytes a token) make micro-batch 64 need 51 GiB."""
    from advisor.training import TrainingConfig
    from wrappers.callbacks import check

    verdict = check(_model(), strategy="ddp", training=TrainingConfig(seq_len=200_000, micro_batch_size=64,
                                                                      precision="fp32"),
                    world_size=1, gpus="1xRTX4090")
    advice = next(line for line in verdict.lines if line.startswith("advisor: advice:"))
    share = int(re.search(r"per GPU \((\d+)%\) at micro-batch (\d+)", advice).group(1))
    assert verdict.fits is False and 80 <= share <= 90


def test_strict_advice_lists_the_remedies_the_plan_lists():
    """Qwen2.5-7B zero3 on two A100s does not fit (79.6 of 79.2 GiB); the open plan offloads, and the
    advice carries the same ranked remedies as `advisor plan` (the first: three A100s, no offload)."""
    from advisor.planning.api import plan
    from advisor.training import TrainingConfig
    from wrappers.callbacks import check

    verdict = check("Qwen/Qwen2.5-7B", strategy="zero3", training=TrainingConfig(micro_batch_size=1), world_size=2,
                    gpus="2xA100")
    first = plan("Qwen/Qwen2.5-7B", "2xA100").recommendation.remedies[0]
    remedies = [line for line in verdict.lines if line.startswith("advisor: remedies")]
    assert verdict.fits is False and remedies
    assert remedies[0] == ("advisor: remedies: a saving is on zero3 at its micro-batch and checkpointing; the plan "
                           "after it picks its own")
    assert remedies[1].startswith(f"advisor: remedies that keep the mathematics: {first.name}: saves "
                                  f"{first.saved_gib:.1f} GiB per GPU; then {first.strategy} on the GPUs alone")


def test_readme_callback_on_eight_gpus_with_batch_two_does_not_raise(tmp_path, capsys):
    """The README's ``AdvisorCallback(seq_len=64, gpus="8xH100", strict=True)`` run at per-device batch 2
    on one CPU process: the check plans the 8-GPU job (global batch 2 x 8 = 16), it does not raise
    "--global-batch 2 is not divisible by 8 GPUs" out of ``trainer.train()`` (issue 21, item 14)."""
    callback = AdvisorCallback(seq_len=64, gpus="8xH100", strict=True)
    trainer = _trainer(tmp_path, callback)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    assert trainer.state.global_step == 3 and callback.verdict.fits is True
    assert callback.verdict.plan.training.global_batch_size == 16
    assert "ddp on 8xH100, micro-batch 2, seq 64" in capsys.readouterr().out


def test_a_check_the_planner_refuses_is_reported_not_raised(tmp_path, capsys):
    callback = AdvisorCallback(seq_len=64, gpus="8xNOPE", strict=True)
    trainer = _trainer(tmp_path, callback)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    assert trainer.state.global_step == 3 and callback.verdict.fits is None
    assert "advisor: pre-flight: not checked:" in capsys.readouterr().out


@pytest.mark.parametrize("strategy", ["zero2", "zero3", "zero3_offload"])
def test_our_trainer_export_is_read_back_as_its_strategy(capsys, strategy):
    """``fsdp: true`` plus ``fsdp_config`` (what transformers 5 turns every spelling into, and what
    ``advisor export --format trainer-args`` writes): was a TypeError, or read as ddp."""
    import json

    from tests.cli._main import run_main

    code, out, err = run_main(["export", "-m", "Qwen/Qwen2.5-7B", "-g", "8xH100", "--strategy", strategy,
                               "--format", "trainer-args", "-o", "-"], capsys)
    assert code == 0, err
    exported = json.loads(out)
    assert exported["fsdp"] is True
    assert hf_strategy(SimpleNamespace(deepspeed=None, **exported)) == (strategy, "torch")


def test_fsdp_checkpointing_in_fsdp_config_counts():
    args = SimpleNamespace(deepspeed=None, fsdp=True, fsdp_config={"fsdp_activation_checkpointing": True},
                           per_device_train_batch_size=1, gradient_accumulation_steps=1, world_size=1)
    assert hf_training(args, _model(), seq_len=16).activation_checkpointing == "on"


def test_weights_loaded_in_bf16_are_planned_as_pure_bf16(tmp_path):
    """transformers 5 loads a bf16 checkpoint in bf16 (``from_pretrained(dtype="auto")``) and ``bf16=True`` only
    adds autocast: without FSDP or DeepSpeed the weights train in bf16 (measured on an H100 through Trainer: 15.07
    GiB allocated, the bf16-mixed plan said 21.35; benchmarks/results/gpu_stacks.md). fp32 weights, a PEFT model's
    fp32 adapters over a bf16 base, and FSDP (accelerate upcasts to fp32) stay bf16-mixed."""
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, bf16=True, use_cpu=True,
                             report_to=[])
    assert hf_training(args, _model().to(torch.bfloat16), seq_len=16).precision == "bf16"
    assert hf_training(args, _model(), seq_len=16).precision == "bf16-mixed"
    adapters = _model().to(torch.bfloat16)
    for name, param in adapters.named_parameters():  # a PEFT model: fp32 trainable adapters, frozen bf16 base
        param.requires_grad_(name.endswith("q_proj.weight"))
        if param.requires_grad:
            param.data = param.data.float()
    assert hf_training(args, adapters, seq_len=16).precision == "bf16-mixed"
    fsdp = SimpleNamespace(bf16=True, fp16=False, fsdp=True, fsdp_config={"reshard_after_forward": True},
                           deepspeed=None, per_device_train_batch_size=2, gradient_accumulation_steps=1, optim="")
    assert hf_training(fsdp, _model().to(torch.bfloat16), seq_len=16).precision == "bf16-mixed"

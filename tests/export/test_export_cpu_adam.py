"""An exported DeepSpeed ZeRO-Offload run: the plan times DeepSpeed's CPU Adam, and DeepSpeed refuses a torch
optimizer with offload_optimizer (deepspeed runtime/engine.py: ZeRORuntimeException 'You are using ZeRO-Offload with a
client provided optimizer ...' unless zero_force_ds_cpu_optimizer is false). The export's note told the user to build
torch.optim.AdamW(fused=True); it now names DeepSpeedCPUAdam or the file's optimizer section."""

from __future__ import annotations

from advisor.export.optimizer import stack_notes
from advisor.training import TrainingConfig


def test_offloaded_deepspeed_json_names_cpu_adam():
    training = TrainingConfig(recipe="deepspeed", engine="deepspeed")
    offloaded = " ".join(stack_notes(training, "deepspeed-json", engine="deepspeed", offloads_optimizer=True))
    assert "deepspeed.ops.adam.DeepSpeedCPUAdam(params, adamw_mode=True)" in offloaded
    assert "torch.optim.AdamW" not in offloaded
    on_gpu = " ".join(stack_notes(training, "deepspeed-json", engine="deepspeed", offloads_optimizer=False))
    assert "DeepSpeedCPUAdam" not in on_gpu and "torch.optim.AdamW" in on_gpu
    # accelerate maps a torch AdamW to DeepSpeedCPUAdam itself (map_pytorch_optim_to_deepspeed): no such note
    accelerate = " ".join(stack_notes(training, "accelerate", engine="deepspeed", offloads_optimizer=True))
    assert "DeepSpeedCPUAdam" not in accelerate

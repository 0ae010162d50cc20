"""Plans the export tests and tests/export/update_golden.py share (bundled configs: offline)."""

from __future__ import annotations

from advisor.planning.api import Plan, plan

# name -> plan() arguments; the golden files are rendered from the first four.
PLANS: dict[str, dict] = {
    # context_gib=0: with the 1 GiB CUDA context zero3 no longer fits 2 A100s (the plan escalates to
    # zero2_offload, tests/planning/test_plan_cases.py); this plan is kept for its FSDP2 full-shard export.
    "qwen7b_2xa100_zero3": dict(model="Qwen/Qwen2.5-7B", gpus="2xA100", context_gib=0),
    "qwen05b_ddp": dict(model="Qwen/Qwen2.5-0.5B", gpus="2xA100"),
    "qwen7b_deepspeed_zero2_offload": dict(model="Qwen/Qwen2.5-7B", gpus="2xA100", engine="deepspeed",
                                           strategy="zero2_offload"),
    "qwen72b_2nodes": dict(model="Qwen/Qwen2.5-72B", gpus="8xH100", nodes=2),
}


def make_plan(model: str, gpus: str = "2xA100", **options) -> Plan:
    return plan(model, gpus, **options)

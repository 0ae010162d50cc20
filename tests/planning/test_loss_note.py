"""The plan says when the loss decides the peak, and what the other loss kernels would save."""

from __future__ import annotations

import re

import advisor


def test_qwen7b_long_context_names_the_loss_and_its_saving():
    plan = advisor.plan("Qwen/Qwen2.5-7B", "8xH100", seq_len=16384)
    note = next(line for line in plan.why if line.startswith("the loss decides the peak"))
    chunked = float(re.search(r"--loss chunked would save ([\d.]+) GiB", note).group(1))
    fused = float(re.search(r"--loss fused ([\d.]+) GiB", note).group(1))
    # The fp32 copy of the logits alone: 16384 tokens x 152,064 vocabulary x 4 bytes = 9.28 GiB.
    assert fused >= 16384 * 152_064 * 4 / 2**30
    assert 0 < chunked < fused


def test_no_note_when_the_loss_is_not_what_fills_the_gpu():
    plan = advisor.plan("Qwen/Qwen2.5-7B", "8xH100", seq_len=512, micro_batch_size=1)
    assert not any(line.startswith("the loss decides") for line in plan.why)


def test_nothing_fits_says_which_kernel_would():
    # One 24 GB card, Qwen2.5-0.5B at 64k tokens: the hf loss's logits alone are
    # 65536 x 151,936 x 10 bytes = 99.6 GB.
    plan = advisor.plan("Qwen/Qwen2.5-0.5B", "1xRTX4090", seq_len=65536)
    assert plan.recommendation is None
    assert any(line.startswith("nothing fits with the hf loss") and "with --loss fused, " in line and "fits at micro-batch 1" in line
               for line in plan.why)


def test_a_kernel_that_saves_nothing_is_not_quoted_as_a_negative_saving():
    """QLoRA of Qwen2.5-7B on one RTX 4090 at micro-batch 1: the fused kernel's own buffers used to outweigh
    the logits it drops (it built the frozen head's fp32 gradient) and the note printed '--loss fused -0.7
    GiB'. The kernel now skips a frozen head's gradient, so both kernels save; only savings are quoted."""
    plan = advisor.plan("Qwen/Qwen2.5-7B", "1xRTX4090", lora=16, quantize="nf4")
    note = next(line for line in plan.why if line.startswith("the loss decides the peak"))
    assert "--loss chunked would save" in note and "--loss fused" in note
    assert not re.search(r"-\d", note)


def test_no_data_parallel_candidates_no_loss_note():
    """--global-batch 64 at micro-batch 8 on 16 GPUs cannot be split by data parallelism alone and no mesh
    fits: the loss note looked up the size default among no candidates (KeyError, exit 1)."""
    plan = advisor.plan("meta-llama/Llama-2-70b-hf", "2x8xH100", seq_len=2048, micro_batch_size=8,
                        global_batch_size=64)
    assert plan.recommendation is None and not any(line.startswith("nothing fits with the hf loss") for line in plan.why)


def test_no_kernel_offered_where_wrappers_losses_cannot_run_it():
    # Gemma 2 soft-caps its logits (final_logit_softcapping 30.0), which the kernels do not repeat: at 8k
    # tokens on one 24 GB card nothing fits with the hf loss, and the plan used to offer --loss chunked
    # (zero3_offload at 21.7 GiB) and --loss fused as remedies; it offers neither now.
    plan = advisor.plan("google/gemma-2-2b", "1xRTX4090", seq_len=8192)
    assert plan.recommendation is None
    assert not any("--loss" in str(line) for line in plan.why)  # nothing fits: the remedies are why lines
    # the same shape of problem on a model the kernels run on still names them (Qwen2.5-0.5B, 64k tokens)
    qwen = advisor.plan("Qwen/Qwen2.5-0.5B", "1xRTX4090", seq_len=65536)
    assert any("--loss fused" in str(line) for line in qwen.why)


def test_pinned_kernel_on_a_refused_model_is_one_line_and_exit_2(capsys):
    from tests.cli._main import run_main

    for model, reason in (("google/gemma-2-9b", "(final_logit_softcapping=30.0)"),):
        code, out, err = run_main(["plan", "--model", model, "--gpus", "2xA100", "--loss", "chunked"], capsys)
        lines = err.strip().splitlines()
        assert code == 2 and not out
        assert len(lines) == 1 and reason in lines[0] and lines[0].endswith("use --loss hf")


"""Real runs feed back (issue 20, "What to build" item 5): on CUDA, ``wrap()`` and the Trainer / Lightning
callbacks read the peak allocated and reserved memory of steps 2-3 and print them beside the plan's figures in
one line. On the CPU the CUDA statistics are replaced by a stub source (``wrappers.measured``'s one seam,
``device_memory_source``) that records when it was reset and read."""

from __future__ import annotations

import dataclasses
import warnings
from types import SimpleNamespace

import pytest
import torch

from advisor.units import GIB
from tests.wrappers._dist import build_adamw, global_batch, tiny_llama
from tests.wrappers.test_callbacks import _Tokens, _trainer
from wrappers import measured, wrap
from wrappers.callbacks import AdvisorCallback
from wrappers.launch_env import read_launch_env


class StubMemory:
    """Peaks a test chooses; ``events`` records the resets and reads in order."""

    def __init__(self, allocated: int, reserved: int) -> None:
        self.allocated, self.reserved, self.events = allocated, reserved, []

    def reset_peaks(self) -> None:
        self.events.append("reset")

    def peak_allocated(self) -> int:
        self.events.append("read")
        return self.allocated

    def peak_reserved(self) -> int:
        return self.reserved


def test_steps_two_and_three_are_measured_beside_the_plan():
    """Reset after step 1, read after step 3, once. 61.2 GiB allocated against 60.0 planned is +2.0%;
    64.0 reserved against 64.0 planned is +0.0%."""
    source, lines = StubMemory(int(61.2 * GIB), 64 * GIB), []
    planned = SimpleNamespace(peak_allocated=60 * GIB, reserved=64 * GIB)
    watcher = measured.StepMemory(source, planned, lines.append)
    for step in range(1, 6):
        watcher.step_done()
        assert source.events == ([] if step < 1 else ["reset"] if step < 3 else ["reset", "read"])
    assert lines == ["advisor: measured over steps 2-3: peak allocated 61.20 GiB (planned 60.00, +2.0%), "
                     "reserved 64.00 GiB (planned 64.00, +0.0%)"]


def test_no_plan_prints_the_measurement_and_says_why_nothing_is_beside_it():
    line = measured.measured_line(3 * GIB, 4 * GIB, None)
    assert line == ("advisor: measured over steps 2-3: peak allocated 3.00 GiB, reserved 4.00 GiB "
                    "(no plan to compare: memory was not planned for this run)")


def test_off_cuda_nothing_is_watched():
    assert measured.device_memory_source(torch.device("cpu")) is None
    assert measured.device_memory_source(None) is None
    assert isinstance(measured.device_memory_source(torch.device("cuda", 0)), measured.CudaMemory)


def test_wrap_measures_the_loop_that_steps_its_optimizer(monkeypatch, capsys):
    """One process, a plain loop: the optimizer ``wrap()`` returns carries the watcher; the line comes once,
    after the third step, on stderr with the decision."""
    source = StubMemory(5 * GIB, 6 * GIB)
    monkeypatch.setattr(measured, "device_memory_source", lambda device: source)
    model = tiny_llama(0)
    model, optimizer = wrap(model, build_adamw(model), env=read_launch_env({}))
    for step in range(4):
        ids = global_batch(step)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    err = [line for line in capsys.readouterr().err.splitlines() if "measured" in line]
    assert err == [measured.measured_line(5 * GIB, 6 * GIB, None)]  # no GPU at wrap: nothing was planned
    assert model.advisor_memory.steps == 3 and source.events == ["reset", "read"]  # hook removed after step 3


def test_trainer_callback_prints_the_measurement_beside_its_plan(monkeypatch, tmp_path, capsys):
    source = StubMemory(GIB // 4, GIB // 2)
    monkeypatch.setattr(measured, "device_memory_source", lambda device: source)
    callback = AdvisorCallback(seq_len=16, gpus="1xA100")
    trainer = _trainer(tmp_path, callback)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    out = [line for line in capsys.readouterr().out.splitlines() if "measured" in line]
    planned = callback.verdict.planned
    assert planned is not None and planned.peak_allocated > 0
    assert out == [measured.measured_line(GIB // 4, GIB // 2, planned)]
    assert f"(planned {planned.peak_allocated / GIB:.2f}, " in out[0]


def test_lightning_callback_counts_optimizer_steps_not_batches(monkeypatch, tmp_path, capsys):
    """With two batches per optimizer step, step 1 ends with batch 2 and step 3 with batch 6: the peaks are reset
    between batches 2 and 3 and read after batch 6 (``events`` records each batch as its training step begins)."""
    lightning = pytest.importorskip("lightning")
    from wrappers.callbacks import AdvisorLightningCallback

    source = StubMemory(GIB, 2 * GIB)
    monkeypatch.setattr(measured, "device_memory_source", lambda device: source)

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_llama(0)
            self.batches = 0

        def training_step(self, batch, index):
            self.batches += 1
            source.events.append(f"batch {self.batches}")
            return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    callback = AdvisorLightningCallback(micro_batch_size=2, seq_len=16, gpus="1xH100")
    trainer = lightning.Trainer(accelerator="cpu", devices=1, max_steps=3, accumulate_grad_batches=2, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                default_root_dir=tmp_path, callbacks=[callback])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Module(), torch.utils.data.DataLoader(_Tokens(16), batch_size=2))
    assert trainer.global_step == 3
    assert source.events == ["batch 1", "batch 2", "reset", "batch 3", "batch 4", "batch 5", "batch 6", "read"]
    assert [line for line in capsys.readouterr().out.splitlines() if "measured" in line] == [
        measured.measured_line(GIB, 2 * GIB, callback.verdict.planned)]


def test_wrap_on_one_gpu_plans_the_unchanged_model():
    """One process and one GPU: nothing is applied, but the plain model is planned (fp32, no DDP wrapper), so the
    measured line has figures beside it; on the H100 the plan was within 0.3% (benchmarks/results/gpu_stacks.md)."""
    from wrappers.wrap import plan_wrap

    env = dataclasses.replace(read_launch_env({}), num_gpus=1, gpu_name="H100")
    decision = plan_wrap(tiny_llama(0), env, micro_batch_size=2, seq_len=16)
    assert decision.strategy is None and decision.plan is not None
    assert decision.plan.training.precision == "fp32"
    assert decision.plan.chosen.runs_as.startswith("the plain model")
    assert measured.planned_breakdown(decision.plan, decision.strategy) is decision.plan.chosen.memory_bytes

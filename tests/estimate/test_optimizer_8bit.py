"""bitsandbytes' 8-bit AdamW state by release (advisor.estimate.optimizer_8bit,
profiles/bitsandbytes_optimizers.json): bitsandbytes/optim/optimizer.py ``Optimizer2State.init_state`` gives a
parameter of n elements two uint8 states (n bytes each) and two fp32 absmax vectors of ceil(n / block)
entries; the block is 2048 up to 0.43.3 and 256 from 0.44.0 (commit aa57bd89, PR #1365)."""

from __future__ import annotations

import pytest

import advisor
from advisor.estimate.optimizer_8bit import eight_bit_state_bytes
from advisor.estimate.states import optimizer_state_bytes
from advisor.model.spec import spec_from_size
from advisor.planning import api
from advisor.training import TrainingConfig

# One 4096 x 4096 weight, n = 16,777,216: state1 + state2 = 2 x 16,777,216 = 33,554,432 bytes.
# 0.43.3: 16,777,216 / 2048 = 8,192 blocks; absmax1 + absmax2 = 2 x 8,192 x 4 = 65,536 bytes.
# 0.44.0: 16,777,216 / 256 = 65,536 blocks; absmax1 + absmax2 = 2 x 65,536 x 4 = 524,288 bytes.
WEIGHT = 4096 * 4096
BYTES_2048 = 33_554_432 + 65_536  # 33,619,968
BYTES_256 = 33_554_432 + 524_288  # 34,078,720

# GPT-2 (124,439,808 parameters, tied head): 2 x 124,439,808 = 248,879,616 bytes of uint8 moments, plus
# 8 x 124,439,808 / 2048 = 486,093 (floor) or 8 x 124,439,808 / 256 = 3,888,744 bytes of absmax.
GPT2_2048 = 248_879_616 + 486_093
GPT2_256 = 248_879_616 + 3_888_744


@pytest.mark.parametrize(("release", "expected"), [("0.42.0", BYTES_2048), ("0.43.3", BYTES_2048),
                                                   ("0.44.0rc1", BYTES_256), ("0.44.0", BYTES_256),
                                                   ("0.50.1", BYTES_256), (None, BYTES_256)])
def test_one_weight_by_release(release, expected):
    assert eight_bit_state_bytes(WEIGHT, release) == expected


@pytest.mark.parametrize("optimizer", ["adamw-8bit", "adamw-8bit-paged"])
@pytest.mark.parametrize(("release", "expected"), [("0.43.3", BYTES_2048), ("0.45.5", BYTES_256)])
def test_optimizer_state_of_a_training(optimizer, release, expected):
    training = TrainingConfig(optimizer=optimizer, bitsandbytes=release)
    assert optimizer_state_bytes(spec_from_size(WEIGHT), training, state_bytes=4) == expected


def test_not_a_release_is_a_value_error():
    with pytest.raises(ValueError, match="not a release number"):
        TrainingConfig(optimizer="adamw-8bit", bitsandbytes="latest")


def _ddp_plan(monkeypatch, installed, **options):
    monkeypatch.setattr(api, "installed_release", lambda library: installed)
    plan = advisor.plan("gpt2", "1xA100", strategy="ddp", micro_batch_size=1, seq_len=128, **options)
    optimizer = next(c for c in plan.candidates if c.strategy == "ddp").memory_bytes.optimizer
    return plan, optimizer, [line for line in plan.assumptions if line.startswith("8-bit AdamW state")]


def test_installed_release_decides(monkeypatch):
    plan, optimizer, lines = _ddp_plan(monkeypatch, "0.43.3", optimizer="adamw-8bit")
    assert optimizer == GPT2_2048
    assert plan.training.bitsandbytes == "0.43.3"
    assert lines == ["8-bit AdamW state: bitsandbytes 0.43.3 (installed): two uint8 moments and one fp32 absmax "
                     "per 2048-element block of each (2.00391 bytes a trainable parameter; "
                     "profiles/bitsandbytes_optimizers.json)"]


def test_not_installed_assumes_the_newest(monkeypatch):
    plan, optimizer, lines = _ddp_plan(monkeypatch, None, optimizer="adamw-8bit-paged")
    assert optimizer == GPT2_256 - 248_879_616  # paged: the moments live in managed memory, the absmax on the device
    assert plan.training.bitsandbytes is None
    assert lines == ["8-bit AdamW state: bitsandbytes not installed, the newest release's behaviour assumed "
                     "(0.44.0 and later): two uint8 moments and one fp32 absmax per 256-element block of each "
                     "(2.03125 bytes a trainable parameter; profiles/bitsandbytes_optimizers.json)"]


def test_a_given_release_wins_over_the_installed(monkeypatch):
    _, optimizer, lines = _ddp_plan(monkeypatch, "0.49.0", optimizer="adamw-8bit", bitsandbytes="0.43.3")
    assert optimizer == GPT2_2048
    assert lines[0].startswith("8-bit AdamW state: bitsandbytes 0.43.3 (given)")


def test_other_optimizers_do_not_read_the_release(monkeypatch):
    def refuse(library):
        raise AssertionError(f"{library} read for a plan without an 8-bit optimizer")

    monkeypatch.setattr(api, "installed_release", refuse)
    plan = advisor.plan("gpt2", "1xA100", strategy="ddp", micro_batch_size=1, seq_len=128)
    assert not [line for line in plan.assumptions if "bitsandbytes" in line]
    assert "bitsandbytes" not in plan.training.model_dump()

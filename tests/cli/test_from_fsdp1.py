"""``--from`` a file that runs FSDP1 plans FSDP1 (``TrainingConfig.fsdp_version``): accelerate's
``fsdp_version: 1``, an accelerate FSDP file naming no version (``accelerate launch --fsdp_version`` defaults
to "1", accelerate/commands/launch.py) unless it spells reshard_after_forward as FSDP2's bool (which the FSDP1
plugin refuses), and the Trainer's ``fsdp_config`` ``version: 1`` (its default is 2, transformers
training_args.py). The plan says FSDP1 was planned and that wrap() and the exports apply FSDP2."""

from __future__ import annotations

import json

import pytest

from advisor.planning.config_formats import read_config_file
from tests.cli._main import run_main

FSDP1_NOTE = "FSDP planned as FSDP1"


def _accelerate(tmp_path, version_line: str, reshard: str = "  fsdp_sharding_strategy: FULL_SHARD\n"):
    path = tmp_path / "fsdp.yaml"
    path.write_text(f"distributed_type: FSDP\nmixed_precision: bf16\nnum_processes: 2\nfsdp_config:\n{version_line}"
                    f"{reshard}")
    return path


@pytest.mark.parametrize("line,expected", [("  fsdp_version: 1\n", 1), ("  fsdp_version: 2\n", None), ("", 1)])
def test_accelerate_fsdp_version_is_taken(tmp_path, line, expected):
    settings = read_config_file(_accelerate(tmp_path, line)).settings
    assert settings.get("fsdp_version") == expected
    assert settings["strategy"] == "zero3"


def test_an_fsdp2_bool_without_a_version_stays_fsdp2(tmp_path):
    path = _accelerate(tmp_path, "", reshard="  fsdp_reshard_after_forward: true\n")
    assert "fsdp_version" not in read_config_file(path).settings


def test_trainer_fsdp_config_version_1_is_taken(tmp_path):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"bf16": True, "fsdp": "full_shard auto_wrap", "fsdp_config": {"version": 1}}))
    config = read_config_file(path)
    assert config.settings.get("fsdp_version") == 1
    assert not any("planned as FSDP2" in note for note in config.notes)
    path.write_text(json.dumps({"bf16": True, "fsdp": "full_shard auto_wrap", "fsdp_config": {"version": 2}}))
    assert "fsdp_version" not in read_config_file(path).settings


def test_the_plan_says_fsdp1_and_keeps_fsdp2_for_wrap(tmp_path, capsys):
    """The JSON's training says fsdp_version 1 and an assumption says FSDP1 was planned while wrap() and the
    exports apply FSDP2; the same plan typed without the file says neither (the moments it moves are worked
    by hand in tests/estimate/test_fsdp1.py)."""
    path = _accelerate(tmp_path, "  fsdp_version: 1\n")
    args = ["plan", "-m", "Qwen/Qwen2.5-0.5B", "-g", "A100", "--micro-batch", "1", "--activation-checkpointing", "on",
            "--json"]
    code, out, err = run_main([*args, "--from", str(path)], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["training"]["fsdp_version"] == 1
    assert any(FSDP1_NOTE in a and "apply FSDP2" in a for a in doc["assumptions"])
    code, out2, err = run_main([*args, "--strategy", "zero3", "--precision", "bf16-mixed", "--recipe", "trainer"],
                               capsys)
    doc2 = json.loads(out2)
    assert "fsdp_version" not in doc2["training"]
    assert not any(FSDP1_NOTE in a for a in doc2["assumptions"])

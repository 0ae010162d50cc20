"""The release table (profiles/library_releases.json): which behaviours a set of installed versions has."""

from __future__ import annotations

import pytest

from advisor.model.releases import behaviours_in_force, is_release, load_release_behaviours, release_tuple
from advisor.training import TrainingConfig


@pytest.mark.parametrize("version,expected", [("5.24.0", (5, 24, 0)), ("2.13.0+cpu", (2, 13, 0)),
                                              ("5.25.0.dev0", (5, 25, 0)), ("5.24.0rc1", (5, 24, 0)),
                                              ("4.57", (4, 57))])
def test_release_tuple(version, expected):
    assert release_tuple(version) == expected


@pytest.mark.parametrize("version,keeps", [("5.23.0", False), ("4.57.6", False), ("5.24.0", True),
                                           ("5.30.1", True), ("6.0.0", True)])
def test_llava_tower_behaviour_from_5_24(version, keeps):
    """transformers 5.24.0 is the first release whose Llava output keeps the tower's output (the table's source)."""
    found = behaviours_in_force({"transformers": version})
    assert ("llava_output_keeps_vision_tower" in found) is keeps
    if keeps:
        assert found["llava_output_keeps_vision_tower"] == f"transformers {version}"


def test_every_row_names_its_source():
    assert all(row.source and row.what for row in load_release_behaviours())
    assert behaviours_in_force({}) == {}


@pytest.mark.parametrize("version,keeps", [("5.23.0", False), ("5.24.0", True), ("5.24.0rc1", True),
                                           ("5.25.0.dev0", True)])
def test_kv_cache_values_dtype_from_5_24(version, keeps):
    """transformers 5.24.0 is the first release whose DynamicCache keeps the values in their own dtype."""
    found = behaviours_in_force({"transformers": version})
    assert found.get("kv_cache_values_keep_their_dtype") == (f"transformers {version}" if keeps else None)


@pytest.mark.parametrize("version", ["2.7.1", "0.26", "5.25.0.dev0", "2.5.0rc1", "2.13.0+cpu", "0.45.5.post1",
                                     # PEP 440's other spellings, as metadata may carry them
                                     "1.0.0-rc1", "1.0.0c1", "1.0.0RC1", "1.0.0.dev", "2.5.1+cu124-abc",
                                     "2.5.0a0+git1234abc", "2.6.0.dev20241112+cu124", "2.5.0a0+e000cf0ad9.nv24.10"])
def test_a_release_as_written(version):
    assert is_release(version)
    assert TrainingConfig(torch_release=version).torch_release == version


@pytest.mark.parametrize("version", ["0", "2", "1..2", "2.7.", ".2.7", "latest", "v2.7.1", "2.7.1 ", "2.7.x", ""])
def test_not_a_release(version):
    """One number alone names no release of torch, transformers, TRL or bitsandbytes (all read major.minor)."""
    assert not is_release(version)
    with pytest.raises(ValueError, match="not a release number"):
        TrainingConfig(trl_release=version)

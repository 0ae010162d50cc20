"""The release table (profiles/library_releases.json): which behaviours a set of installed versions has."""

from __future__ import annotations

import pytest

from advisor.model.releases import behaviours_in_force, load_release_behaviours, release_tuple


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

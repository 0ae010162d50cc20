"""The spec and profile caches trust nothing they did not write (issue 21, items 9 and 13): an edited
entry is counted again, a link is neither followed nor written through, a FIFO does not hang."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from advisor.model.block_profile import Bilinear, BlockProfile, ProfileKey
from advisor.model.cache_entry import read_entry, write_entry
from advisor.model.spec import spec_from_size
from advisor.model.spec_cache import cached_spec
from advisor.simulate import profile_cache

CFG = {"model_type": "opt", "hidden_size": 64, "num_hidden_layers": 2}
TOTAL = 204_672  # the count the (stand-in) meta-device counter returns


class _Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return spec_from_size(TOTAL, name="counted")


def _entry_file(cache: Path) -> Path:
    (found,) = (cache / "specs").iterdir()
    return found


def _poison(value):
    """Every total_params / trainable_params in a JSON document set to 1, whatever the layout."""
    if isinstance(value, dict):
        return {k: 1 if k in ("total_params", "trainable_params") else _poison(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_poison(v) for v in value]
    return value


def test_a_cached_spec_is_read_back(tmp_path):
    counter = _Counter()
    first = cached_spec(CFG, name="m", cache_dir=tmp_path, count=counter)
    again = cached_spec(CFG, name="m2", cache_dir=tmp_path, count=counter)
    assert counter.calls == 1 and again.total_params == first.total_params == TOTAL and again.name == "m2"


def test_a_poisoned_entry_is_counted_again(tmp_path):
    counter = _Counter()
    cached_spec(CFG, name="m", cache_dir=tmp_path, count=counter)
    path = _entry_file(tmp_path)
    path.write_text(json.dumps(_poison(json.loads(path.read_text()))))
    spec = cached_spec(CFG, name="m", cache_dir=tmp_path, count=counter)
    assert spec.total_params == TOTAL and counter.calls == 2
    assert cached_spec(CFG, name="m", cache_dir=tmp_path, count=counter).total_params == TOTAL  # rewritten
    assert counter.calls == 2


@pytest.mark.parametrize("damage", ["truncated", "not json", "deeply nested", "a list"])
def test_a_damaged_entry_is_a_miss(tmp_path, damage):
    counter = _Counter()
    cached_spec(CFG, name="m", cache_dir=tmp_path, count=counter)
    path = _entry_file(tmp_path)
    text = path.read_text()
    path.write_text({"truncated": text[: len(text) // 2], "not json": "\x00\xff", "deeply nested": "[" * 100_000,
                     "a list": "[1]"}[damage])
    assert cached_spec(CFG, name="m", cache_dir=tmp_path, count=counter).total_params == TOTAL
    assert counter.calls == 2


def test_a_link_at_an_entry_is_replaced_not_written_through(tmp_path):
    counter = _Counter()
    cached_spec(CFG, name="m", cache_dir=tmp_path, count=counter)
    path = _entry_file(tmp_path)
    path.unlink()
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    path.symlink_to(victim)
    assert cached_spec(CFG, name="m", cache_dir=tmp_path, count=counter).total_params == TOTAL
    assert victim.read_text() == "the user's file"
    assert path.is_file() and not path.is_symlink()  # the link itself was replaced by a fresh entry


def _within(seconds: float, fn):
    """``fn()``'s result, failing the test if it has not returned in ``seconds`` (a hang)."""
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("out", fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "hung"
    return box["out"]


@pytest.mark.parametrize("kind", ["fifo", "dev-zero link", "directory"])
def test_a_special_file_at_an_entry_is_a_miss_without_a_hang(tmp_path, kind):
    counter = _Counter()
    cached_spec(CFG, name="m", cache_dir=tmp_path, count=counter)
    path = _entry_file(tmp_path)
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    try:
        spec = _within(20, lambda: cached_spec(CFG, name="m", cache_dir=tmp_path, count=counter))
    finally:
        if kind == "fifo" and path.exists() and not path.is_file():  # unblock a reader stuck in open()
            with open(os.open(path, os.O_WRONLY | os.O_NONBLOCK), "w"):
                pass
    assert spec.total_params == TOTAL and counter.calls == 2


def test_a_linked_cache_subdirectory_is_not_used(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "specs").symlink_to(elsewhere)
    counter = _Counter()
    cached_spec(CFG, name="m", cache_dir=tmp_path / "cache", count=counter)
    assert list(elsewhere.iterdir()) == []


def test_an_entry_copied_to_another_name_is_a_miss(tmp_path):
    write_entry(tmp_path / "a.json", {"x": 1}, kind="spec")
    assert read_entry(tmp_path / "a.json", kind="spec") == {"x": 1}
    (tmp_path / "b.json").write_bytes((tmp_path / "a.json").read_bytes())
    assert read_entry(tmp_path / "b.json", kind="spec") is None
    assert read_entry(tmp_path / "a.json", kind="profile") is None
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []


def test_a_poisoned_profile_is_traced_again(tmp_path):
    key = ProfileKey(residual_bytes=2, compute_bytes=2, input_casts=False, checkpointing="off", seq_len=64,
                     attention="sdpa", loss="hf")
    zero = Bilinear(const=0, per_sample=0, per_layer=0, per_layer_sample=0)
    profile = BlockProfile(key=key, saved=Bilinear(const=1, per_sample=2, per_layer=3, per_layer_sample=4),
                           forward_peak=zero, loss_peak=zero, block_peak=zero, recompute=zero,
                           layer_saved_per_sample=4)
    path = profile_cache.cache_path(tmp_path, CFG, key, {"torch": "t", "transformers": "t"})
    write_entry(path, profile.model_dump(mode="json"), kind="profile")
    assert profile_cache._read(path, key) == profile
    text = path.read_text().replace('"per_layer_sample": 4', '"per_layer_sample": 0')
    path.write_text(text)
    assert profile_cache._read(path, key) is None


# -- fuzz: whatever the entry file holds, the plan's count is the counter's ---------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                     max_leaves=12)


@st.composite
def _entry_damage(draw):
    kind = draw(st.sampled_from(["bytes", "json", "edit", "flip"]))
    if kind == "bytes":
        return kind, draw(st.binary(max_size=200))
    if kind == "json":
        return kind, draw(_JSON)
    if kind == "edit":  # one field of the real entry changed, the envelope kept
        return kind, (draw(st.sampled_from(["total_params", "trainable_params", "name", "source", "schema", "sha256",
                                            "kind", "count_method"])), draw(_JSON))
    return kind, draw(st.integers(min_value=0, max_value=10**6))


@settings(max_examples=150, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(_entry_damage())
def test_any_damage_to_an_entry_is_a_miss_never_a_wrong_count(tmp_path_factory, damage):
    cache = tmp_path_factory.mktemp("cache")
    counter = _Counter()
    cached_spec(CFG, name="m", cache_dir=cache, count=counter)
    path = _entry_file(cache)
    kind, value = damage
    if kind == "bytes":
        path.write_bytes(value)
    elif kind == "json":
        path.write_text(json.dumps(value))
    elif kind == "edit":
        doc = json.loads(path.read_text())
        field, new = value
        (doc if field in ("schema", "sha256", "kind") else doc["entry"])[field] = new
        path.write_text(json.dumps(doc))
    else:
        data = bytearray(path.read_bytes())
        data[value % len(data)] ^= 0x20
        path.write_bytes(bytes(data))
    spec = cached_spec(CFG, name="m", cache_dir=cache, count=counter)
    assert spec.total_params == TOTAL and spec.trainable_params == TOTAL

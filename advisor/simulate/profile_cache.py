"""Traced activation profiles, cached as JSON per (config, recipe dtypes, shape).

``traced_profiles(cfg, keys, cache_dir=)`` returns one ``BlockProfile`` per key, reading each from
``cache_dir`` when an earlier plan traced it and tracing (``advisor.simulate.profile``) otherwise.
The file name is a hash of the config (less the name fields), the key, the torch and transformers
versions (another version traces again: the modeling code decides what is saved) and the tracer's
revision (``TRACER_REVISION``).
``default_cache_dir`` is the one place that reads the environment (``$XDG_CACHE_HOME/dp-advisor``, else ``~/.cache/dp-advisor``): the CLI calls it and
passes the path in; the library never looks it up itself. ``cache_dir=None``: no caching.
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Callable

from advisor.model.block_profile import BlockProfile, ProfileKey
from advisor.model.cache_entry import read_entry, write_entry
from advisor.model.spec_cache import cache_file_stem, config_digest, library_versions


# What the tracer runs beyond the library versions: a profile traced before a change here is traced again.
# "cuda-sdpa/autocast": SDPA runs the kernel CUDA picks for the dtype it sees (advisor.simulate.cuda_kernels):
# math for fp32 GQA outside autocast. "frozen-head-loss": wrappers.losses' kernels make no gradient for a frozen
# head (LoRA) and accept more families, so LoRA profiles traced under --loss fused held a head gradient no step holds.
# "logsumexp-scratch": the fused loss's logsumexp holds a chunk-sized scratch (advisor.simulate.fake_env.kernel_scratch).
# "blocks-window": the blocks' backward peak ends where the bottom block's is done, before the embedding's backward.
TRACER_REVISION = "cuda-sdpa/autocast/frozen-head-loss/logsumexp-scratch/blocks-window/softmax-product/stored-head"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/dp-advisor``, else ``~/.cache/dp-advisor`` (the XDG base directory spec)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dp-advisor"


def cache_path(cache_dir: Path, cfg: dict, key: ProfileKey, versions: dict) -> Path:
    dumped = key.model_dump()
    if key.adapters is None:  # a full fine-tune's key as before adapters were traced: its cached files still match
        dumped.pop("adapters")
    digest = config_digest(cfg, key=dumped, versions=versions)
    return cache_dir / "profiles" / f"{cache_file_stem(cfg)}-{digest}.json"


def _read(path: Path, key: ProfileKey) -> BlockProfile | None:
    entry = read_entry(path, kind="profile")  # advisor.model.cache_entry: regular files only, checksummed
    try:
        profile = BlockProfile.model_validate(entry) if entry is not None else None
    except ValueError:
        return None  # written by another version: trace again
    return profile if profile is not None and profile.key == key else None


def traced_profiles(cfg: dict, keys: list[ProfileKey], *, cache_dir: Path | None,
                    progress: Callable[[float | None], None] | None = None) -> tuple[BlockProfile, ...]:
    """One profile per key, from the cache or traced now (and then cached). ``progress`` is called with
    None before the first trace (a cache hit calls nothing) and, even when tracing fails, with the
    seconds it took."""
    started: list[float] = []

    def on_miss() -> None:
        if not started:
            started.append(time.perf_counter())
            if progress is not None:
                progress(None)

    try:
        return _cached_or_traced(cfg, keys, cache_dir=cache_dir, on_miss=on_miss)
    finally:
        if started and progress is not None:
            progress(time.perf_counter() - started[0])


def _cached_or_traced(cfg: dict, keys: list[ProfileKey], *, cache_dir: Path | None,
                      on_miss: Callable[[], None]) -> tuple[BlockProfile, ...]:
    versions = {**library_versions(), "tracer": TRACER_REVISION}
    out = {}
    built: dict = {}  # meta models by (blocks, checkpointing, adapters), shared by the keys
    layer_saved: dict[tuple, int] = {}  # per dtypes: one block's saved bytes, from the key without checkpointing
    # Every file name from the config as given, before the tracer hands any of it to transformers
    # (which edits nested dicts in place: rope_scaling gains rope_theta), and the tracer gets a copy.
    paths = {key: cache_path(cache_dir, cfg, key, versions) if cache_dir is not None else None for key in keys}
    for key in sorted(keys, key=lambda k: k.checkpointing != "off"):
        dtypes = (key.residual_bytes, key.compute_bytes, key.input_casts)
        path = paths[key]
        profile = _read(path, key) if path is not None else None
        if profile is None:
            on_miss()
            from advisor.simulate.profile import quiet_transformers, trace_profile  # a hit never loads the tracer

            with quiet_transformers():
                profile = trace_profile(copy.deepcopy(cfg), key, layer_saved=layer_saved.get(dtypes), built=built)
            if path is not None:
                write_entry(path, profile.model_dump(mode="json"), kind="profile")
        layer_saved.setdefault(dtypes, profile.layer_saved_per_sample)
        out[key] = profile
    return tuple(out[key] for key in keys)

"""Traced activation profiles, cached as JSON per (config, recipe dtypes, shape).

``traced_profiles(cfg, keys, cache_dir=)`` returns one ``BlockProfile`` per key, reading each from
``cache_dir`` when an earlier plan traced it and tracing (``advisor.simulate.profile``) otherwise.
The file name is a hash of the config (less the name fields) and the key, and the file records both,
with the torch and transformers versions that traced it (a different version traces again: the
modeling code decides what is saved). ``default_cache_dir`` is the one place that reads the
environment (``$XDG_CACHE_HOME/dp-advisor``, else ``~/.cache/dp-advisor``): the CLI calls it and
passes the path in; the library never looks it up itself. ``cache_dir=None``: no caching.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from advisor.model.block_profile import BlockProfile, ProfileKey

_IGNORED = ("_name_or_path", "transformers_version", "architectures_note")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/dp-advisor``, else ``~/.cache/dp-advisor`` (the XDG base directory spec)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dp-advisor"


def _versions() -> dict:
    """Installed versions, read without importing the packages (a cached plan stays fast)."""
    from importlib.metadata import version

    return {"torch": version("torch"), "transformers": version("transformers")}


def cache_path(cache_dir: Path, cfg: dict, key: ProfileKey, versions: dict) -> Path:
    content = {k: v for k, v in sorted(cfg.items()) if k not in _IGNORED and not k.startswith("_advisor")}
    text = json.dumps({"config": content, "key": key.model_dump(), "versions": versions}, sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    return cache_dir / "profiles" / f"{cfg.get('model_type', 'model')}-{digest}.json"


def _read(path: Path, key: ProfileKey) -> BlockProfile | None:
    try:
        profile = BlockProfile.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None  # absent, or written by another version: trace again
    return profile if profile.key == key else None


def traced_profiles(cfg: dict, keys: list[ProfileKey], *, cache_dir: Path | None) -> tuple[BlockProfile, ...]:
    """One profile per key, from the cache or traced now (and then cached)."""
    from advisor.simulate.profile import trace_profile

    versions = _versions()
    out = []
    for key in keys:
        path = cache_path(cache_dir, cfg, key, versions) if cache_dir is not None else None
        profile = _read(path, key) if path is not None else None
        if profile is None:
            profile = trace_profile(cfg, key)
            if path is not None:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(profile.model_dump_json(indent=1))
                except OSError:
                    pass  # a read-only cache costs only speed
        out.append(profile)
    return tuple(out)

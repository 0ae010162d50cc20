"""Counts of a model built on the meta device, cached as JSON per config (and library versions).

A family with no counting formula is counted on the meta device (``advisor.model.meta``), which
imports torch and transformers: seconds per plan. The counts depend only on the config and the
transformers version, so a plan keeps them in the user's cache directory (the CLI passes
``advisor.simulate.profile_cache.default_cache_dir()``), and the next plan of the same config
reads them without importing either library. Entries are read and written by
``advisor.model.cache_entry`` (regular files only, atomic writes, a checksum): a damaged or edited
entry is counted again, never trusted. ``config_digest`` is the one hash of a config that
the spec and profile caches share (the name fields are left out: a renamed copy hits the cache).
"""

from __future__ import annotations

import functools
import hashlib
import json
from importlib.metadata import distribution
from pathlib import Path
from typing import Callable

from advisor.model.cache_entry import read_entry, write_entry
from advisor.model.spec import ModelSpec

_IGNORED = ("_name_or_path", "transformers_version")
# How the meta-device count is made beyond the library versions: an entry counted before a change here is counted
# again (stored-head: a config's untied head kept apart where its config class ties anyway, meta.untie_stored_head).
COUNT_REVISION = "stored-head"


@functools.cache
def library_versions() -> dict:
    """Installed torch and transformers versions, read without importing them (once per process)."""
    return {"torch": installed_version("torch"), "transformers": installed_version("transformers")}


def installed_version(name: str) -> str:
    """``importlib.metadata.version(name)``, reading only the metadata's header lines.

    ``version()`` parses the whole METADATA file with the email parser (transformers' embeds its
    README: about 5 ms each on a 2-core box); the core metadata spec puts ``Version`` among the
    headers, which end at the first blank line (packaging.python.org, core metadata specifications)."""
    dist = distribution(name)  # PackageNotFoundError when absent, as version() raises
    for line in (dist.read_text("METADATA") or dist.read_text("PKG-INFO") or "").splitlines():
        if not line:  # a blank line ends the headers (a folded one holds spaces)
            break
        if line.startswith("Version:"):
            return line.partition(":")[2].strip()
    return dist.version


def config_digest(cfg: dict, **extra: object) -> str:
    content = {k: v for k, v in sorted(cfg.items()) if k not in _IGNORED and not k.startswith("_advisor")}
    text = json.dumps({"config": content, **extra}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cached_spec(cfg: dict, *, name: str, cache_dir: Path | None, count: Callable[[], ModelSpec]) -> ModelSpec:
    """``count()``'s spec for ``cfg``, from ``cache_dir`` when an earlier plan counted it."""
    if cache_dir is None:
        return count()
    path = cache_dir / "specs" / f"{cache_file_stem(cfg)}-{config_digest(cfg, versions=library_versions(), count=COUNT_REVISION)}.json"
    entry = read_entry(path, kind="spec")  # advisor.model.cache_entry: regular files only, checksummed
    if entry is not None:
        try:
            return ModelSpec.model_validate({**entry, "name": name})
        except ValueError:
            pass  # another schema: count again
    spec = count()
    write_entry(path, spec.model_dump(mode="json"), kind="spec")
    return spec


def cache_file_stem(cfg: dict) -> str:
    """The config's ``model_type`` when it is a plain name, for a readable file name; else ``model``."""
    model_type = cfg.get("model_type")
    return model_type if isinstance(model_type, str) and model_type.replace("_", "").replace("-", "").isalnum() \
        and len(model_type) <= 64 else "model"

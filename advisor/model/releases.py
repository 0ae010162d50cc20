"""Library releases that change what is allocated (``profiles/library_releases.json``).

What belongs here: the table of such behaviours, the pure choice of those in force for a set of
installed versions, and the one edge that reads the installed versions (package metadata headers,
no import). The estimators never read versions: the resolver puts the behaviours a model needs into
its facts (a Llava's ``ClipTowerFacts``), and the plan's assumptions name the release.
"""

from __future__ import annotations

import functools
import json
import re

from pydantic import BaseModel, ConfigDict, Field

from profiles import PROFILES_DIR


class ReleaseBehaviour(BaseModel):
    """One behaviour a release brought, with the first release that has it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="What the estimators read, e.g. llava_output_keeps_vision_tower.")
    library: str = Field(description="The distribution name: transformers, torch, peft, bitsandbytes.")
    since: str = Field(description="The first release with the behaviour (releases before it behave the old way).")
    what: str = Field(description="What it changes in memory.")
    source: str = Field(description="The source lines (and the test measuring it) that show it.")


@functools.cache
def load_release_behaviours() -> tuple[ReleaseBehaviour, ...]:
    raw = json.loads((PROFILES_DIR / "library_releases.json").read_text())["behaviours"]
    return tuple(ReleaseBehaviour(**row) for row in raw)


#: A release as a user or a package's metadata writes one: at least major.minor, then PEP 440's pre-, post- and
#: dev-release and local parts in any of their spellings ('2.7.1', '0.26', '5.25.0.dev0', '2.5.0rc1', '1.0.0-rc1',
#: '1.0.0.dev', '2.13.0+cpu', '2.5.1+cu124-abc'); '0', '1..2' and 'latest' are not releases.
RELEASE_PATTERN = re.compile(
    r"\d+(\.\d+)+"
    r"([-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?\d*)?"
    r"(-\d+|[-_.]?(post|rev|r)[-_.]?\d*)?"
    r"([-_.]?dev[-_.]?\d*)?"
    r"(\+[0-9a-z]+([-_.][0-9a-z]+)*)?", re.IGNORECASE)


def is_release(version: str) -> bool:
    return RELEASE_PATTERN.fullmatch(version) is not None


def release_tuple(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: '5.24.0' -> (5, 24, 0), '2.13.0+cpu' -> (2, 13, 0),
    '5.25.0.dev0' -> (5, 25, 0) (a pre-release of a version counts as that version)."""
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.end() < len(piece):
            break
    return tuple(parts)


def behaviour_in(name: str, release: str | None) -> bool:
    """Whether the library ``release`` of behaviour ``name`` has it; None: the newest release, which does."""
    row = next(b for b in load_release_behaviours() if b.name == name)
    return release is None or release_tuple(release) >= release_tuple(row.since)


def behaviours_in_force(versions: dict[str, str]) -> dict[str, str]:
    """{behaviour name: 'library version'} of the behaviours the given installed versions have."""
    return {b.name: f"{b.library} {versions[b.library]}" for b in load_release_behaviours()
            if b.library in versions and release_tuple(versions[b.library]) >= release_tuple(b.since)}


@functools.cache
def installed_behaviours() -> dict[str, str]:
    """``behaviours_in_force`` of the installed libraries (the edge: reads package metadata headers)."""
    from importlib.metadata import PackageNotFoundError

    from advisor.model.spec_cache import installed_version

    versions = {}
    for library in {b.library for b in load_release_behaviours()}:
        try:
            versions[library] = installed_version(library)
        except PackageNotFoundError:
            continue
    return behaviours_in_force(versions)


def installed_release(library: str) -> str | None:
    """The installed release of ``library`` (package metadata headers, no import), or None when it is not
    installed (the edge: the planner passes it on, e.g. ``TrainingConfig.bitsandbytes``)."""
    from importlib.metadata import PackageNotFoundError

    from advisor.model.spec_cache import installed_version

    try:
        return installed_version(library)
    except PackageNotFoundError:
        return None

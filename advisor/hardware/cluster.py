"""The ``--gpus`` grammar and the validated ``Hardware`` it produces.

Grammar (case-insensitive, surrounding spaces ignored)::

    [NODES x] [COUNT x] NAME        2xA100, 8xH100, 2x8xH100, A100, 4xRTX4090, 2xA100-40GB

``COUNT`` is GPUs per node; with ``--nodes N`` the count is per node as well (like torchrun's
``--nproc-per-node``). ``NAME`` matches a GPU profile by its canonical name, an alias or a shorter
form; a short form shared by several profiles (``a100``) resolves through the documented defaults in
``profiles/gpus.json`` and the resolution is recorded as an assumption. Anything else is a
``ValueError`` with one line naming the closest known GPUs.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, model_validator

from advisor.frozen import validated_copy
from advisor.hardware.catalog import Catalog, GpuProfile, Interconnect, load_catalog

MAX_GPUS_PER_NODE = 64
MAX_NODES = 16384
_COUNT = r"(\d+)\s*[x*×]\s*"  # any length: a count too large is refused by its size, not read as a name
_GRAMMAR = re.compile(rf"^(?:{_COUNT})?(?:{_COUNT})?([a-z0-9][a-z0-9 ._-]{{0,40}})$")
# Words people put around a GPU name that carry no information for matching.
_NOISE = ("nvidia", "amd", "geforce", "tesla", "instinct", "radeon", "hbm2", "hbm2e", "hbm3", "hbm3e", "hgx", "dgx")
_FORM_FACTORS = {"sxm2": "sxm", "sxm4": "sxm", "sxm5": "sxm", "pcie4": "pcie", "pcie5": "pcie", "pci": "pcie"}


class Hardware(BaseModel):
    """A cluster of identical GPUs: ``nodes`` x ``gpus_per_node``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: GpuProfile = Field(description="The GPU profile.")
    gpus_per_node: int = Field(ge=1, le=MAX_GPUS_PER_NODE, description="GPUs in each node.")
    nodes: int = Field(ge=1, le=MAX_NODES, description="Number of nodes.")
    intra_node_link: Interconnect = Field(description="GPU-to-GPU link inside a node.")
    inter_node_link: Interconnect | None = Field(description="Link between nodes (None: one node).")
    assumptions: tuple[str, ...] = Field(default=(), description="Defaults chosen for the user.")

    @model_validator(mode="after")
    def _check_links(self) -> "Hardware":
        if self.nodes > 1 and self.inter_node_link is None:
            raise ValueError("several nodes need an inter-node link")
        return self

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def gpu_memory_bytes(self) -> int:
        return self.gpu.memory_bytes

    @property
    def label(self) -> str:
        prefix = f"{self.nodes}x" if self.nodes > 1 else ""
        return f"{prefix}{self.gpus_per_node}x{self.gpu.name}"

    def summary(self) -> dict:
        """The flat JSON form plans have always printed (GPU and links by name)."""
        inter = self.inter_node_link.name if self.inter_node_link else None
        return {"gpu": self.gpu.name, "gpu_memory_bytes": self.gpu_memory_bytes, "gpus_per_node": self.gpus_per_node,
                "nodes": self.nodes, "world_size": self.world_size,
                "interconnect": self.intra_node_link.name + (f" + {inter}" if inter else ""),
                "intra_node_link": self.intra_node_link.name, "inter_node_link": inter}


def resize(hardware: Hardware, *, nodes: int | None = None, gpus_per_node: int | None = None,
           catalog: Catalog | None = None) -> Hardware:
    """The same GPUs and links on a different number of nodes / GPUs per node (no string re-parsing).

    One node drops the inter-node link; several nodes keep it, or take the catalog's default for
    the GPU when the original was one node."""
    nodes = hardware.nodes if nodes is None else nodes
    per = hardware.gpus_per_node if gpus_per_node is None else gpus_per_node
    inter = None
    if nodes > 1:
        inter = hardware.inter_node_link
        if inter is None:
            catalog = catalog or load_catalog()
            link = catalog.defaults.inter_node_link.get(hardware.gpu.name, catalog.defaults.fallback_inter_node_link)
            inter = catalog.interconnect(link)
    return validated_copy(hardware, {"nodes": nodes, "gpus_per_node": per, "inter_node_link": inter})


def _normalise(name: str) -> tuple[str, ...]:
    """Split a GPU name into comparable tokens: model, memory (``80g``), form factor."""
    text = re.sub(r"[\s_.]+", "-", name.lower())
    tokens = [t for t in text.split("-") if t and t not in _NOISE]
    out: list[str] = []
    for tok in tokens:
        if out and out[-1].isalpha() and tok[0].isdigit() and not re.fullmatch(r"\d+gb?", tok):
            out[-1] += tok  # "rtx 4090" -> "rtx4090"
        elif re.fullmatch(r"\d+gb?", tok):
            out.append(tok.rstrip("b").rstrip("g") + "g")  # "80gb", "80g" -> "80g"
        else:
            out.append(_FORM_FACTORS.get(tok, tok))
    return tuple(out)


def _keys_for(gpu: GpuProfile) -> set[tuple[str, ...]]:
    """Every token combination that names ``gpu``: full name, name without memory or form factor."""
    keys = {_normalise(gpu.name)} | {_normalise(a) for a in gpu.aliases}
    full = _normalise(gpu.name)
    model, rest = full[0], full[1:]
    for i in range(len(rest) + 1):
        for j in range(i, len(rest) + 1):
            keys.add((model, *rest[:i], *rest[j:]))
    keys.add((model,))
    return {frozenset_key(k) for k in keys}


def frozenset_key(tokens: tuple[str, ...]) -> tuple[str, ...]:
    """Order-insensitive key (``h100-sxm-80gb`` == ``h100-80gb-sxm``), model token first."""
    return (tokens[0], *sorted(tokens[1:])) if tokens else ()


def _index(catalog: Catalog) -> dict[tuple[str, ...], list[str]]:
    index: dict[tuple[str, ...], list[str]] = {}
    for gpu in catalog.gpus:
        for key in _keys_for(gpu):
            index.setdefault(key, []).append(gpu.name)
    return index


def _short(text: str, limit: int = 40) -> str:
    """User input quoted in a one-line message: whitespace collapsed, length capped."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def resolve_gpu_name(name: str, *, catalog: Catalog) -> tuple[GpuProfile, str | None]:
    """The profile ``name`` refers to, and the assumption made when it was ambiguous."""
    key = frozenset_key(_normalise(name))
    matches = _index(catalog).get(key, [])
    if len(matches) == 1:
        return catalog.gpu(matches[0]), None
    default = catalog.defaults.ambiguous.get("-".join(key))
    if default is not None:
        others = ", ".join(m for m in matches if m != default)
        return catalog.gpu(default), f"'{name}' read as {default} (also: {others}); name it to choose"
    if matches:
        raise ValueError(f"GPU '{_short(name)}' is ambiguous: {', '.join(sorted(matches))}")
    import difflib  # here, not at the top: only an unknown name needs it

    names = [g.name for g in catalog.gpus]
    close = difflib.get_close_matches(name.upper(), names, n=3, cutoff=0.3)
    if not close:  # the first profiles would be named as if they were close
        raise ValueError(f"unknown GPU '{_short(name)}': no known GPU is close to it (see `advisor gpus`)")
    raise ValueError(f"unknown GPU '{_short(name)}'; closest known: {', '.join(close)} (see `advisor gpus`)")


def has_count(text: str) -> bool:
    """Whether ``--gpus`` text gives a count (``8xH100``, ``8XH100``, ``8*A100``, ``2x8xH100``) rather than a name
    alone, read by the grammar ``parse_gpus`` reads (a name such as ``4090`` is no count)."""
    match = _GRAMMAR.match((text or "").strip().lower())
    return match is not None and match.group(1) is not None


def parse_gpus(
    text: str, *, nodes: int | None = None, interconnect: str | None = None, catalog: Catalog | None = None
) -> Hardware:
    """Parse ``--gpus`` (plus ``--nodes`` and ``--interconnect``) into a validated ``Hardware``."""
    catalog = catalog or load_catalog()
    if text is not None and not isinstance(text, str):
        raise ValueError(f"--gpus: expected text such as 2xA100, got {type(text).__name__}")
    if nodes is not None and (isinstance(nodes, bool) or not isinstance(nodes, int)):
        raise ValueError(f"--nodes: expected a whole number, got {nodes!r}"[:120])
    if interconnect is not None and not isinstance(interconnect, str):
        raise ValueError(f"--interconnect: expected a link name, got {type(interconnect).__name__}")
    cleaned = (text or "").strip().lower()
    match = _GRAMMAR.match(cleaned)
    if not cleaned or match is None:
        raise ValueError(
            f"cannot read --gpus '{_short(text or '')}': expected COUNTxNAME such as 2xA100, "
            "8xH100 or 2x8xH100 (nodes x GPUs per node)"
        )
    first, second, name = match.groups()
    if any(c is not None and len(c.lstrip("0")) > 9 for c in (first, second)):
        raise ValueError(f"--gpus '{_short(text)}': at most {MAX_GPUS_PER_NODE} GPUs per node and {MAX_NODES} nodes "
                         "(write several nodes as NODESxGPUSxNAME)")
    counts = [int(c) for c in (first, second) if c is not None]
    if any(c < 1 for c in counts):
        raise ValueError(f"--gpus '{_short(text)}': GPU and node counts must be at least 1")
    if nodes is not None and nodes < 1:
        raise ValueError("--nodes must be at least 1")
    if len(counts) == 2:
        if nodes is not None and nodes != counts[0]:
            raise ValueError(f"--gpus '{_short(text)}' says {counts[0]} nodes but --nodes says {nodes}")
        nodes, per_node = counts
    else:
        per_node = counts[0] if counts else 1
    return build_hardware(name.strip(), gpus_per_node=per_node, nodes=nodes, interconnect=interconnect,
                          catalog=catalog, text=text)


def build_hardware(gpu_name: str, *, gpus_per_node: int, nodes: int | None = None, interconnect: str | None = None,
                   catalog: Catalog | None = None, text: str | None = None) -> Hardware:
    """``Hardware`` from a GPU name and counts already known (a launch's environment, ``parse_gpus``):
    no ``--gpus`` string is formatted and parsed again. ``nodes=None`` lets a large count split into
    servers of the GPU's usual size; ``text`` is what the user wrote, for messages."""
    catalog = catalog or load_catalog()
    text = text if text is not None else f"{gpus_per_node}x{gpu_name}"
    per_node = gpus_per_node
    gpu, assumption = resolve_gpu_name(gpu_name, catalog=catalog)
    assumptions = [assumption] if assumption else []
    server = gpu.default_gpus_per_node
    if nodes is None and per_node > server and per_node % server == 0:
        # "64xH100" is a cluster, not one machine: split it into servers of the usual size.
        nodes, per_node = per_node // server, server
        assumptions.append(f"{nodes * per_node} GPUs read as {nodes} nodes x {per_node} "
                           "(write NODESxGPUSxNAME to change)")
    elif nodes is None and per_node > server:
        # "20xH100" is neither one usual server nor a whole number of them: planning it as one machine would time
        # every collective on a single NVLink domain no such server has
        fewer, more = per_node // server, -(-per_node // server)
        raise ValueError(f"--gpus '{_short(text)}': {per_node} GPUs are more than one {server}-GPU {gpu.name} "
                         f"server and not a whole number of them: write NODESxGPUSxNAME ({fewer}x{server}x{gpu.name} "
                         f"or {more}x{server}x{gpu.name}), or 1x{per_node}x{gpu.name} for one machine holding them all")
    nodes = nodes or 1
    if per_node < 1 or per_node > MAX_GPUS_PER_NODE or nodes > MAX_NODES:
        raise ValueError(
            f"--gpus '{_short(text)}': at most {MAX_GPUS_PER_NODE} GPUs per node and {MAX_NODES} nodes "
            "(write several nodes as NODESxGPUSxNAME)"
        )
    inter = None
    if interconnect is not None:
        inter = catalog.interconnect(interconnect.strip().lower())
        if inter.kind != "inter_node":  # a GPU-to-GPU link inside a server, not a NIC between them
            nics = ", ".join(link.name for link in catalog.interconnects if link.kind == "inter_node")
            raise ValueError(f"--interconnect {inter.name} links GPUs inside a server (the GPU's own link, "
                             f"{gpu.intra_node_link} here, is taken from the GPU); between nodes give one of: {nics}")
        if nodes == 1:
            assumptions.append(f"--interconnect {inter.name} is not used: one node, no link between nodes")
    elif nodes > 1:
        link = catalog.defaults.inter_node_link.get(gpu.name, catalog.defaults.fallback_inter_node_link)
        inter = catalog.interconnect(link)
        assumptions.append(f"nodes linked by {inter.description} (pass --interconnect to change)")
    return Hardware(
        gpu=gpu,
        gpus_per_node=per_node,
        nodes=nodes,
        intra_node_link=catalog.interconnect(gpu.intra_node_link),
        inter_node_link=inter,
        assumptions=tuple(assumptions),
    )

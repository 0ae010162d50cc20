"""The user's own training config read into plan settings (``advisor plan --from FILE``): the shared part.

``read_config_file(path)`` reads an accelerate YAML, a DeepSpeed JSON, a torchtitan TOML, a torchtune YAML or a
Hugging Face ``TrainingArguments`` JSON and returns a ``ConfigFile``: each value it took (the file's key, what it says,
the plan option it sets), the keys it did not read, and notes where the file says something the plan
models only approximately. The per-format readers live in ``advisor.planning.config_<format>``
(``config_formats`` picks one); this module holds the result type, the typed key reader every format uses,
the helpers several formats share, and the two reverse look-ups (precision and strategy) derived from the
tables that define them (``advisor.precision.PRECISIONS``, ``advisor.strategies.STRATEGIES``), so a file is
read with the same facts an export is written with.

Settings are keyed by the ``advisor plan`` option they stand for (``strategy``, ``micro_batch``, ...); the
CLI merges them under the options the user typed (``advisor.cli.from_file``). Bad input (no such file, a
file of no known format, a value of the wrong type) is a one-line ``ValueError``. No torch; PyYAML is
imported only for a YAML file; ``tomllib`` is the standard library's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from advisor.precision import PRECISIONS
from advisor.strategies import STRATEGIES
from advisor.training import MAX_GLOBAL_BATCH, MAX_MICRO_BATCH

FileFormat = Literal["accelerate", "axolotl", "deepspeed", "torchtitan", "torchtune", "trainer"]
FORMAT_TITLES: dict[str, str] = {"accelerate": "accelerate config (YAML)", "axolotl": "axolotl config (YAML)",
                                 "deepspeed": "DeepSpeed config (JSON)",
                                 "torchtitan": "torchtitan job config (TOML)", "torchtune": "torchtune config (YAML)",
                                 "trainer": "Hugging Face TrainingArguments (JSON)"}
# The key a setting is credited to when the file's format, not one of its keys, implies it (a torchtitan file
# runs the torchtitan recipe).
FILE_FORMAT = "(file format)"
# FSDP1's sharding names (torch ShardingStrategy) and accelerate's numbers for them -> (reshard_after_forward,
# hybrid); None: NO_SHARD. Read by the accelerate and TrainingArguments readers.
SHARDING: dict[str, tuple[bool, bool] | None] = {
    "FULL_SHARD": (True, False), "SHARD_GRAD_OP": (False, False), "NO_SHARD": None, "HYBRID_SHARD": (True, True),
    "HYBRID_SHARD_ZERO2": (False, True), "_HYBRID_SHARD_ZERO2": (False, True),
    "1": (True, False), "2": (False, False), "3": None, "4": (True, True), "5": (False, True)}


class FileValue(BaseModel):
    """One value taken from the file: where it was, what it said, and the plan option it sets."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(description="Dotted path of the key in the file (several joined by ' + ').")
    value: str = Field(description="What the file says, as written.")
    option: str = Field(description="The advisor plan option it sets (without --), e.g. strategy, micro_batch.")
    setting: int | str = Field(description="The value it sets that option to.")


class ConfigFile(BaseModel):
    """What ``--from FILE`` read: the values taken, the keys left unread, and caveats."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    format: FileFormat
    values: tuple[FileValue, ...]
    not_read: tuple[str, ...] = Field(description="Keys the plan does not use (no effect on memory or time, or "
                                      "not modelled), and 'auto' values left to the plan.")
    notes: tuple[str, ...] = Field(default=(), description="Where the file is read approximately, one line each.")

    @property
    def settings(self) -> dict[str, int | str]:
        """Plan option -> value, in the order read."""
        return {v.option: v.setting for v in self.values}

    @property
    def title(self) -> str:
        if self.format == "trainer" and self.path.lower().endswith((".yaml", ".yml")):
            return "Hugging Face TrainingArguments / TRL config (YAML)"
        return FORMAT_TITLES[self.format]


class Reader:
    """Typed access to a parsed document: each key read is remembered, so the keys left unread can be
    listed; a value of the wrong type is a one-line ValueError naming the file and the key."""

    def __init__(self, doc: dict[str, Any], *, where: str, prefix: str = "") -> None:
        self.doc, self.where, self.prefix = doc, where, prefix
        self.read: set[str] = set()
        self.values: list[FileValue] = []
        self.notes: list[str] = []
        self.auto: list[str] = []
        self.nested: list[str] = []  # unread keys of a config read inside this one (a DeepSpeed JSON it names)

    def fail(self, key: str, message: str) -> ValueError:
        return ValueError(f"--from {self.where}: {self.prefix}{key} {message}")

    def raw(self, key: str) -> Any:
        """The value at dotted ``key`` (None when absent), marked as read."""
        node: Any = self.doc
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        self.read.add(key)
        if isinstance(node, str) and node.strip().lower() == "auto":
            self.auto.append(f"{self.prefix}{key}")
            return None
        return node

    def section(self, key: str) -> dict[str, Any] | None:
        value = self.raw(key)
        if value is None or value == {}:
            return None
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a mapping of keys, got {_shown(value)}")
        self.read.discard(key)  # its keys are read one by one (unread ones are listed)
        return value

    def integer(self, key: str, *, low: int | None = 0, high: int | None = None) -> int | None:
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():  # JSON's 1e9
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, got {value!r}"[:160] if isinstance(value, str) else
                            f"must be an integer, got {_shown(value)}")
        if low is not None and value < low:
            raise self.fail(key, f"must be at least {low}, got {value}")
        if high is not None and value > high:
            raise self.fail(key, f"must be at most {high:,}, got {_shown(value)}")
        return value

    def fraction(self, key: str) -> float | None:
        """A number from 0 to below 1 (a dropout probability)."""
        value = self.raw(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 <= value < 1):
            raise self.fail(key, f"must be a number from 0 to below 1, got {value!r}"[:160])
        return value

    def flag(self, key: str) -> bool | None:
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):  # YAML written as 'true'
            return value.strip().lower() == "true"
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {_shown(value)}")
        return value

    def text(self, key: str) -> str | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, got {_shown(value)}")
        return value.strip()

    def choice(self, key: str, choices: dict[str, Any]) -> Any:
        """The mapped value of a string key (case-insensitive); a value outside ``choices`` is refused."""
        value = self.raw(key)
        if value is None:
            return None
        lookup = {str(k).lower(): v for k, v in choices.items()}
        found = lookup.get(str(value).strip().lower(), KeyError) if isinstance(value, (str, int)) else KeyError
        if found is KeyError or isinstance(value, bool):
            raise self.fail(key, f"must be one of {', '.join(map(str, choices))}, got {_shown(value)}")
        return found

    def take(self, key: str, value: Any, option: str, setting: int | str) -> None:
        """Record that ``key`` (saying ``value``) sets ``option``; a second key that sets the same option
        to another value is a conflict in the file."""
        for earlier in self.values:
            if earlier.option == option:
                if earlier.setting != setting:
                    raise ValueError(f"--from {self.where}: {earlier.key} ({earlier.value}) and {self.prefix}{key} "
                                     f"({_shown(value)}) disagree on {option.replace('_', '-')}")
                return
        self.values.append(FileValue(key=f"{self.prefix}{key}", value=_shown(value), option=option, setting=setting))

    def unread(self) -> list[str]:
        """Keys present but not read (a whole unread section as ``name.*``), then the 'auto' values."""
        out: list[str] = []

        def walk(node: dict[str, Any], path: str) -> None:
            for name, value in node.items():
                key = f"{path}{name}"
                if key in self.read:
                    continue
                if isinstance(value, dict) and value and any(r.startswith(key + ".") for r in self.read):
                    walk(value, key + ".")
                else:
                    out.append(f"{self.prefix}{key}{'.*' if isinstance(value, dict) and value else ''}")

        walk(self.doc, "")
        return out + [f"{key} (auto: left to the plan)" for key in self.auto] + self.nested


def _shown(value: Any, limit: int = 60) -> str:
    """``value`` for a one-line message, at most ``limit`` characters; a nested value is shown a few levels and items
    deep (reprlib), so a YAML alias bomb's billion-item expansion is never written out whole first."""
    import reprlib

    bounded = reprlib.Repr()  # keyword arguments from Python 3.12 only
    bounded.maxlevel, bounded.maxlist, bounded.maxtuple, bounded.maxdict, bounded.maxset = 3, 4, 4, 4, 4
    bounded.maxstring = bounded.maxlong = bounded.maxother = limit
    text = value if isinstance(value, str) else bounded.repr(value) if not isinstance(value, bool) else str(value).lower()
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def precision_for(framework: str, spelling: str) -> str:
    """The ``--precision`` a framework's spelling stands for: the first row of the precision table that
    framework spells this way (so bf16 reads as bf16-mixed, the row listed before pure bf16)."""
    for name, info in PRECISIONS.items():
        if getattr(info, framework) == spelling:
            return name
    raise AssertionError(f"no precision spelled {spelling!r} by {framework}")


def strategy_for(engine: str, *, shard_optimizer: bool, shard_grads: bool, shard_params: bool,
                 reshard_after_forward: bool, offload_optimizer: bool, offload_params: bool) -> str | None:
    """The strategy whose implementation on ``engine`` shards and offloads exactly this (the strategy
    table's ``Implementation`` fields); None when no row does."""
    wanted = dict(shard_optimizer=shard_optimizer, shard_grads=shard_grads, shard_params=shard_params,
                  reshard_after_forward=reshard_after_forward, offload_optimizer=offload_optimizer,
                  offload_params=offload_params)
    for name, strategy in STRATEGIES.items():
        impl = strategy.on(engine)  # type: ignore[arg-type]
        if impl.available and not impl.single_process and all(getattr(impl, k) == v for k, v in wanted.items()):
            return name
    return None


def ddp_strategy(r: Reader, key: str, value: Any) -> None:
    """DDP on the torch engine, with ``key`` (saying ``value``) as its source."""
    r.take(key, value, "engine", "torch")
    r.take(key, value, "strategy", "ddp")


def fsdp_sub_reader(r: Reader, config: dict[str, Any] | None) -> Reader:
    """A reader of an ``fsdp_config`` mapping with its keys' ``fsdp_`` prefixes dropped, as TrainingArguments reads it
    (transformers training_args.py ``_process_fsdp_args``; axolotl's schema takes both spellings)."""
    return Reader({k.removeprefix("fsdp_"): v for k, v in (config or {}).items()}, where=r.where, prefix="fsdp_config.")


def fsdp_strategy(r: Reader, key: str, *, reshard: bool, offload: bool, value: str,
                  offload_key: str | None = None) -> None:
    """FSDP2 on the torch engine: the strategy of this resharding and offload, with ``key`` as its source (and
    ``offload_key``, where a key of its own turns the offload on, as the offload's)."""
    r.take(key, value, "engine", "torch")
    name = strategy_for("torch", shard_optimizer=True, shard_grads=True, shard_params=True,
                        reshard_after_forward=reshard, offload_optimizer=offload, offload_params=offload)
    assert name is not None, (reshard, offload)  # FSDP2 runs all four (advisor/strategies.py)
    if offload and offload_key is not None:
        r.take(offload_key, True, "strategy", name)
    r.take(key, value, "strategy", name)


def take_batch(r: Reader, *, micro: str | None = None, accumulation: str | None = None, total: str | None = None) -> None:
    """The micro-batch, accumulation steps and global batch at these keys, each a positive integer within the bounds
    the options take (accumulation steps within the global batch's)."""
    for key, option, high in ((micro, "micro_batch", MAX_MICRO_BATCH), (accumulation, "gradient_accumulation",
                                                                         MAX_GLOBAL_BATCH),
                              (total, "global_batch", MAX_GLOBAL_BATCH)):
        if key is not None:
            number = r.integer(key, low=1, high=high)
            if number is not None:
                r.take(key, number, option, number)


def take_precision(r: Reader, framework: str, bf16_key: str, fp16_key: str) -> None:
    """bf16 / fp16 switches: one true sets that mixed precision; only falses given set fp32."""
    bf16, fp16 = r.flag(bf16_key), r.flag(fp16_key)
    if bf16 and fp16:
        raise r.fail(bf16_key, f"and {fp16_key} are both true")
    if bf16 or fp16:
        key = bf16_key if bf16 else fp16_key
        r.take(key, True, "precision", precision_for(framework, "bf16" if bf16 else "fp16"))
    elif bf16 is False or fp16 is False:
        r.take(bf16_key if bf16 is False else fp16_key, False, "precision", precision_for(framework, None))  # type: ignore[arg-type]


def beside(path: str, base: Path, r: Reader) -> Path:
    """A config file named inside another: relative to that file's folder, then to the working directory."""
    for candidate in (base / path, Path(path)):
        if candidate.is_file():
            return candidate
    raise ValueError(f"--from {r.where}: the DeepSpeed config it names, {path[:80]}, is not a file (looked beside "
                     "it and in the working directory)")


def named_deepspeed(r: Reader, key: str, path: str, base: Path) -> dict[str, Any]:
    """The DeepSpeed config that ``key`` of the file being read names (``path``, found as ``beside`` finds it): the file
    itself, or a JSON that holds none of DeepSpeed's keys (a TrainingArguments file, say), is refused in one line;
    read as a DeepSpeed config it would plan DeepSpeed's defaults (stage 0) from keys DeepSpeed never reads."""
    found = beside(path, base, r)
    if found.resolve() == Path(r.where).resolve():
        raise r.fail(key, f"names {path[:80]}, this file itself, not a DeepSpeed config: name the DeepSpeed JSON")
    doc = load_json(found, deepspeed=True)
    if not is_deepspeed_json(doc):
        raise r.fail(key, f"names {path[:80]}, which is not a DeepSpeed config (no zero_optimization, "
                          "train_micro_batch_size_per_gpu, train_batch_size or bf16/fp16 block)")
    return doc


def load_json(path: Path, *, deepspeed: bool = False) -> dict[str, Any]:
    """A JSON file that holds a mapping; anything else is a one-line ValueError. ``deepspeed``: a key given twice in
    one object is refused too, as DeepSpeed's own loader refuses it (deepspeed/runtime/config.py reads the file with
    config_utils.dict_raise_error_on_duplicate_keys); elsewhere the last one wins, as json.load gives it."""
    try:
        doc = json.loads(path.read_text(), object_pairs_hook=_refusing_duplicates if deepspeed else None)
    except _Duplicate as err:
        raise ValueError(f"--from {path}: {err}") from None
    except RecursionError:  # the json decoder recurses once a level, up to the interpreter's limit
        raise ValueError(too_deep(path)) from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"--from {path}: not a readable JSON file ({brief(str(err))})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"--from {path}: the JSON holds a {type(doc).__name__}, not a mapping of keys")
    return doc


def brief(text: str, limit: int = 120) -> str:
    """``text`` on one line, at most ``limit`` characters, cut at a word (a parser's message can be long)."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    cut = text[:limit - 3]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut).rstrip(",;:") + "..."


def too_deep(path: Path) -> str:
    """The one-line refusal of a file nested deeper than its parser recurses (the interpreter's recursion limit)."""
    return f"--from {path}: the file nests too deeply (lists or mappings hundreds of levels deep; no config does)"


def is_deepspeed_json(doc: dict[str, Any]) -> bool:
    """A JSON config DeepSpeed reads: one of its top-level keys, or a bf16/fp16 block."""
    return any(key in doc for key in ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size")) \
        or isinstance(doc.get("bf16"), dict) or isinstance(doc.get("fp16"), dict)


class _Duplicate(ValueError):
    """A key given twice in one JSON object of a DeepSpeed config."""


def _refusing_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise _Duplicate(f"'{_shown(twice)}' is given twice in one object, and DeepSpeed refuses a duplicate key: "
                         "keep one")
    return doc


def take_degrees(r: Reader, prefix: str, options: dict[str, str], *, implied: str) -> None:
    """Mesh degrees above 1 pin --hybrid (replicas), --tp, --cp; 1 is data parallelism alone, the default.
    ``implied`` (the shard degree) follows from the GPU count and the others."""
    product = 1
    for field, option in options.items():
        number = r.integer(prefix + field, low=1)
        product *= number or 1
        if number is not None and number > 1:
            r.take(prefix + field, number, option, number)
    shard = r.integer(prefix + implied, low=1)
    world = next((value.setting for value in r.values if value.option == "num_gpus"), None)
    # accelerate's ParallelismConfig refuses this too: its total must be the world size, the shard size defaulting to
    # 1 (PARALLELISM_CONFIG_DP_SHARD_SIZE), except where every size is 1 (then the processes replicate: DDP)
    total = (shard or 1) * product
    if world is not None and total != int(world) and total > 1:
        said = f"{shard}" if shard is not None else "not set (accelerate's default 1), so 1"
        raise r.fail(prefix + implied, f"{said} times the other degrees ({product}) is {total} processes, "
                     f"not the file's num_processes {world}")

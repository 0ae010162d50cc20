"""Turn what the user names (bundled id, local directory or config.json, Hub id, size, live module)
into a ``ModelSpec``.

Order for a string: an existing local path, then a bundled profile, then a size (``7.5B``: what
``--params`` accepts), then the Hugging Face Hub (``config.json`` only, never weights, through the
hub cache). The fast formula counts known families without importing torch; anything else is built
on the meta device (``advisor.model.meta``). Remote code runs only with ``trust_remote_code=True``.

This is the one resolver: ``resolve`` returns the spec and the config dict it read (the simulator
builds its model from that dict); ``resolve_model`` is its spec alone. Config values are checked
once, here (``advisor.model.config_keys.check_config``).
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, NamedTuple

from advisor.model.architectures import count_from_config
from advisor.frozen import validated_copy
from advisor.model.config_keys import CONFIG_KEYS, check_config
from advisor.model.loss_kernels import loss_kernel_refusal
from advisor.model.releases import installed_behaviours
from advisor.model.spec import ModelSpec, Source, parse_count, spec_from_size
from advisor.model.spec_cache import cached_spec
from advisor.model.bundled import bundled_model_ids, find_bundled_model, load_bundled_config

_MAX_CONFIG_BYTES = 64 * 2**20  # the largest published config.json files are tens of kB
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")

ConfigFetcher = Callable[[str], dict]


def download_hub_config(repo_id: str) -> dict:
    """Fetch ``config.json`` (only) from the Hub through ``huggingface_hub``'s cache.

    The cache is tried first; the network only when the file is not cached and huggingface_hub is not
    in its own offline mode (``HF_HUB_OFFLINE``, as the hub library read it), so an offline machine
    fails at once with one line instead of retrying.
    """
    try:
        from huggingface_hub import constants, hf_hub_download
    except ImportError as err:  # pragma: no cover - transformers depends on it
        raise ValueError(f"huggingface_hub is not installed: {err}") from None
    try:
        path = hf_hub_download(repo_id, "config.json", local_files_only=True)
    except Exception:  # not cached (or a bad id): go online if we can
        if constants.HF_HUB_OFFLINE:
            raise ValueError(unresolved_message(repo_id, "not in the hub cache and the Hub is unreachable")) from None
        unreachable = _hub_unreachable(repo_id)
        if unreachable is not None:
            raise ValueError(unresolved_message(repo_id, unreachable)) from None
        try:
            with _hub_quiet():
                path = hf_hub_download(repo_id, "config.json", etag_timeout=10)
        except Exception as err:  # network, auth, 404: one clean line for the user
            raise ValueError(unresolved_message(repo_id, type(err).__name__)) from None
    try:
        return _parse_json(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read {repo_id}'s config.json: {err}") from None


def _hub_unreachable(repo_id: str) -> str | None:
    """Why the Hub cannot be reached, from one request without retries (None: it answered, whatever the
    status). ``hf_hub_download`` retries a failed connection five times with backoff (about 23 s in
    huggingface_hub 1.x-2.x) and logs each try; a machine with no route to the Hub should hear so at once."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    try:
        get_session().head(hf_hub_url(repo_id, "config.json"), headers=build_hf_headers(), timeout=10)
    except Exception as err:  # no route, DNS, TLS, timeout: the download would only retry it
        return f"the Hub is unreachable: {type(err).__name__}"
    return None


@contextmanager
def _hub_quiet():
    """huggingface_hub's own warnings (each retry) off for one call: the user gets our one line."""
    import logging  # here, not at the top: only a Hub download needs it (its import ran on every plan)

    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub_logger.setLevel(level)


def unresolved_message(name: str, why: str) -> str:
    sample = ", ".join(bundled_model_ids()[:6])
    return (
        f"cannot load model '{name[:80]}' ({why}); pass a local directory with config.json, "
        f"--params SIZE, or a bundled id ({sample}, ...; `advisor models` lists all)"
    )


def _read_local(path: Path) -> tuple[dict, str]:
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"{path} has no config.json")
    try:
        if file.stat().st_size > _MAX_CONFIG_BYTES:
            raise ValueError(f"{file.stat().st_size:,} bytes, more than a config.json holds")
        return _parse_json(file.read_text()), str(file.parent)
    except json.JSONDecodeError as err:  # a file that is not a model config at all
        raise ValueError(f"cannot read {file}: not a JSON config.json ({err.msg} at line {err.lineno})") from None
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read {file}: {err}") from None


def _parse_json(text: str) -> Any:
    """``json.loads``, with nesting deeper than the interpreter's recursion limit as a ValueError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def spec_from_config(
    cfg: dict, *, name: str, source: Source, trust_remote_code: bool = False, local_dir: str | None = None,
    cache_dir: Path | None = None,
) -> ModelSpec:
    """Exact counts from a config dict: the formula when one applies, else the meta device (its counts
    cached in ``cache_dir`` when given, ``advisor.model.spec_cache``; never for the model's own code)."""
    check_config(cfg, name=name)
    behaviours = installed_behaviours()
    spec = count_from_config(cfg, name=name, source=source, behaviours=behaviours)
    if spec is None:
        spec = _counted_on_meta(cfg, name=name, source=source, trust_remote_code=trust_remote_code,
                                local_dir=local_dir, cache_dir=cache_dir)
    return with_cache_release(with_config_facts(spec, cfg), behaviours)


def with_config_facts(spec: ModelSpec, cfg: dict) -> ModelSpec:
    """The spec with what the config says beyond its counts, read on every plan (not cached with them):
    why the loss kernels refuse it, and a GPT-NeoX block's sequential residual (transformers
    modeling_gpt_neox ``GPTNeoXLayer.forward``: ``use_parallel_residual`` false adds the attention output to
    the residual before ``post_attention_layernorm``, which saves that sum; GPTNeoXConfig defaults it true)."""
    facts: dict = {}
    defaulted = defaulted_shape_keys(cfg)
    if defaulted:
        facts["defaulted"] = defaulted
    refusal = loss_kernel_refusal(cfg)
    if refusal is not None:
        facts["loss_kernel_refusal"] = refusal
    if cfg.get("model_type") == "gpt_neox" and cfg.get("use_parallel_residual", True) is False:
        facts["sequential_residual"] = True
    return validated_copy(spec, facts) if facts else spec


# The widths a decoder's count rests on: a config without one is built at its config class's default (LlamaConfig's
# hidden_size 4096), which the plan then says.
SHAPE_FACTS = ("hidden_size", "num_layers", "num_attention_heads", "vocab_size", "intermediate_size")


def defaulted_shape_keys(cfg: dict) -> tuple[str, ...]:
    """The shape facts a decoder family's config (or its text_config) gives under none of its spellings."""
    from advisor.model.bundled import load_architectures

    info = load_architectures().get(str(cfg.get("model_type", "")))
    if info is None or info.formula != "decoder":
        return ()
    given = {**cfg, **(cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {})}
    return tuple(fact for fact in SHAPE_FACTS if not any(key in given for key in CONFIG_KEYS[fact])
                 and not (fact == "intermediate_size" and cfg.get("model_type") == "gpt2"))  # n_inner None: 4 x


def with_cache_release(spec: ModelSpec, behaviours: dict[str, str]) -> ModelSpec:
    """The spec with the KV-cache behaviour of the release in force, where it is not the older one
    (``kv_cache_values_keep_their_dtype``: read by ``advisor.estimate.kv_cache`` for --use-cache)."""
    release = behaviours.get("kv_cache_values_keep_their_dtype")
    return spec if release is None else validated_copy(spec, {"kv_cache_values_own_dtype": release})


def _counted_on_meta(cfg: dict, *, name: str, source: Source, trust_remote_code: bool, local_dir: str | None,
                     cache_dir: Path | None) -> ModelSpec:
    """Counts of a family no formula covers, from the model built on the meta device (cached)."""

    def count() -> ModelSpec:
        from advisor.model.meta import build_meta_model, spec_from_module

        module = build_meta_model(cfg, trust_remote_code=trust_remote_code, local_dir=local_dir)
        return spec_from_module(module, name=name, source=source)

    return cached_spec(cfg, name=name, cache_dir=None if trust_remote_code else cache_dir, count=count)


def _local_path(name: str) -> Path | None:
    """``name`` as an existing path (``~`` expanded), or None (``~nouser/x``: no such home, not a path)."""
    if len(name) >= 4096 or "\0" in name:
        return None
    try:
        path = Path(name).expanduser()
        return path if path.exists() else None
    except (RuntimeError, OSError, ValueError):  # expanduser: "Could not determine home directory"
        return None


class Resolved(NamedTuple):
    """What the resolver found: the spec, and the config dict it was read from (``None`` for a
    size, a ``ModelSpec`` or a live module)."""

    spec: ModelSpec
    config: dict | None


_SIZE_SHAPE = re.compile(r"^[-+]?[\d.,_e]+\s*[kmbt]?$", re.IGNORECASE)  # digits and an optional unit: meant as a size


def _looks_like_size(name: str) -> bool:
    try:
        parse_count(name)
    except ValueError:
        return False
    return True


def resolve(
    model: Any,
    *,
    trust_remote_code: bool = False,
    fetch_config: ConfigFetcher = download_hub_config,
    cache_dir: Path | None = None,
    size_as: str = "--model (a size)",
) -> Resolved:
    """The spec and config for a name, path, size string, config dict, ``ModelSpec`` or live module.
    ``cache_dir``: where meta-device counts are kept between calls (None: count every time); ``size_as``: how a
    refused size is named (``advisor inspect`` takes it as its MODEL argument)."""
    if isinstance(model, ModelSpec):
        return Resolved(model, None)
    if isinstance(model, dict):  # a config.json already read (the simulator's and benchmarks' callers)
        name = str(model.get("_name_or_path") or model.get("model_type") or "config")
        return Resolved(spec_from_config(model, name=name, source="local", trust_remote_code=trust_remote_code,
                                         cache_dir=cache_dir), dict(model))
    if not isinstance(model, str):
        if hasattr(model, "parameters") and hasattr(model, "named_modules"):
            from advisor.model.meta import spec_from_module

            spec = spec_from_module(model)
            config = getattr(model, "config", None)
            spec = with_config_facts(spec, config.to_dict()) if hasattr(config, "to_dict") else spec
            return Resolved(with_cache_release(spec, installed_behaviours()), None)
        raise ValueError(f"cannot describe a model from {type(model).__name__}")
    name = model.strip()
    if not name:
        raise ValueError(unresolved_message("", "empty name"))
    local = _local_path(name)
    if local is not None:
        cfg, local_dir = _read_local(local)
        spec = spec_from_config(cfg, name=name, source="local", trust_remote_code=trust_remote_code,
                                local_dir=local_dir, cache_dir=cache_dir)
        return Resolved(spec, cfg)
    bundled = find_bundled_model(name)
    if bundled is not None:
        cfg = load_bundled_config(bundled)
        return Resolved(spec_from_config(cfg, name=bundled, source="bundled"), cfg)
    if _looks_like_size(name):
        return Resolved(resolve_size(name, what=size_as), None)
    if _SIZE_SHAPE.match(name.strip()):  # a size parse_count refuses ("0B", "-3B", "1000.4T"): its own reason
        parse_count(name, what=size_as)
    if not _HUB_ID.match(name):
        raise ValueError(unresolved_message(name, "not a local path, bundled id, size or Hub id"))
    cfg = fetch_config(name)
    return Resolved(spec_from_config(cfg, name=name, source="hub", trust_remote_code=trust_remote_code,
                                     cache_dir=cache_dir), cfg)


def resolve_model(
    model: Any,
    *,
    trust_remote_code: bool = False,
    fetch_config: ConfigFetcher = download_hub_config,
    cache_dir: Path | None = None,
    size_as: str = "--model (a size)",
) -> ModelSpec:
    """A ``ModelSpec`` for anything ``resolve`` accepts (what ``--model`` accepts, and more); ``cache_dir`` and
    ``size_as`` as ``resolve`` reads them."""
    return resolve(model, trust_remote_code=trust_remote_code, fetch_config=fetch_config, cache_dir=cache_dir,
                   size_as=size_as).spec


# The fewest parameters a size alone may give: the shape planned for it (advisor.estimate.activation_kinds
# _size_shape: width at least 256, a 32,000-token vocabulary) holds 16.4M in its embedding and head alone.
MIN_SIZE_ONLY_PARAMS = 20_000_000


def resolve_size(text: str, *, what: str = "--params") -> ModelSpec:
    """``--params 7.5B``: size only (``what``: how the size was given, for the error)."""
    count = parse_count(text, what=what)
    if count < MIN_SIZE_ONLY_PARAMS:
        raise ValueError(f"{what} '{text.strip()[:40]}' is {count:,} parameters, below the 20M a size alone can "
                         "describe (the Llama-like shape planned for a size holds 16.4M in its 32,000-token "
                         "embedding and head): give the model's config (a Hub id or a local folder)")
    return with_cache_release(spec_from_size(count), installed_behaviours())

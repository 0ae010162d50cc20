"""``read_config_file``: which training-config format a file is (``advisor plan --from FILE``), read by its reader.

The format comes from the suffix (``.yaml``/``.yml`` accelerate, torchtune where a section names a torchtune
``_component_``, axolotl's where it has two of its own keys (base_model, sequence_len, micro_batch_size, adapter),
TrainingArguments where it has their keys and none of accelerate's: a TRL CLI or alignment-handbook config; ``.toml``
torchtitan) and, for JSON, from its keys (DeepSpeed or TrainingArguments). One module
per format reads it, and its docstring says which keys it reads and where their meaning is defined:
``advisor.planning.config_accelerate``, ``config_deepspeed``, ``config_torchtitan``, ``config_torchtune``,
``config_trainer``, ``config_axolotl``. The shared part (the result type, the typed key reader, the
reverse look-ups) is ``advisor.planning.config_file``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from advisor.planning.config_accelerate import read_accelerate
from advisor.planning.config_axolotl import is_axolotl, read_axolotl
from advisor.planning.config_deepspeed import read_deepspeed
from advisor.planning.config_file import FILE_FORMAT, ConfigFile, Reader, brief, is_deepspeed_json, load_json, too_deep
from advisor.planning.config_torchtitan import read_torchtitan
from advisor.planning.config_torchtune import is_torchtune, read_torchtune
from advisor.planning.config_trainer import TRL_KEYS, read_trainer

_TRAINER_KEYS = ("per_device_train_batch_size", "output_dir", "optim", "fsdp", "deepspeed", "gradient_checkpointing",
                 "activation_checkpointing", "learning_rate", "num_train_epochs", "gradient_accumulation_steps",
                 *TRL_KEYS)  # TRL's configs are TrainingArguments with keys of its own


def _json_format(doc: dict[str, Any], path: Path) -> str:
    if is_deepspeed_json(doc):
        load_json(path, deepspeed=True)  # DeepSpeed's loader refuses a key given twice
        return "deepspeed"
    if any(key in doc for key in _TRAINER_KEYS) or isinstance(doc.get("bf16"), bool):
        return "trainer"
    raise ValueError(f"--from {path}: neither a DeepSpeed config (no zero_optimization, train_micro_batch_size_per_gpu "
                     "or bf16/fp16 block) nor TrainingArguments (no per_device_train_batch_size, bf16, optim, ...)")


# Keys only an accelerate config has (accelerate/commands/config/config_args.py BaseConfig and ClusterConfig): a YAML
# with one is accelerate's, whatever else it holds.
_ACCELERATE_KEYS = ("compute_environment", "distributed_type", "num_processes", "num_machines", "machine_rank",
                    "main_training_function", "mixed_precision", "use_cpu", "gpu_ids", "downcast_bf16",
                    "rdzv_backend", "same_network", "main_process_ip", "main_process_port", "deepspeed_config",
                    "dynamo_config", "megatron_lm_config", "fp8_config", "enable_cpu_affinity")
# The sections of a torchtitan job config (torchtitan/config/job_config.py JobConfig); a TOML with none is another
# program's file.
_TORCHTITAN_SECTIONS = ("job", "model", "optimizer", "lr_scheduler", "training", "parallelism", "checkpoint",
                        "activation_checkpoint", "compile", "quantize", "float8", "metrics", "profiling", "comm",
                        "experimental", "validation", "fault_tolerance", "memory_estimation")
# A TRL CLI config (``trl sft --config``: TrlParser) or an alignment-handbook recipe (H4ArgumentParser) is
# TrainingArguments, a TRL config's own keys and the model's (TRL's ModelConfig) in one YAML.
_MODEL_KEYS = ("model_name_or_path", "use_peft", "lora_r", "load_in_4bit", "max_seq_length", "max_length")


def _trainer_yaml(doc: dict[str, Any]) -> bool:
    return not any(key in doc for key in _ACCELERATE_KEYS) and any(key in doc for key in (*_TRAINER_KEYS, *_MODEL_KEYS))


def _yaml_reason(err: Exception) -> str:
    """PyYAML's problem and where it is, on one line (its own message quotes the offending lines over several)."""
    problem, mark = getattr(err, "problem", None), getattr(err, "problem_mark", None)
    if not problem:
        return brief(str(err))
    prefix = "could not determine a constructor for the tag "
    if problem.startswith(prefix):  # !!python/object/apply and the like: what safe_load refuses to build
        tag = problem.removeprefix(prefix).strip("'\"").replace("tag:yaml.org,2002:", "!!")
        problem = f"the tag {tag}: only plain data is read, no tag that builds an object"
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return brief(where + problem, 160)


def _parse(path: Path) -> tuple[str, dict[str, Any]]:
    suffix = path.suffix.lower()
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ValueError(f"--from {path}: not a text file") from None
    if suffix in (".yaml", ".yml"):
        import yaml  # PyYAML (accelerate's dependency): only for a YAML file

        try:
            doc = yaml.safe_load(text)
        except RecursionError:  # PyYAML's composer recurses once a level
            raise ValueError(too_deep(path)) from None
        except yaml.YAMLError as err:
            raise ValueError(f"--from {path}: not valid YAML ({_yaml_reason(err)})") from None
        kind = "accelerate" if not isinstance(doc, dict) else "torchtune" if is_torchtune(doc) else \
            "axolotl" if is_axolotl(doc) else "trainer" if _trainer_yaml(doc) else "accelerate"
        if isinstance(doc, dict) and kind == "accelerate" and not any(
                key in doc for key in (*_ACCELERATE_KEYS, "fsdp_config", "parallelism_config")):
            raise ValueError(f"--from {path}: not a config file dp-advisor reads: no accelerate key "
                             "(distributed_type, num_processes, mixed_precision, ...), no torchtune model "
                             "_component_, no axolotl, TRL or TrainingArguments keys")
    elif suffix == ".toml":
        import tomllib

        try:
            doc = tomllib.loads(text)
        except RecursionError:  # tomllib parses nested arrays recursively
            raise ValueError(too_deep(path)) from None
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"--from {path}: not valid TOML ({brief(str(err))})") from None
        kind = "torchtitan"
        if isinstance(doc, dict) and not any(key in doc for key in _TORCHTITAN_SECTIONS):
            raise ValueError(f"--from {path}: not a torchtitan config: none of its sections "
                             f"({', '.join(_TORCHTITAN_SECTIONS)})")
    elif suffix == ".json":
        doc = load_json(path)
        kind = _json_format(doc, path)
    else:
        raise ValueError(f"--from {path}: unknown format '{suffix or path.name}': give an accelerate, torchtune, "
                         "TRL or axolotl .yaml, a DeepSpeed or TrainingArguments .json, or a torchtitan .toml")
    if not isinstance(doc, dict):
        raise ValueError(f"--from {path}: the file holds no mapping of keys")
    return kind, doc


_READERS: dict[str, Callable[[Reader, Path], None]] = {
    "accelerate": read_accelerate,
    "axolotl": read_axolotl,
    "deepspeed": lambda r, base: _read_standalone_deepspeed(r),
    "torchtitan": lambda r, base: read_torchtitan(r),
    "torchtune": lambda r, base: read_torchtune(r),
    "trainer": read_trainer,
}


def _read_standalone_deepspeed(r: Reader) -> None:
    """A DeepSpeed JSON given itself: as read_deepspeed, and where it enables neither bf16 nor fp16 a line saying
    that DeepSpeed alone trains in fp32 (both blocks default to disabled, deepspeed/runtime/precision_config.py),
    while the launcher that usually carries such a file fills one in (accelerate's DeepSpeedPlugin adds
    bf16.enabled under mixed_precision bf16; the Trainer's bf16=True goes through it): planned with --precision's
    default, as the accelerate reader plans a file that leaves mixed_precision out."""
    read_deepspeed(r)
    r.take(FILE_FORMAT, "DeepSpeed", "recipe", "deepspeed")
    if not any(value.option == "precision" for value in r.values):
        auto = [key for key in ("bf16", "fp16") if isinstance(r.doc.get(key), dict) and r.doc[key].get("enabled") == "auto"]
        if auto:  # the Trainer's DeepSpeed integration fills "auto" from its own bf16 / fp16 arguments
            r.notes.append(f"{' / '.join(key + '.enabled' for key in auto)} 'auto': the Trainer fills it from its bf16 / "
                           "fp16 arguments, which this file does not hold; planned with --precision's default")
        else:
            r.notes.append("bf16 / fp16 not set: DeepSpeed alone trains in fp32 (both disabled by default) unless the "
                           "launcher enables one (the Trainer's bf16 / fp16, accelerate's mixed_precision); planned "
                           "with --precision's default")


def read_config_file(path: str | Path) -> ConfigFile:
    """Read ``path`` (format from its suffix, and for JSON from its keys) into the plan settings it fixes."""
    if not str(path).strip():  # Path("") is ".", the working directory
        raise ValueError("--from is empty: give the config file")
    path = Path(path)
    if not path.is_file():
        what = ("a directory" if path.is_dir() else "not a regular file (a device or pipe)" if path.exists()
                else "no such file")
        raise ValueError(f"--from {path}: {what}; give the config file itself")
    kind, doc = _parse(path)
    reader = Reader(doc, where=str(path))
    _READERS[kind](reader, path.parent)
    return ConfigFile(path=str(path), format=kind, values=tuple(reader.values),  # type: ignore[arg-type]
                      not_read=tuple(reader.unread()), notes=tuple(reader.notes))

"""Which causal-LM families' transformers TP plans name styles ``wrappers.tensor_parallel`` cannot apply.

``python benchmarks/tp_plan_styles.py`` reads every causal-LM model_type's config class defaults
(``base_model_tp_plan``, the text config's for a composite one) in the installed transformers and prints
the ``unsupported_tp_styles`` entry of ``profiles/tensor_parallel.json``: model_type -> the styles with
no plain PyTorch equivalent in ``wrappers.tensor_parallel._STYLES``. ``--write`` stores it there. The
planner (``advisor.estimate.model_parallel.check_mesh_support``) refuses a tensor-parallel mesh for these,
since ``wrap()`` could not run it.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "tensor_parallel.json"


def unsupported_styles() -> dict[str, list[str]]:
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from wrappers.tensor_parallel import _STYLES

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    out = {}
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        try:
            config = transformers.CONFIG_MAPPING[model_type]()
        except Exception:  # noqa: BLE001  (a config class that does not build from its defaults: no plan to read)
            continue
        plan = dict(getattr(config, "base_model_tp_plan", None) or {})
        try:
            plan.update(getattr(config.get_text_config(), "base_model_tp_plan", None) or {})
        except Exception:  # noqa: BLE001
            pass
        unknown = sorted({style for style in plan.values() if style not in _STYLES})
        if unknown:
            out[model_type] = unknown
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the table in profiles/tensor_parallel.json")
    args = parser.parse_args()
    table = unsupported_styles()
    if args.write:
        raw = json.loads(PROFILE.read_text())
        import transformers

        raw["_unsupported_tp_styles_source"] = (
            f"unsupported_tp_styles: written by python benchmarks/tp_plan_styles.py --write (transformers "
            f"{transformers.__version__}): each causal-LM model_type whose config class's base_model_tp_plan (the text "
            "config's for a composite one) names a style wrappers.tensor_parallel._STYLES has no plain PyTorch "
            "equivalent for (colwise, rowwise, colwise_gather_output, embedding_rowwise are applied), with those "
            "styles; e.g. qwen3, gemma3_text 'replicated_with_grad_allreduce' on q_norm/k_norm, olmo2/phi3 "
            "'rowwise_split_input', mixtral 'moe_tp_experts'. wrappers.tensor_parallel.resolve_plan raises on them, so "
            "the planner refuses a tensor-parallel mesh for these families (advisor.estimate.model_parallel."
            "check_mesh_support; found by the sweep: rows whose mesh step failed where the plan had been made).")
        raw["unsupported_tp_styles"] = table
        PROFILE.write_text(json.dumps(raw, indent=1) + "\n")
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()

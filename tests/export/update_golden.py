"""Regenerate tests/export/golden/ after an intended change: ``python tests/export/update_golden.py``.

Review the diff (``git diff tests/export/golden``) before committing: every changed line is a change
in what users' launchers will run.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

from export_plans import PLANS, make_plan  # noqa: E402

from advisor.export import FORMATS  # noqa: E402
from advisor.export.formats import format_plan_options  # noqa: E402

GOLDEN = HERE / "golden"
SUFFIX = {"accelerate": "accelerate.yaml", "deepspeed-json": "ds_config.json", "torchrun": "torchrun.sh",
          "trainer-args": "training_args.json", "lightning": "lightning.py", "torchtitan": "torchtitan.toml"}


def golden_files() -> dict[Path, str]:
    """Golden path -> expected text, for every shared plan and every format."""
    files = {}
    for name, args in PLANS.items():
        plans = {}  # each format is planned with its own recipe row and ZeRO sizes, as `advisor export` plans it
        for fmt in FORMATS.values():
            options = format_plan_options(fmt.name, args)
            key = (options["recipe"], options.get("zero"))
            try:
                if key not in plans:
                    plans[key] = make_plan(**options)
                files[GOLDEN / f"{name}.{SUFFIX[fmt.name]}"] = fmt.render(plans[key], None)
            except ValueError:  # a format that cannot write this plan (torchtitan: no DeepSpeed) has no golden file
                assert fmt.name == "torchtitan" and args.get("engine") == "deepspeed", (name, fmt.name)
    return files


def main() -> None:
    GOLDEN.mkdir(exist_ok=True)
    for path, text in golden_files().items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(HERE.parents[1])}")


if __name__ == "__main__":
    main()

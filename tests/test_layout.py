"""The layers the layout promises: a torch-free planning boundary and a one-way dependency.

- ``advisor.hardware``, ``advisor.estimate``, ``advisor.planning`` and ``advisor.model`` (all but
  ``meta``, which counts live modules) import neither torch nor transformers, even lazily; a plan
  for a bundled model leaves them unloaded.
- ``wrappers`` depends on ``advisor`` (it asks the planner); ``advisor`` reaches ``wrappers`` only
  from ``advisor.simulate``, which runs the exact recipe ``wrap()`` runs. ``wrappers`` never
  imports the simulator or the CLI.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCH_FREE = ("advisor/hardware", "advisor/estimate", "advisor/planning", "advisor/model")
TORCH_ALLOWED = {"advisor/model/meta.py"}
HEAVY = ("torch", "transformers", "accelerate", "peft", "deepspeed", "lightning")


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("path", [p for p in _files(*TORCH_FREE) if str(p.relative_to(ROOT)) not in TORCH_ALLOWED],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_planning_layers_never_import_heavy_libraries(path):
    heavy = sorted(n for n in _imports(path) if _top(n) in HEAVY)
    assert heavy == [], f"{path.relative_to(ROOT)} imports {heavy}"


def test_advisor_reaches_wrappers_only_from_the_simulator():
    offenders = [
        str(p.relative_to(ROOT)) for p in _files("advisor")
        if not str(p.relative_to(ROOT)).startswith("advisor/simulate/")
        and any(_top(n) == "wrappers" for n in _imports(p))
    ]
    assert offenders == []


def test_wrappers_never_import_the_simulator_or_the_cli():
    offenders = [
        (str(p.relative_to(ROOT)), n) for p in _files("wrappers") for n in _imports(p)
        if n.startswith(("advisor.simulate", "advisor.cli"))
    ]
    assert offenders == []


CHECK = """
import importlib, pkgutil, sys
for pkg in ("advisor.hardware", "advisor.estimate", "advisor.planning", "advisor.model"):
    module = importlib.import_module(pkg)
    for info in pkgutil.walk_packages(module.__path__, pkg + "."):
        if info.name != "advisor.model.meta":
            importlib.import_module(info.name)
import advisor
p = advisor.plan("Qwen/Qwen2.5-7B", gpus="2xA100")
assert p.recommendation is not None
print(",".join(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def test_importing_the_planning_packages_and_planning_loads_no_torch():
    result = subprocess.run([sys.executable, "-c", CHECK.format(heavy=HEAVY)], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""

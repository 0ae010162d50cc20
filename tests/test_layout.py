"""The layers the layout promises: a torch-free planning boundary and a one-way dependency.

- ``advisor.hardware``, ``advisor.estimate``, ``advisor.planning`` and ``advisor.model`` (all but
  ``meta``, which counts live modules) import neither torch nor transformers, even lazily; a plan
  for a bundled model leaves them unloaded.
- ``wrappers`` depends on ``advisor`` (it asks the planner); ``advisor`` reaches ``wrappers`` only
  from ``advisor.simulate``, which runs the exact recipe ``wrap()`` runs. ``wrappers`` never
  imports the simulator or the CLI.
- Inside ``advisor`` every import, lazy ones included, points down ``LAYERS`` (or stays inside its
  own layer); imports under ``if TYPE_CHECKING:`` are annotations, not edges.
- No module of ``advisor`` or ``wrappers`` imports a private (``_name``) name of another project module.
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
HEAVY = ("torch", "transformers", "accelerate", "peft", "deepspeed", "lightning", "bitsandbytes")


# advisor's layers, lowest first: a module may import its own layer and those before it.
LAYERS = (
    ("profiles",),
    ("advisor.units", "advisor.precision", "advisor.calibration", "advisor.recipes", "advisor.frozen"),
    ("advisor.model",),
    ("advisor.training",),
    ("advisor.strategies", "advisor.mesh"),
    ("advisor.hardware",),
    ("advisor.estimate",),
    ("advisor.simulate",),
    ("advisor.planning",),
    ("advisor.export",),
    ("advisor.cli",),
    ("advisor",),  # the package's own __init__ (the public API) sits on top
)


def _layer(module: str) -> int | None:
    """The index in LAYERS of the longest prefix naming ``module``'s layer, or None outside advisor."""
    best = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except what sits under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                stack.extend(child.orelse)
                continue
            stack.append(child)


def back_edges(modules: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs of advisor modules where the import points up ``LAYERS``."""
    return sorted((src, dst) for src, names in modules.items() for dst in names
                  if _layer(src) is not None and _layer(dst) is not None and _layer(dst) > _layer(src))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module a file imports at run time, at any depth (lazy imports inside functions included)."""
    names: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
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


def test_every_import_in_advisor_points_down_the_layers():
    modules = {_module_name(p): _imports(p) for p in _files("advisor")}
    assert all(_layer(name) is not None for name in modules), [n for n in modules if _layer(n) is None]
    assert back_edges(modules) == []


def test_a_planted_back_edge_is_found():
    """The check itself: an estimator importing the planner, or the calibration edge importing an
    estimator (the cycle this layout removed), is reported; a lazy import counts, a TYPE_CHECKING one not."""
    planted = ast.parse("def f():\n    from advisor.planning.api import plan\n"
                        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from advisor.cli.main import main\n")
    names = {n.module for n in _runtime_nodes(planted) if isinstance(n, ast.ImportFrom)}
    assert names == {"advisor.planning.api", "typing"}
    assert back_edges({"advisor.estimate.memory": names}) == [("advisor.estimate.memory", "advisor.planning.api")]
    assert back_edges({"advisor.calibration": {"advisor.estimate.error_bars"}}) == [
        ("advisor.calibration", "advisor.estimate.error_bars")]


PROJECT = ("advisor", "wrappers", "profiles", "benchmarks", "tests")


def _absolute(module: str, node: ast.ImportFrom, *, package: bool) -> str:
    """The module an ``ImportFrom`` in ``module`` names, relative imports resolved (``package``: ``module``
    is a package's ``__init__``, so one dot is the module itself)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports(tree: ast.AST, module: str, *, package: bool = False) -> list[str]:
    """``module.name`` for each name starting with one underscore that ``tree`` (the source of ``module``)
    imports from a module of this project: absolute or relative, at any depth (lazy imports inside
    functions, and ``TYPE_CHECKING`` ones, included). What is imported counts, not the local alias."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(module, node, package=package)
            if _top(source) in PROJECT:
                found += [f"{source}.{alias.name}" for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_module_imports_another_modules_private_names():
    """A name another module needs is public there (documented) or lives in the module it belongs to
    (issue 22 item 5: ``_strategy_buffers``, ``_recipe_dtypes``, ``_RING_FACTOR``, the simulator's
    fake-tensor helpers were imported across modules)."""
    offenders = [f"{p.relative_to(ROOT)}: {name}" for p in _files("advisor", "wrappers")
                 for name in private_imports(ast.parse(p.read_text()), _module_name(p),
                                             package=p.name == "__init__.py")]
    assert offenders == [], offenders


def test_a_planted_private_import_is_found():
    """The check itself: absolute, relative and lazy imports of a private name are reported; a public name
    under a private alias, a dunder and a third-party private module are not."""
    planted = ast.parse(
        "from advisor.estimate.step_time import GB, _Traffic\n"
        "from advisor.model.config_keys import config_value as _get\n"
        "from wrappers import __version__\n"
        "from torch._subclasses.fake_tensor import FakeTensorMode\n"
        "def f():\n"
        "    from .memory import _recipe_dtypes\n"
        "    from ..simulate.step import _fake_mode\n"
        "    from . import _private_module\n")
    assert private_imports(planted, "advisor.estimate.mesh_time") == [
        "advisor.estimate.step_time._Traffic", "advisor.estimate.memory._recipe_dtypes",
        "advisor.simulate.step._fake_mode", "advisor.estimate._private_module"]
    assert private_imports(ast.parse("from .x import _y\n"), "advisor.simulate", package=True) == [
        "advisor.simulate.x._y"]


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


def test_copies_of_frozen_models_are_validated():
    """``model_copy(update=...)`` skips validation (issue 21 item 18): every copy with changed fields goes
    through ``advisor.frozen.validated_copy``, so a value the type refuses cannot travel on in a copy."""
    offenders = []
    for folder in ("advisor", "wrappers"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if "model_copy(update" in line and not line.lstrip().startswith(("#", "``")):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}")
    assert offenders == [], offenders

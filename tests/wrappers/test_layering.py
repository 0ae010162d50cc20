"""The dependency between ``advisor`` and ``wrappers`` runs one way, with one explained exception.

``wrappers`` imports ``advisor`` for planning (the strategy and precision tables, the planner, model
counts), never ``advisor.simulate`` or ``advisor.cli``. ``advisor`` imports ``wrappers`` only in
``advisor.simulate``, which runs the very recipe ``wrap()`` applies (``apply_recipe``) on fake
tensors. Read from the source (every import statement, also those inside functions).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(package: str) -> dict[str, set[str]]:
    """Module path -> every module name it imports."""
    found = {}
    for file in sorted((ROOT / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(file.relative_to(ROOT))] = names
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_wrappers_never_import_the_simulator_or_the_cli():
    bad = {module: sorted(n for n in names if _under(n, "advisor.simulate") or _under(n, "advisor.cli"))
           for module, names in _imports("wrappers").items()}
    assert {m: n for m, n in bad.items() if n} == {}


def test_advisor_imports_wrappers_only_in_the_simulator():
    users = {module for module, names in _imports("advisor").items() if any(_under(n, "wrappers") for n in names)}
    assert users and all(module.startswith("advisor/simulate/") for module in users), users

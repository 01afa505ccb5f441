"""The route stage's pure policies and the cluster benchmark built on them need no services."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import workers.cluster_sim
import workers.route

ROUTE_DIR = Path(workers.route.__file__).resolve().parent
CLUSTER_DIR = Path(workers.cluster_sim.__file__).resolve().parent
PURE_MODULES = (ROUTE_DIR / "policies.py", *sorted(CLUSTER_DIR.glob("*.py")))
ALLOWED = {"numpy", "workers"}
#: What the pure modules may import from this project.
ALLOWED_OURS = ("workers.registry", "workers.sim", "workers.route.")


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_pure_route_modules_import_only_stdlib_numpy_and_the_pure_core() -> None:
    for path in PURE_MODULES:
        name = path.name
        names = imports_of(path)
        foreign = {n for n in names if n.split(".")[0] not in sys.stdlib_module_names
                   and n.split(".")[0] not in ALLOWED}
        assert not foreign, f"{name} imports {sorted(foreign)}"
        ours = {n for n in names if n.split(".")[0] == "workers"}
        assert all(n.startswith(ALLOWED_OURS) for n in ours), (name, sorted(ours))

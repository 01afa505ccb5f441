"""workers/sim is the pure core: standard library and numpy only, no services, no I/O stack."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import workers.sim

SIM_DIR = Path(workers.sim.__file__).resolve().parent
FORBIDDEN = {"flask", "celery", "sqlalchemy", "redis", "vllm", "torch", "app", "kombu",
             "psycopg", "requests", "httpx"}
ALLOWED_THIRD_PARTY = {"numpy"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            roots.add("__import__")
    return roots


def test_sim_imports_only_the_standard_library_and_numpy() -> None:
    files = sorted(SIM_DIR.rglob("*.py"))
    assert files
    for path in files:
        roots = imported_roots(path)
        assert not roots & FORBIDDEN, (path.name, roots & FORBIDDEN)
        foreign = roots - set(sys.stdlib_module_names) - ALLOWED_THIRD_PARTY
        assert not foreign, f"{path.name} imports {sorted(foreign)}"
        assert "importlib" not in roots and "__import__" not in roots, path.name


def test_public_api_is_declared() -> None:
    assert workers.sim.__doc__ and "\n" not in workers.sim.__doc__.strip()
    for name in workers.sim.__all__:
        assert hasattr(workers.sim, name), name

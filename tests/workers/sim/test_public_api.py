"""workers.sim declares its public API (what the rest of blockq and the benchmarks use). What it may
import is checked with the other layers in tests/test_architecture.py."""

from __future__ import annotations

import workers.sim


def test_public_api_is_declared() -> None:
    assert workers.sim.__doc__ and "\n" not in workers.sim.__doc__.strip()
    for name in workers.sim.__all__:
        assert hasattr(workers.sim, name), name

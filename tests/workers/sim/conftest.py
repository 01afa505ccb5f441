"""Fixtures for the simulator tests."""

from __future__ import annotations

import pytest

from workers.sim import ExecModel

from .cases import TOY_COEFFICIENTS


@pytest.fixture
def toy_model() -> ExecModel:
    return ExecModel("toy", (64,), TOY_COEFFICIENTS)

"""Length predictors of the cluster benchmark: the output lengths the router plans with.

Registered by name in `LENGTH_PREDICTORS`; `predictor_from_spec` builds one from a spec such as
``lognormal:0.5`` (a name, then the predictor's parameters).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, Protocol

import numpy as np

from workers.registry import Registry

from .workload import Workload

__all__ = [
    "LENGTH_PREDICTORS",
    "LengthPredictor",
    "LogNormalPredictor",
    "MeanPredictor",
    "OraclePredictor",
    "predictor_from_spec",
]


class LengthPredictor(Protocol):
    @property
    def name(self) -> str:
        """Short label for tables, e.g. ``"lognormal:0.5"``."""
        ...

    def predict(self, workload: Workload, seed: int) -> list[int]:
        """One predicted output length per request of `workload`, deterministic for `seed`."""
        ...


LENGTH_PREDICTORS: Registry[LengthPredictor] = Registry("length predictor")


@LENGTH_PREDICTORS.register("oracle")
@dataclass(frozen=True, slots=True)
class OraclePredictor:
    """The true lengths (the Block* oracle; benchmarks only)."""

    name: ClassVar[str] = "oracle"

    def predict(self, workload: Workload, seed: int) -> list[int]:
        return list(workload.num_output_tokens)


@LENGTH_PREDICTORS.register("lognormal")
@dataclass(frozen=True, slots=True)
class LogNormalPredictor:
    """True length times a lognormal factor with median 1: the error of a learned model.

    Sigma 0.15 makes the median absolute error about 10 % (the Block paper's claim for its
    RoBERTa regressor); 0.5 about 30 %, 1.0 about 50 % (typical of prompt-only predictors).
    """

    sigma: float

    @property
    def name(self) -> str:
        return f"lognormal:{self.sigma:g}"

    def predict(self, workload: Workload, seed: int) -> list[int]:
        factors = np.random.default_rng([seed, 7]).lognormal(0.0, self.sigma, len(workload))
        lengths = workload.num_output_tokens
        return [max(1, round(n * f)) for n, f in zip(lengths, factors, strict=True)]


@LENGTH_PREDICTORS.register("mean")
@dataclass(frozen=True, slots=True)
class MeanPredictor:
    """The workload's mean output length for every request: a predictor that knows nothing."""

    name: ClassVar[str] = "mean"

    def predict(self, workload: Workload, seed: int) -> list[int]:
        return [max(1, round(workload.mean_output_tokens))] * len(workload)


def predictor_from_spec(spec: str) -> LengthPredictor:
    """``<name>[:<param>,...]``, e.g. ``oracle``, ``mean``, ``lognormal:0.5``.

    Unknown names raise listing the registered ones; so does a wrong number of parameters.
    """
    name, _, param_text = spec.partition(":")
    predictor_cls = LENGTH_PREDICTORS.get(name)
    params = [float(p) for p in param_text.split(",")] if param_text else []
    expected = [f.name for f in fields(predictor_cls)]
    if len(params) != len(expected):
        wanted = ":".join([name, *(f"<{p}>" for p in expected)]) if expected else name
        raise ValueError(f"length predictor {spec!r}: expected {wanted}")
    return predictor_cls(*params)

"""Length predictors of the cluster benchmark: the output lengths the router plans with.

Registered by name in `SIMULATED_LENGTH_PREDICTORS`; `predictor_from_spec` builds one from a spec
such as
``lognormal:0.5`` (a name, then the predictor's parameters). The default is ``learned-errors``:
the shipped length model's measured held-out errors (a fixture derived from the conversations by
``scripts/make_length_error_fixture.py``), not a chosen sigma.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np

from workers.registry import Registry

from .workload import Workload

__all__ = [
    "DEFAULT_PREDICTOR",
    "LEARNED_ERRORS_FIXTURE",
    "SIMULATED_LENGTH_PREDICTORS",
    "LearnedErrorsPredictor",
    "LearnedPredictor",
    "LengthErrors",
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


SIMULATED_LENGTH_PREDICTORS: Registry[LengthPredictor] = Registry("length predictor")


@SIMULATED_LENGTH_PREDICTORS.register("oracle")
@dataclass(frozen=True, slots=True)
class OraclePredictor:
    """The true lengths (the Block* oracle; benchmarks only)."""

    name: ClassVar[str] = "oracle"

    def predict(self, workload: Workload, seed: int) -> list[int]:
        return list(workload.num_output_tokens)


@SIMULATED_LENGTH_PREDICTORS.register("lognormal")
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


#: The learned length model's out-of-fold log residuals, binned by true length.
LEARNED_ERRORS_FIXTURE = Path(__file__).resolve().parent / "data" / "learned_length_errors.json"
#: The predictor of capacity tables unless one is chosen.
DEFAULT_PREDICTOR = "learned-errors"


@dataclass(frozen=True, slots=True)
class LengthErrors:
    """An empirical distribution of log residuals log(predicted / true), per true-length bin."""

    #: Largest true length of each bin, ascending (the last bin also takes longer ones).
    bin_max_tokens: tuple[int, ...]
    #: The residuals of each bin.
    log_residuals: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if not self.bin_max_tokens or len(self.bin_max_tokens) != len(self.log_residuals):
            raise ValueError("length errors need one residual list per bin, at least one bin")
        if any(b < a for a, b in zip(self.bin_max_tokens, self.bin_max_tokens[1:], strict=False)):
            raise ValueError("bins must be ordered by true length")
        if not all(self.log_residuals):
            raise ValueError("every bin needs at least one residual")

    @classmethod
    def from_fixture(cls, raw: dict) -> LengthErrors:
        bins = raw["bins"]
        return cls(tuple(int(b["max_true_tokens"]) for b in bins),
                   tuple(tuple(float(r) for r in b["log_residuals"]) for b in bins))

    def draw(self, true_tokens: tuple[int, ...] | list[int], seed: int) -> list[int]:
        """true x exp(a residual drawn from the bin of the true length), per request."""
        rng = np.random.default_rng([seed, 13])
        last = len(self.bin_max_tokens) - 1
        predicted = []
        for n in true_tokens:
            residuals = self.log_residuals[min(bisect.bisect_left(self.bin_max_tokens, n), last)]
            residual = residuals[int(rng.integers(len(residuals)))]
            predicted.append(max(1, round(n * float(np.exp(residual)))))
        return predicted


@lru_cache(maxsize=4)
def load_length_errors(path: Path = LEARNED_ERRORS_FIXTURE) -> LengthErrors:
    """The fixture at `path` (read once per process)."""
    return LengthErrors.from_fixture(json.loads(Path(path).read_text()))


@SIMULATED_LENGTH_PREDICTORS.register("learned-errors")
@dataclass(frozen=True, slots=True)
class LearnedErrorsPredictor:
    """True length times the exponential of a residual of the learned model, drawn (seeded)
    from its measured out-of-fold residuals for answers of about that length.

    The residuals keep the model's regression to the mean (short answers over-predicted, long
    ones under-predicted) that a length-independent noise model such as ``lognormal`` lacks.
    """

    name: ClassVar[str] = "learned-errors"

    def predict(self, workload: Workload, seed: int) -> list[int]:
        return load_length_errors().draw(workload.num_output_tokens, seed)


@SIMULATED_LENGTH_PREDICTORS.register("learned")
@dataclass(frozen=True, slots=True)
class LearnedPredictor:
    """The learned model's own predictions, carried by a replay workload (real prompts)."""

    name: ClassVar[str] = "learned"

    def predict(self, workload: Workload, seed: int) -> list[int]:
        if workload.predicted_output_tokens is None:
            raise ValueError(f"workload {workload.name!r} carries no learned predictions (only "
                             "replay workloads of real prompts do); use learned-errors")
        return list(workload.predicted_output_tokens)


@SIMULATED_LENGTH_PREDICTORS.register("mean")
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
    predictor_cls = SIMULATED_LENGTH_PREDICTORS.get(name)
    params = [float(p) for p in param_text.split(",")] if param_text else []
    expected = [f.name for f in fields(predictor_cls)]
    if len(params) != len(expected):
        wanted = ":".join([name, *(f"<{p}>" for p in expected)]) if expected else name
        raise ValueError(f"length predictor {spec!r}: expected {wanted}")
    return predictor_cls(*params)

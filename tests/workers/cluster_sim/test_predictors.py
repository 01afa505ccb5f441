"""Length predictors: what each predicts, their registry and specs."""

from __future__ import annotations

import pytest

from workers.cluster_sim import (
    SIMULATED_LENGTH_PREDICTORS,
    LogNormalPredictor,
    MeanPredictor,
    OraclePredictor,
    Workload,
    poisson_unit_arrivals,
    predictor_from_spec,
)


def _workload(lengths: list[tuple[int, int]]) -> Workload:
    return Workload("test", poisson_unit_arrivals(len(lengths), 0),
                    tuple(p for p, _ in lengths), tuple(d for _, d in lengths))


def test_predictors() -> None:
    workload = _workload([(10, 100), (10, 300), (10, 20)] * 100)
    assert OraclePredictor().predict(workload, 0) == list(workload.num_output_tokens)
    assert MeanPredictor().predict(workload, 0) == [140] * 300
    noisy = LogNormalPredictor(0.15).predict(workload, 0)
    assert noisy == LogNormalPredictor(0.15).predict(workload, 0) != LogNormalPredictor(
        0.15).predict(workload, 1)
    errors = sorted(abs(p - t) / t for p, t in zip(noisy, workload.num_output_tokens, strict=True))
    assert 0.06 < errors[len(errors) // 2] < 0.14  # sigma 0.15: about 10 % median error


def test_specs_name_a_registered_predictor_and_its_parameters() -> None:
    assert SIMULATED_LENGTH_PREDICTORS.names() == ["learned", "learned-errors", "lognormal", "mean",
                                         "oracle"]
    assert predictor_from_spec("lognormal:0.5") == LogNormalPredictor(0.5)
    assert predictor_from_spec("lognormal:0.5").name == "lognormal:0.5"
    assert predictor_from_spec("oracle") == OraclePredictor()
    assert predictor_from_spec("mean").name == "mean"


@pytest.mark.parametrize(("spec", "message"), [
    ("psychic", "unknown length predictor 'psychic'; known: learned, learned-errors, "
     "lognormal, mean, oracle"),
    ("lognormal", "expected lognormal:<sigma>"),
    ("lognormal:0.1,0.2", "expected lognormal:<sigma>"),
    ("oracle:1", "expected oracle$"),
])
def test_bad_specs_say_what_is_known_or_expected(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        predictor_from_spec(spec)

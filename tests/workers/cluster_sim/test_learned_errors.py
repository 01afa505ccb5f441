"""The learned model's predictors: its measured errors (the fixture) and its own predictions."""

from __future__ import annotations

import math

import pytest

from workers.cluster_sim import (
    DEFAULT_PREDICTOR,
    Workload,
    poisson_unit_arrivals,
    predictor_from_spec,
)
from workers.cluster_sim.predictors import (
    LearnedErrorsPredictor,
    LearnedPredictor,
    LengthErrors,
    load_length_errors,
)


def _workload(outputs: list[int], predicted: list[int] | None = None) -> Workload:
    return Workload("test", poisson_unit_arrivals(len(outputs), 0), (10,) * len(outputs),
                    tuple(outputs), None if predicted is None else tuple(predicted))


def test_a_residual_comes_from_the_bin_of_the_true_length() -> None:
    errors = LengthErrors((100, 1000), ((math.log(2.0),), (math.log(0.5),)))
    # <= 100 tokens: doubled; above (also past the last bin's top): halved.
    assert errors.draw([1, 100, 101, 1000, 5000], seed=0) == [2, 200, 50, 500, 2500]


def test_draws_are_seeded_and_use_the_whole_bin() -> None:
    errors = LengthErrors((10**6,), (tuple(math.log(f) for f in (0.5, 1.0, 2.0)),))
    draw = errors.draw([100] * 300, seed=1)
    assert draw == errors.draw([100] * 300, seed=1) != errors.draw([100] * 300, seed=2)
    assert set(draw) == {50, 100, 200}


@pytest.mark.parametrize(("bins", "residuals"), [((), ()), ((10, 5), ((0.0,), (0.0,))),
                                                 ((10,), ((),))])
def test_malformed_error_tables_are_refused(bins, residuals) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        LengthErrors(bins, residuals)


def test_the_shipped_fixture_is_the_default_predictor_and_draws_from_it() -> None:
    assert DEFAULT_PREDICTOR == "learned-errors"
    predictor = predictor_from_spec(DEFAULT_PREDICTOR)
    assert isinstance(predictor, LearnedErrorsPredictor) and predictor.name == "learned-errors"
    errors = load_length_errors()
    assert len(errors.bin_max_tokens) >= 5 and sum(map(len, errors.log_residuals)) >= 150
    workload = _workload([20, 300, 2000] * 200)
    predicted = predictor.predict(workload, seed=5)
    assert predicted == predictor.predict(workload, seed=5) != predictor.predict(workload, seed=6)
    for true, guess in zip(workload.num_output_tokens, predicted, strict=True):
        residuals = errors.log_residuals[min(
            sum(top < true for top in errors.bin_max_tokens), len(errors.bin_max_tokens) - 1)]
        assert guess in {max(1, round(true * math.exp(r))) for r in residuals}
    # The learned model regresses to the mean: short answers over-, long ones under-predicted.
    ratios = {t: sorted(g / t for g, tt in zip(predicted, workload.num_output_tokens,
                                                strict=True) if tt == t) for t in (20, 2000)}
    assert ratios[20][len(ratios[20]) // 2] > 1.5 and ratios[2000][len(ratios[2000]) // 2] < 0.7


def test_learned_predictions_ride_on_replay_workloads_only() -> None:
    assert LearnedPredictor().predict(_workload([5, 6], [7, 8]), seed=0) == [7, 8]
    with pytest.raises(ValueError, match="no learned predictions"):
        predictor_from_spec("learned").predict(_workload([5, 6]), seed=0)

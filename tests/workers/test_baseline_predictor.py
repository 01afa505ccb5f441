"""The baseline length predictor: the running mean, never above max_tokens, never below 1."""

from workers.predict.baseline import LengthStats, RunningMeanPredictor


def test_prior_until_observations_then_mean_clipped_to_max_tokens() -> None:
    predictor = RunningMeanPredictor(prior_tokens=100)
    assert predictor.predict(LengthStats(0, 0), max_tokens=500) == 100
    assert predictor.predict(LengthStats(total_tokens=300, count=4), max_tokens=500) == 75
    assert predictor.predict(LengthStats(total_tokens=300, count=4), max_tokens=50) == 50
    assert predictor.predict(LengthStats(total_tokens=0, count=4), max_tokens=50) == 1

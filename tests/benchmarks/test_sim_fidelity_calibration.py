"""Pure parts of the simulator fidelity benchmark (`benchmarks.sim_fidelity`): choosing and pooling
calibration runs, the context features in and out of the fit, the CPU-time step bias."""

from __future__ import annotations

import math

import pytest

from benchmarks import sim_fidelity
from workers.sim import BatchStats, bundled_model, step_sample


def _samples(num: int, slowdown: float = 1.0) -> list[dict[str, float]]:
    """Steps of a model whose decode context matters; CPU time = model, wall = x slowdown."""
    truth = bundled_model("llama-2-7b-a30")
    samples = []
    for i in range(num):
        decodes = 1 + i % 40
        context = decodes * (100 + 37 * (i % 50))
        stats = BatchStats(num_prefill_tokens=(i % 3) * 100, num_decode_seqs=decodes,
                           num_prefill_seqs=1 if i % 3 else 0, decode_context_tokens=context,
                           prefill_chunk_x_context=(i % 3) * 100 * 50,
                           prefill_chunk_sq=((i % 3) * 100) ** 2)
        row = step_sample(stats, truth.step_ms(stats) * slowdown)
        row["cpu_ms"] = truth.step_ms(stats)
        samples.append(row)
    return samples


def test_calibration_runs_are_chosen_by_rate_and_pooled() -> None:
    bench = sim_fidelity
    runs = [bench.Run("calibration 24 req/s", 24.0, [], _samples(100), 1.0),
            bench.Run("calibration 8 req/s", 8.0, [], _samples(50), 1.0),
            bench.Run("8 req/s", 8.0, [], _samples(10), 1.0)]
    chosen, evaluated = bench.split_calibration(runs, [8.0])
    assert [r.label for r in chosen] == ["calibration 8 req/s"]
    assert [r.label for r in evaluated] == ["8 req/s"]  # never a calibration run
    chosen, _ = bench.split_calibration(runs, [24.0, 8.0])
    assert bench.fit_calibration(chosen).metrics["num_train"] + \
        bench.fit_calibration(chosen).metrics["num_holdout"] == 150
    with pytest.raises(SystemExit):
        bench.split_calibration(runs, [32.0])


def test_the_fit_uses_the_context_features_unless_told_not_to() -> None:
    bench = sim_fidelity
    run = bench.Run("calibration", 24.0, [], _samples(300), 1.0)
    with_context = bench.fit_calibration([run])
    without = bench.fit_calibration([bench.without_context(run)])
    assert with_context.coefficients_ms["decode_context_tokens"] > 0
    assert without.coefficients_ms["decode_context_tokens"] == 0
    assert with_context.metrics["mape_holdout"] < without.metrics["mape_holdout"] / 3


def test_the_cpu_step_bias_sees_through_a_stalled_machine() -> None:
    bench = sim_fidelity
    calibration = bench.Run("calibration", 24.0, [], _samples(300), 1.0)
    cpu_model = bench.fit_calibration_cpu([calibration])
    stalled = _samples(100, slowdown=1.5)  # wall time 50 % longer, the same CPU work
    assert abs(bench.cpu_bias(cpu_model, stalled)) < 0.01
    wall_model = bench.fit_calibration([calibration])
    wall = sum(wall_model.step_ms(bench.batch_stats(s)) for s in stalled)
    assert wall / sum(s["duration_ms"] for s in stalled) - 1 == pytest.approx(-1 / 3, abs=0.01)
    assert math.isnan(bench.cpu_bias(None, stalled))
    assert math.isnan(bench.cpu_bias(cpu_model, [{**s, "cpu_ms": 0} for s in stalled]))

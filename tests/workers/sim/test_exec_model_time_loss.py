"""`fit_from_step_samples(loss="time")`: modelled step times add up to the measured ones
(what latencies are made of), and stalls of the machine do not drag the fit up."""

from __future__ import annotations

import numpy as np
import pytest

from workers.sim import BatchStats, ExecModel, bundled_model, fit_from_step_samples, step_sample
from workers.sim.exec_model import STALL_FACTOR


def evaluate_stats(sample: dict) -> BatchStats:
    return BatchStats(num_prefill_tokens=sample["num_prefill_tokens"],
                      num_decode_seqs=sample["num_decode_tokens"],
                      num_prefill_seqs=sample["num_seqs"] - sample["num_decode_tokens"],
                      decode_context_tokens=sample["decode_context_tokens"])


def _steps(num: int, stall_share: float, seed: int = 0) -> tuple[list[dict], np.ndarray]:
    """Steps with skewed noise (log-normal, sigma 0.3, mean 1) and some stalls (x 10)."""
    truth = bundled_model("llama-2-7b-a30")
    rng = np.random.default_rng(seed)
    samples, stalled = [], []
    for _ in range(num):
        decodes = int(rng.integers(1, 48))
        prefill = int(rng.integers(0, 400)) if rng.random() < 0.5 else 0
        stats = BatchStats(num_prefill_tokens=prefill, num_decode_seqs=decodes,
                           num_prefill_seqs=1 if prefill else 0,
                           decode_context_tokens=decodes * int(rng.integers(50, 2000)))
        stall = rng.random() < stall_share
        noise = rng.lognormal(-0.045, 0.3) * (10.0 if stall else 1.0)
        samples.append(step_sample(stats, truth.step_ms(stats) * noise))
        stalled.append(stall)
    return samples, np.array(stalled)


def _sum_bias(samples: list[dict], model: ExecModel) -> float:
    """Modelled over measured time of all the steps, minus 1."""
    modelled = sum(model.step_ms(evaluate_stats(s)) for s in samples)
    return modelled / sum(s["duration_ms"] for s in samples) - 1.0


def test_the_relative_fit_runs_short_and_the_time_fit_adds_up() -> None:
    samples, _ = _steps(3000, stall_share=0.0)
    relative = fit_from_step_samples(samples, loss="relative")
    time_fit = fit_from_step_samples(samples, loss="time")
    assert _sum_bias(samples, relative) < -0.03
    assert abs(_sum_bias(samples, time_fit)) < 0.01


def test_stalls_are_left_out_of_the_time_fit() -> None:
    samples, stalled = _steps(3000, stall_share=0.05, seed=1)
    time_fit = fit_from_step_samples(samples, loss="time")
    clean = [s for s, bad in zip(samples, stalled, strict=True) if not bad]
    assert abs(_sum_bias(clean, time_fit)) < 0.02  # priced as the machine runs unstalled
    assert STALL_FACTOR == 3.0


def test_an_unknown_loss_is_refused() -> None:
    samples, _ = _steps(20, stall_share=0.0)
    with pytest.raises(ValueError):
        fit_from_step_samples(samples, loss="absolute")

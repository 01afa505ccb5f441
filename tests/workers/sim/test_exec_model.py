"""The execution-time model: prediction, closed-form sums, persistence, fitting."""

from __future__ import annotations

import random

import numpy as np
import pytest

from workers.sim import (
    BatchStats,
    ExecModel,
    bundled_model,
    bundled_model_names,
    fit_from_step_samples,
    step_sample,
)

from .cases import TOY_COEFFICIENTS


def test_step_time_is_the_linear_form(toy_model: ExecModel) -> None:
    stats = BatchStats(num_prefill_tokens=100, num_decode_seqs=10, num_prefill_seqs=2,
                       decode_context_tokens=5000, prefill_chunk_x_context=3000,
                       prefill_chunk_sq=5000)
    c = TOY_COEFFICIENTS
    expected = (c["const"] + c["num_tokens"] * 110 + c["num_tokens_over_64"] * 46
                + c["num_decode_seqs"] * 10 + c["num_prefill_seqs"] * 2
                + c["decode_context_tokens"] * 5000 + c["prefill_chunk_x_context"] * 3000
                + c["prefill_chunk_sq"] * 5000)
    assert toy_model.step_ms(stats) == pytest.approx(expected)
    assert toy_model.step_ms(BatchStats()) == 0.0


def test_decode_steps_sum_in_closed_form(toy_model: ExecModel) -> None:
    for num_decodes, context, num_steps in [(1, 10, 1), (7, 900, 13), (48, 40_000, 250)]:
        steps = [BatchStats(num_decode_seqs=num_decodes,
                            decode_context_tokens=context + num_decodes * j)
                 for j in range(num_steps)]
        stepwise = sum(toy_model.step_ms(stats) for stats in steps)
        assert toy_model.sum_decode_steps_ms(num_decodes, context, num_steps) == pytest.approx(
            stepwise, rel=1e-12)


def test_chunk_contributions_classify_decodes_and_prefills() -> None:
    assert BatchStats.of_chunk(1, 99, 100) == BatchStats(num_decode_seqs=1,
                                                          decode_context_tokens=100)
    assert BatchStats.of_chunk(32, 64, 200) == BatchStats(32, 0, 1, 0, 32 * 64, 32 * 32)
    total = BatchStats.of_chunk(1, 99, 100) + BatchStats.of_chunk(32, 64, 200)
    assert total - BatchStats.of_chunk(1, 99, 100) == BatchStats.of_chunk(32, 64, 200)
    assert total.num_tokens == 33 and total.num_seqs == 2
    chunks = [(1, 99, 100), (32, 64, 200), (1, 0, 1), (1, 5, 10)]
    assert BatchStats.of_chunks(chunks) == sum(
        (BatchStats.of_chunk(*chunk) for chunk in chunks), BatchStats())
    assert BatchStats.of_chunks([]) == BatchStats()


def test_save_load_round_trip(tmp_path, toy_model: ExecModel) -> None:
    fitted = ExecModel(toy_model.name, toy_model.token_knots, toy_model.coefficients_ms,
                       metrics={"r2_holdout": 0.99, "mape_holdout": 0.03}, source="unit test")
    path = tmp_path / "model.json"
    fitted.save(path)
    loaded = ExecModel.load(path)
    assert loaded == fitted
    stats = BatchStats(300, 20, 1, 9000, 100, 90_000)
    assert loaded.step_ms(stats) == fitted.step_ms(stats)


def test_loading_rejects_foreign_files() -> None:
    with pytest.raises(ValueError, match="format"):
        ExecModel.from_dict({"format": "something-else"})
    with pytest.raises(ValueError, match="unknown features"):
        ExecModel("x", (), {"num_gpus": 1.0})


def synthetic_samples(coefficients: dict[str, float], knots: tuple[int, ...], count: int,
                      noise: float, seed: int) -> list[dict[str, float]]:
    model = ExecModel("truth", knots, coefficients)
    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        num_decode = rng.randint(0, 48)
        num_prefill_seqs = rng.randint(0, 2) if num_decode else rng.randint(1, 2)
        chunks = [rng.randint(1, 512) for _ in range(num_prefill_seqs)]
        cached = [rng.randint(0, 3000) for _ in chunks]
        stats = BatchStats(sum(chunks), num_decode, num_prefill_seqs,
                           sum(rng.randint(10, 4000) for _ in range(num_decode)),
                           sum(c * k for c, k in zip(chunks, cached)),
                           sum(c * c for c in chunks))
        samples.append(step_sample(stats, model.step_ms(stats) * (1 + rng.gauss(0, noise))))
    return samples


TRUE_COEFFICIENTS = {
    "const": 12.0, "num_tokens": 0.01, "num_tokens_over_128": 0.08, "num_tokens_over_512": 0.02,
    "num_decode_seqs": 0.05, "num_prefill_seqs": 0.9, "decode_context_tokens": 8e-5,
    "prefill_chunk_x_context": 8e-6, "prefill_chunk_sq": 6e-6,
}


def test_fit_recovers_known_coefficients_exactly_without_noise() -> None:
    samples = synthetic_samples(TRUE_COEFFICIENTS, (128, 512), 400, noise=0.0, seed=1)
    model = fit_from_step_samples(samples, token_knots=(128, 512))
    for name, value in TRUE_COEFFICIENTS.items():
        assert model.coefficients_ms[name] == pytest.approx(value, rel=1e-6), name
    assert model.metrics["r2_holdout"] == pytest.approx(1.0)
    assert model.metrics["mape_holdout"] < 1e-9
    assert model.metrics["num_holdout"] == 80


def test_fit_tolerates_measurement_noise() -> None:
    samples = synthetic_samples(TRUE_COEFFICIENTS, (128, 512), 3000, noise=0.02, seed=2)
    model = fit_from_step_samples(samples, token_knots=(128, 512))
    assert model.metrics["mape_holdout"] < 0.025
    assert model.metrics["r2_holdout"] > 0.99
    for name in ("const", "num_tokens_over_128", "decode_context_tokens"):
        assert model.coefficients_ms[name] == pytest.approx(TRUE_COEFFICIENTS[name], rel=0.05)
    # Against the noise-free truth the fit is far better than the 2% noise.
    truth = ExecModel("truth", (128, 512), TRUE_COEFFICIENTS)
    fresh = _batches(synthetic_samples(TRUE_COEFFICIENTS, (128, 512), 500, noise=0.0, seed=4))
    errors = [abs(model.step_ms(b) / truth.step_ms(b) - 1) for b in fresh]
    assert np.mean(errors) < 0.005


def _batches(samples: list[dict[str, float]]) -> list[BatchStats]:
    return [BatchStats(int(s["num_prefill_tokens"]), int(s["num_decode_tokens"]),
                       int(s["num_seqs"] - s["num_decode_tokens"]),
                       int(s["decode_context_tokens"]), int(s["prefill_chunk_x_context"]),
                       int(s["prefill_chunk_sq"])) for s in samples]


def test_fit_without_context_keys_leaves_those_terms_out() -> None:
    samples = synthetic_samples(TRUE_COEFFICIENTS, (128, 512), 200, noise=0.0, seed=3)
    coarse = [{k: s[k] for k in ("duration_ms", "num_seqs", "num_prefill_tokens",
                                 "num_decode_tokens")} for s in samples]
    model = fit_from_step_samples(coarse)
    for name in ("decode_context_tokens", "prefill_chunk_x_context", "prefill_chunk_sq"):
        assert model.coefficients_ms[name] == 0.0
    assert np.isfinite(model.metrics["r2_train"])
    with pytest.raises(ValueError, match="no step samples"):
        fit_from_step_samples([])


def test_bundled_models_load_and_price_a30_steps_plausibly() -> None:
    assert {"qwen2-7b-a30", "llama-2-7b-a30"} <= set(bundled_model_names())
    qwen = bundled_model("qwen2-7b-a30")
    assert qwen.metrics["step_mape_holdout"] < 0.05
    decode_48 = qwen.step_ms(BatchStats(num_decode_seqs=48, decode_context_tokens=48 * 600))
    prefill_512 = qwen.step_ms(BatchStats(512, 0, 1, 0, 0, 512 * 512))
    assert 15 < decode_48 < 40 and 40 < prefill_512 < 120
    llama = bundled_model("llama-2-7b-a30")
    assert llama.step_ms(BatchStats(num_decode_seqs=48, decode_context_tokens=48 * 600)) > decode_48
    with pytest.raises(ValueError, match="known"):
        bundled_model("gpt-5")

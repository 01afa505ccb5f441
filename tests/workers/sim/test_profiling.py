"""Fitting execution-time models from Vidur-format profiling CSVs."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from workers.sim import AttentionScale, BatchStats, fit_from_vidur_profile
from workers.sim.profiling import LAYER_OPS, clean_series, gpu_time_ratios, load_token_profile

DATA_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "data"
QWEN_A30 = DATA_DIR / "profiling/vidur_opt_scheduler/compute/a30/Qwen/Qwen-2-7B"


def test_clean_series_fills_gaps_and_broken_measurements() -> None:
    x = np.arange(1.0, 21.0)
    y = 0.1 * x + 1.0
    broken = y.copy()
    broken[[3, 11]] = np.nan
    broken[7] = 0.002  # a failed GEMM timing
    broken[15] = 40.0
    assert np.allclose(clean_series(x, broken), y)


# Ground truth of the synthetic profile, ms per layer.
def token_op_ms(num_tokens: float) -> float:
    return 0.5 + 0.004 * max(num_tokens - 64, 0)


def decode_ms(batch: float, kv: float) -> float:
    return 0.02 + 1e-4 * batch + 2e-6 * batch * kv


def prefill_ms(chunk: float, kv: float) -> float:
    return 0.05 + 2e-7 * chunk * kv + 2e-7 * chunk * chunk


def write_synthetic_profile(directory: Path) -> tuple[Path, Path]:
    mlp, attention = directory / "mlp.csv", directory / "attention.csv"
    ops = [f"time_stats.{op}.median" for op in (*LAYER_OPS, "emb")]
    with open(mlp, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*ops, "num_tokens", "num_tensor_parallel_workers"])
        for n in [1, 2, 4, 8, *range(16, 4097, 16)]:
            # The whole per-layer time sits in one op; the others are zero but for
            # an occasional missing cell, as in the real files.
            row = [token_op_ms(n) if op.endswith("mlp_up_proj.median") else 0.0 for op in ops]
            row[ops.index("time_stats.attn_post_proj.median")] = "" if n % 96 == 0 else 0.0
            writer.writerow([*row, n, 1])
    columns = ["time_stats.attn_prefill.median", "time_stats.attn_decode.median",
               "time_stats.attn_kv_cache_save.median", "batch_size", "prefill_chunk_size",
               "kv_cache_size", "is_prefill", "num_tensor_parallel_workers"]
    with open(attention, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for batch in range(1, 49):
            for kv in range(32, 4033, 256):
                writer.writerow([0.0, decode_ms(batch, kv), 0.0, batch, 0, kv, False, 1])
        for chunk in range(32, 2049, 64):
            for kv in range(0, 4033, 512):
                writer.writerow([prefill_ms(chunk, kv), 0.0, 0.0, 1, chunk, kv, True, 1])
    return mlp, attention


def test_fit_composes_layers_into_step_times(tmp_path: Path) -> None:
    mlp, attention = write_synthetic_profile(tmp_path)
    model = fit_from_vidur_profile(mlp, attention, num_layers=10, name="synthetic",
                                   token_knots=(64,))
    for decodes, kv, chunk, cached in [(48, 600, 0, 0), (1, 100, 0, 0), (20, 1500, 300, 800),
                                       (0, 0, 512, 0), (30, 200, 2000, 2000)]:
        stats = BatchStats(chunk, decodes, int(chunk > 0), decodes * kv, chunk * cached,
                           chunk * chunk)
        truth = 10 * (token_op_ms(stats.num_tokens) + (decode_ms(decodes, kv) if decodes else 0)
                      + (prefill_ms(chunk, cached) if chunk else 0))
        # Decode attention's fixed cost is charged to every step, prefill-only ones too.
        assert model.step_ms(stats) == pytest.approx(truth, rel=0.01, abs=0.25)
    assert model.metrics["step_mape_holdout"] < 0.01
    assert model.metrics["token_part_r2_holdout"] > 0.999


def test_borrowed_attention_is_scaled_and_not_self_checked(tmp_path: Path) -> None:
    mlp, attention = write_synthetic_profile(tmp_path)
    own = fit_from_vidur_profile(mlp, attention, num_layers=10, name="own")
    borrowed = fit_from_vidur_profile(mlp, attention, num_layers=10, name="borrowed",
                                      attention_scale=AttentionScale(kv=8, prefill=2))
    assert borrowed.coefficients_ms["decode_context_tokens"] == pytest.approx(
        8 * own.coefficients_ms["decode_context_tokens"])
    assert borrowed.coefficients_ms["prefill_chunk_sq"] == pytest.approx(
        2 * own.coefficients_ms["prefill_chunk_sq"])
    assert "step_mape_holdout" not in borrowed.metrics
    assert "decode_attention_mape_holdout" not in borrowed.metrics


@pytest.mark.skipif(not QWEN_A30.is_dir(), reason="shared profiling data not present")
def test_a30_qwen2_profile_fits_held_out_steps_within_five_percent() -> None:
    model = fit_from_vidur_profile(QWEN_A30 / "mlp.csv", QWEN_A30 / "attention.csv",
                                   num_layers=28, name="qwen2-7b-a30")
    assert model.metrics["step_mape_holdout"] < 0.05
    assert model.metrics["step_r2_holdout"] > 0.99


def test_another_gpu_scales_decode_by_memory_time_and_prefill_by_compute_time(
        tmp_path: Path) -> None:
    mlp, attention = write_synthetic_profile(tmp_path)
    own = fit_from_vidur_profile(mlp, attention, num_layers=10, name="own")
    moved = fit_from_vidur_profile(mlp, attention, num_layers=10, name="moved",
                                   attention_scale=AttentionScale(memory=0.5, compute=0.25))
    for name in ("decode_context_tokens", "num_decode_seqs"):
        assert moved.coefficients_ms[name] == pytest.approx(0.5 * own.coefficients_ms[name])
    for name in ("prefill_chunk_sq", "prefill_chunk_x_context", "num_prefill_seqs"):
        assert moved.coefficients_ms[name] == pytest.approx(0.25 * own.coefficients_ms[name])


def write_token_profile(path: Path, layer_ms: Callable[[float], float]) -> Path:
    ops = [f"time_stats.{op}.median" for op in (*LAYER_OPS, "emb")]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*ops, "num_tokens", "num_tensor_parallel_workers"])
        for n in [1, 2, 4, 8, *range(16, 4097, 16)]:
            row = [layer_ms(n) if op.endswith("mlp_up_proj.median") else 0.0 for op in ops]
            writer.writerow([*row, n, 1])
    return path


def test_gpu_time_ratios_read_the_memory_and_compute_bound_regimes(tmp_path: Path) -> None:
    # Flat (weights read once) up to 256 tokens, then linear (compute-bound).
    def slow(n: float) -> float:
        return max(1.0, n / 256)

    def fast(n: float) -> float:  # 2x the bandwidth, 5x the compute
        return max(0.5, n / 1280)

    reference = load_token_profile(write_token_profile(tmp_path / "slow.csv", slow))
    target = load_token_profile(write_token_profile(tmp_path / "fast.csv", fast))
    memory, compute = gpu_time_ratios(reference, target)
    assert memory == pytest.approx(0.5)
    assert compute == pytest.approx(0.2)

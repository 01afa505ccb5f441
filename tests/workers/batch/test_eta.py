"""The batch completion estimate's simulation (pure): the sums of the lines' lengths decide it,
the interactive load slows it, a large batch is sampled and scaled, a batch alone finds the
fleet's saturated rate."""

from __future__ import annotations

import pytest

from workers.batch.eta import (
    CALIBRATION_BOUND,
    EtaConfig,
    EtaInstance,
    EtaLine,
    InteractiveLoad,
    calibrated,
    estimate,
    expected_tokens,
    length_calibration,
    replay,
    saturated_lines_per_s,
)
from workers.sim import InstanceConfig, bundled_model

CONFIG = InstanceConfig(num_total_blocks=7289, block_size=16, max_num_seqs=48,
                        max_num_batched_tokens=512, max_model_len=4096)
FLEET = [EtaInstance(CONFIG, bundled_model("qwen2-7b-a30"))] * 3
WINDOW = EtaConfig(max_in_flight=96)


def _lines(n: int, output: int, prompt: int = 120) -> list[EtaLine]:
    return [EtaLine(prompt + i % 7, output + i % 5) for i in range(n)]


def test_long_answers_take_far_longer_than_short_ones_with_the_same_line_count() -> None:
    short = estimate(_lines(600, 5), FLEET, config=WINDOW)
    essays = estimate(_lines(600, 500), FLEET, config=WINDOW)
    assert short.num_lines == essays.num_lines == 600
    assert essays.seconds > 10 * short.seconds > 0


def test_interactive_load_slows_the_batch_it_yields_to() -> None:
    lines = _lines(600, 200)
    alone = estimate(lines, FLEET, config=WINDOW)
    shared = estimate(lines, FLEET, InteractiveLoad(6.0, ((300, 250), (80, 40))), WINDOW)
    assert shared.seconds > alone.seconds * 1.05


def test_a_large_batch_is_sampled_and_its_duration_scaled() -> None:
    lines = _lines(1200, 150)
    full = estimate(lines, FLEET, config=EtaConfig(max_in_flight=96, max_lines=1200))
    sampled = estimate(lines, FLEET, config=EtaConfig(max_in_flight=96, max_lines=400))
    assert sampled.simulated_lines == 400 and full.simulated_lines == 1200
    assert sampled.num_lines == 1200
    assert sampled.seconds == pytest.approx(full.seconds, rel=0.15)


def test_a_caller_drawn_sample_stands_for_the_whole_batch() -> None:
    lines = _lines(300, 150)
    part = estimate(lines, FLEET, config=WINDOW, num_lines=900)
    assert part.num_lines == 900
    assert part.seconds == pytest.approx(3 * estimate(lines, FLEET, config=WINDOW).seconds)


def test_a_batch_alone_runs_at_the_fleets_saturated_rate() -> None:
    lines = _lines(600, 200)
    rate = saturated_lines_per_s(lines, FLEET, WINDOW)
    one = saturated_lines_per_s(lines, FLEET[:1], WINDOW)
    assert rate == pytest.approx(estimate(lines, FLEET, config=WINDOW).lines_per_s)
    assert 2.0 * one < rate  # three instances carry well over twice one's


def test_nothing_left_is_done_now_and_a_run_past_the_cap_says_so() -> None:
    assert estimate([], FLEET).seconds == 0.0
    capped = estimate(_lines(300, 2000), FLEET, config=EtaConfig(max_sim_s=5.0))
    assert capped.capped and capped.seconds >= 5.0
    with pytest.raises(ValueError, match="no instance"):
        estimate(_lines(3, 3), [])
    with pytest.raises(ValueError, match="interactive rate"):
        InteractiveLoad(2.0, ())


def test_a_replay_keeps_the_state_at_a_quarter_of_its_lines() -> None:
    lines = _lines(400, 120)
    truth, quarter = replay(lines, FLEET, config=WINDOW, checkpoint=0.25)
    assert 0 < quarter.at_s < truth.seconds
    assert len(quarter.unfinished) == 300  # a quarter finished, every other line still to run
    indices = [index for index, _ in quarter.unfinished]
    assert len(set(indices)) == 300 and all(0 <= i < 400 for i in indices)
    assert any(made > 0 for _, made in quarter.unfinished)  # some were running then
    noisy, _ = replay(lines, FLEET, config=EtaConfig(max_in_flight=96, step_noise=0.2))
    assert noisy.seconds != truth.seconds
    assert noisy.seconds == pytest.approx(truth.seconds, rel=0.2)


def test_a_lines_expected_length_sits_above_its_median_as_its_spread_grows() -> None:
    assert expected_tokens(100, None, 4096) == 100  # no spread known: the median
    assert expected_tokens(100, 100, 4096) == 100
    narrow, wide = expected_tokens(100, 150, 4096), expected_tokens(100, 400, 4096)
    assert 100 < narrow < wide
    assert expected_tokens(100, 400, 120) == 120  # never past the line's max_tokens


def test_a_running_line_past_its_median_is_expected_to_run_longer() -> None:
    fresh = expected_tokens(100, 300, 4096)
    assert expected_tokens(100, 300, 4096, made=10) >= fresh  # barely started: about the same
    past = expected_tokens(100, 300, 4096, made=400)
    assert past > 400 + (fresh - 100)  # its tail: more than the median less what it made
    assert expected_tokens(100, 300, 450, made=400) == 450  # still within its max_tokens
    assert expected_tokens(100, None, 4096, made=150) == 151  # no spread: just past it


def test_a_batchs_calibration_reads_its_finished_prefix_only() -> None:
    predicted = [100.0] * 60
    # The first 30 lines ran at 80 % of their predictions; line 30 still runs; the short ones
    # that finished after it (as short answers do) are not read.
    actual: list[int | None] = [80] * 30 + [None] + [10] * 29
    assert length_calibration(predicted, actual) == pytest.approx(0.8)
    # Too few finished lines in front: no correction.
    assert length_calibration(predicted, [80] * 19 + [None] * 41) == 1.0
    # Bounded either way.
    assert length_calibration(predicted, [1000] * 60) == CALIBRATION_BOUND
    assert length_calibration(predicted, [1] * 60) == 1 / CALIBRATION_BOUND
    assert calibrated(200, 400, 0.5) == (100, 200) and calibrated(1, None, 0.1) == (1, None)


def test_no_release_interval_releases_the_moment_a_seat_frees_as_before() -> None:
    lines = _lines(400, 60)
    instant = EtaConfig(max_in_flight=96, release_interval_s=0.0)
    assert estimate(lines, FLEET, config=instant) == estimate(lines, FLEET, config=WINDOW)
    truth, quarter = replay(lines, FLEET, config=instant)
    assert (truth, quarter) == replay(lines, FLEET, config=WINDOW)


def test_seats_freed_between_the_releasers_rounds_idle_until_the_next_one() -> None:
    """The live case: the batch's window is exactly its pool's seats, so every line that
    finishes leaves a seat empty until the next round."""
    lines = _lines(480, 20)
    instant = estimate(lines, FLEET, config=EtaConfig(max_in_flight=144))
    rounds = {interval: estimate(lines, FLEET, config=EtaConfig(
        max_in_flight=144, release_interval_s=interval)).seconds
        for interval in (1e-9, 0.1, 0.5, 1.0, 2.0)}
    assert all(seconds >= instant.seconds for seconds in rounds.values())  # never sooner
    assert rounds[1.0] > 1.15 * instant.seconds and rounds[2.0] > rounds[0.5]
    # Rounds only where a seat is free: a tiny interval is not simulated round by round.
    assert rounds[1e-9] == pytest.approx(instant.seconds, rel=0.05)
    assert saturated_lines_per_s(lines, FLEET, EtaConfig(
        max_in_flight=144, release_interval_s=1.0)) < instant.lines_per_s


def test_a_released_line_takes_its_seat_only_after_the_pipelines_delay() -> None:
    """One slot and lines of known length: each line holds its slot from its release but
    reaches the engine `dispatch_delay_s` later, so the slot idles that long per line; lines
    on their way count as unfinished at a checkpoint."""
    lines = [EtaLine(100, 8)] * 5
    one = estimate(lines[:1], FLEET[:1], config=EtaConfig(max_in_flight=1)).seconds
    delayed = EtaConfig(max_in_flight=1, dispatch_delay_s=0.3)
    assert estimate(lines, FLEET[:1], config=delayed).seconds == pytest.approx(5 * (0.3 + one))
    assert estimate(lines, FLEET[:1], config=EtaConfig(
        max_in_flight=1, dispatch_delay_s=0.0)).seconds == pytest.approx(5 * one)
    _, quarter = replay(lines, FLEET[:1], config=delayed, checkpoint=0.4)
    assert quarter.at_s == pytest.approx(2 * (0.3 + one))
    assert quarter.unfinished == ((2, 0), (3, 0), (4, 0))  # line 2 released, on its way
    wide = EtaConfig(max_in_flight=64, dispatch_delay_s=0.3)
    assert estimate(_lines(480, 20), FLEET, config=wide).seconds > estimate(
        _lines(480, 20), FLEET, config=EtaConfig(max_in_flight=64)).seconds


def test_lines_are_released_only_at_the_releasers_rounds() -> None:
    """One seat and lines shorter than a round: line k starts at round k, so the batch ends a
    line's duration after its last round."""
    lines = [EtaLine(100, 8)] * 5
    one = estimate(lines[:1], FLEET[:1], config=EtaConfig(max_in_flight=1)).seconds
    assert 0 < one < 0.5
    back_to_back = estimate(lines, FLEET[:1], config=EtaConfig(max_in_flight=1))
    assert back_to_back.seconds == pytest.approx(5 * one)
    rounds = EtaConfig(max_in_flight=1, release_interval_s=0.5)
    assert estimate(lines, FLEET[:1], config=rounds).seconds == pytest.approx(4 * 0.5 + one)
    truth, quarter = replay(lines, FLEET[:1], config=rounds, checkpoint=0.4)
    assert truth.seconds == pytest.approx(2.0 + one)
    # Two lines done, at 0.5 + one: the third waits for the round at 1.0, unreleased.
    assert quarter.at_s == pytest.approx(0.5 + one)
    assert quarter.unfinished == ((2, 0), (3, 0), (4, 0))

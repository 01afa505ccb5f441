"""The batch window's AIMD step (pure)."""

from __future__ import annotations

import pytest

from workers.batch.headroom import (
    HeadroomConfig,
    HeadroomSignal,
    harmed,
    interactive_reserve,
    next_window,
    slot_bound,
)

CONFIG = HeadroomConfig(target_ttft_s=1.0, min_window=4, max_window=64, increase=4.0,
                        decrease=0.5, queue_slack=2)


def signal(ttft: float | None = 0.5, waiting: int = 0, previous: int = 0) -> HeadroomSignal:
    return HeadroomSignal(ttft_p99_s=ttft, num_waiting=waiting, previous_num_waiting=previous)


def test_the_window_grows_additively_while_interactive_traffic_meets_its_target() -> None:
    window = 4.0
    for _ in range(5):
        window = next_window(window, signal(ttft=0.9), CONFIG)
    assert window == 24.0
    # No interactive request finished lately: no sign of harm either.
    assert next_window(24.0, signal(ttft=None), CONFIG) == 28.0


def test_the_window_halves_on_a_missed_target_and_never_leaves_its_bounds() -> None:
    assert next_window(40.0, signal(ttft=1.5), CONFIG) == 20.0
    assert next_window(6.0, signal(ttft=1.5), CONFIG) == 4.0  # min_window
    assert next_window(62.0, signal(), CONFIG) == 64.0  # max_window


@pytest.mark.parametrize(("waiting", "previous", "harm"), [
    (3, 2, True),    # a queue past the slack that grew
    (3, 3, False),   # past the slack, but not growing
    (2, 0, False),   # growing, within the slack
    (10, 12, False),  # draining
])
def test_a_growing_engine_queue_is_harm_before_the_target_is_missed(
        waiting: int, previous: int, harm: bool) -> None:
    assert harmed(signal(ttft=0.2, waiting=waiting, previous=previous), CONFIG) is harm


def test_after_a_miss_the_window_climbs_back_linearly() -> None:
    window = next_window(64.0, signal(ttft=2.0), CONFIG)
    assert window == 32.0
    assert [window := next_window(window, signal(), CONFIG) for _ in range(3)] == [36, 40, 44]


def test_the_slot_bound_keeps_expected_interactive_concurrency_and_its_bursts() -> None:
    assert interactive_reserve(0.0, 2.0) == 0
    assert interactive_reserve(4.0, 2.0) == 8  # 4 + 2 x sqrt(4)
    assert interactive_reserve(4.0, 0.0) == 4  # Little's law alone
    assert interactive_reserve(0.2, 2.0) == 2  # ceil(0.2 + 0.89): a burst of one finds a slot
    assert slot_bound(192, 56.0, 2.0) == 192 - 71
    assert slot_bound(32, 30.0, 2.0) == 0  # never negative

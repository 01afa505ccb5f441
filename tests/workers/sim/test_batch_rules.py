"""The engines' batch rules, one home for the simulator, the what-if and vLLM's scheduler."""

from __future__ import annotations

from dataclasses import dataclass

from workers.sim.batch_rules import (
    PRIORITY_CLASS_SPAN_MS,
    has_seat,
    is_late_batch_prefill,
    put_batch_prefills_last,
    seat_to_yield,
)

BATCH = PRIORITY_CLASS_SPAN_MS


@dataclass(eq=False)
class Req:
    name: str
    priority: int
    arrival: float = 0.0
    late: bool = False


def _names(requests: list[Req]) -> list[str]:
    return [r.name for r in requests]


def test_a_late_batch_prefill_is_a_batch_request_with_more_than_one_token_left() -> None:
    assert is_late_batch_prefill(BATCH + 5, num_tokens=100, num_computed_tokens=10)
    assert not is_late_batch_prefill(BATCH + 5, num_tokens=100, num_computed_tokens=99)  # decode
    assert not is_late_batch_prefill(5, num_tokens=100, num_computed_tokens=10)  # interactive


def test_batch_prefills_go_last_in_order_and_sit_out_one_step_while_interactive_waits() -> None:
    running = [Req("b1", BATCH, late=True), Req("i1", 1), Req("b2", BATCH + 1, late=True),
               Req("i2", 2)]
    aside, sat_out = put_batch_prefills_last(running, lambda r: r.late, interactive_waits=True,
                                             sat_out_last_step=False)
    assert (_names(running), _names(aside), sat_out) == (["i1", "i2"], ["b1", "b2"], True)
    # Never two steps in a row: they come back, last, order kept.
    running += aside
    aside, sat_out = put_batch_prefills_last(running, lambda r: r.late, interactive_waits=True,
                                             sat_out_last_step=True)
    assert (_names(running), aside, sat_out) == (["i1", "i2", "b1", "b2"], [], False)
    # Nothing late: nothing moves, and the next step may sit out again.
    plain = [Req("i1", 1), Req("i2", 2)]
    assert put_batch_prefills_last(plain, lambda r: r.late, True, True) == ([], False)
    assert _names(plain) == ["i1", "i2"]


def test_without_an_interactive_request_waiting_batch_prefills_only_move_last() -> None:
    running = [Req("b1", BATCH, late=True), Req("i1", 1)]
    assert put_batch_prefills_last(running, lambda r: r.late, False, False) == ([], False)
    assert _names(running) == ["i1", "b1"]


def test_the_seat_goes_from_the_largest_batch_priority_first_among_equals() -> None:
    def key(r: Req) -> tuple[int, float]:
        return r.priority, r.arrival

    running = [Req("i1", 1), Req("b1", BATCH + 7), Req("b2", BATCH + 9), Req("b3", BATCH + 9)]
    victim = seat_to_yield(running, 0, 4, True, key)
    assert victim is running[2]  # b2 and b3 tie: the first in the running list
    # A later arrival breaks the priority tie where the caller knows arrivals (vLLM).
    running[3].arrival = 1.0
    assert seat_to_yield(running, 0, 4, True, key) is running[3]
    # Seats free (counting those sitting out), no interactive waiting, or no batch: none.
    assert seat_to_yield(running, 0, 5, True, key) is None
    assert seat_to_yield(running[:3], 1, 4, True, key) is running[2]
    assert seat_to_yield(running, 0, 4, False, key) is None
    assert seat_to_yield([Req("i1", 1), Req("i2", 2)], 0, 2, True, key) is None


def test_batch_requests_keep_off_the_interactive_seats() -> None:
    assert has_seat(5, 8, 3, priority=BATCH) is False
    assert has_seat(4, 8, 3, priority=BATCH) is True
    assert has_seat(7, 8, 3, priority=1) is True
    assert has_seat(8, 8, 3, priority=1) is False
    assert has_seat(7, 8, 0, priority=BATCH) is True

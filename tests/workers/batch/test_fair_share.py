"""The fair-share allocation of batch slots (pure)."""

from __future__ import annotations

from workers.batch.fair_share import Flow, allocate, pool_share


def flow(batch_id: str, team_id: str, *, share: int = 1, in_flight: int = 0,
         pending: int = 1000, deadline: float = 0.0, model: str = "") -> Flow:
    return Flow(batch_id, team_id, share, in_flight, pending, deadline, model)


def test_a_team_alone_gets_every_free_slot_up_to_its_pending_lines() -> None:
    assert allocate([flow("b1", "t1")], 8) == {"b1": 8}
    assert allocate([flow("b1", "t1", pending=3)], 8) == {"b1": 3}
    assert allocate([flow("b1", "t1")], 0) == {}
    assert allocate([flow("b1", "t1")], -2) == {}  # over the limit already


def test_free_slots_go_by_share() -> None:
    grants = allocate([flow("a", "big", share=3), flow("b", "small", share=1)], 8)
    assert grants == {"a": 6, "b": 2}


def test_a_team_over_its_share_waits_until_the_other_catches_up() -> None:
    flows = [flow("a", "early", in_flight=8), flow("b", "late")]
    assert allocate(flows, 0) == {}
    assert allocate(flows, 1) == {"b": 1}  # a slot freed by "early" goes to "late"
    assert allocate([flow("a", "early", in_flight=5), flow("b", "late", in_flight=3)],
                    2) == {"b": 2}


def test_unused_share_goes_to_the_others() -> None:
    grants = allocate([flow("a", "big", share=3, pending=1), flow("b", "small", share=1)], 8)
    assert grants == {"a": 1, "b": 7}


def test_a_teams_batches_run_in_deadline_order_oldest_first_on_ties() -> None:
    flows = [flow("old", "t"), flow("new", "t"), flow("other", "u")]
    assert allocate(flows, 5) == {"old": 3, "other": 2}
    assert allocate([flow("old", "t", in_flight=4), flow("new", "t")], 2) == {"old": 2}
    # A later batch with an earlier deadline (a shorter completion window) goes first, and
    # the next one gets the slots its lines leave.
    due = [flow("relaxed", "t", deadline=2000.0), flow("urgent", "t", deadline=1000.0,
                                                        pending=2)]
    assert allocate(due, 5) == {"urgent": 2, "relaxed": 3}


def test_finished_batches_still_count_for_their_team() -> None:
    flows = [flow("done", "t", in_flight=4, pending=0), flow("more", "t"), flow("x", "u")]
    assert allocate(flows, 4) == {"x": 4}


def test_fair_share_holds_within_each_models_pool() -> None:
    # Team a floods the big model's pool; team b has one batch on each model.
    flows = [flow("a1", "a", in_flight=6, model="big"), flow("b1", "b", model="big"),
             flow("b2", "b", in_flight=2, model="small")]
    # The pools get slots by their weight (their seats) and work in flight: big 8 of 12
    # (2/3), small 4; within big, team b catches up with team a first.
    grants = allocate(flows, 4, {"big": 2.0, "small": 1.0})
    assert grants == {"b1": 2, "b2": 2}
    # b's work on the small model does not count against its share of the big model's pool:
    # in the big pool a and b are even, so they alternate.
    even = [flow("a1", "a", in_flight=4, model="big"), flow("b1", "b", in_flight=4, model="big"),
            flow("b2", "b", in_flight=10, model="small", pending=0)]
    assert allocate(even, 4, {"big": 1.0, "small": 1.0}) == {"a1": 2, "b1": 2}


def test_a_pool_with_nothing_waiting_leaves_its_slots_to_the_others() -> None:
    flows = [flow("x", "a", model="big", pending=0, in_flight=1), flow("y", "a", model="small")]
    assert allocate(flows, 5, {"big": 100.0, "small": 1.0}) == {"y": 5}


def test_a_pools_share_is_what_the_allocation_gives_it_while_every_pool_has_work() -> None:
    weights = {"big": 48.0, "small": 16.0}
    grants = allocate([flow("b", "t", model="big"), flow("s", "t", model="small")], 64, weights)
    assert grants == {"b": 48, "s": 16}
    assert pool_share("big", ["big", "small"], weights) == 48 / 64
    assert pool_share("small", {"big", "small"}, weights) == 16 / 64
    assert pool_share("big", ["big"], weights) == pool_share("big", [], weights) == 1.0
    assert pool_share("big", ["small", "new"]) == 1 / 3  # absent weights count 1

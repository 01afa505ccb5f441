"""The releaser sends lines whose prompts share a prefix one after another (their prefix
groups, from expansion), on the real PostgreSQL and Redis: nothing twice, nothing lost."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select, update

from domain.models import BatchLine
from domain.settings import Settings
from tests.workers.batch.test_pipeline import (
    chat_line,
    finish,
    lines_of,
    make_batch,
    requests_of,
)
from workers.batch.expand import Expansion, expand
from workers.batch.release import release
from workers.runtime import Runtime

pytestmark = pytest.mark.services

#: Two system prompts, each longer than a prefix key (over 300 tokens of the tiny model).
HEADERS = {name: f"You are the {name} reviewer of short stories. " * 20
           for name in ("first", "second")}


@pytest.fixture
def rt(fresh_services: Settings) -> Iterator[Runtime]:
    runtime = Runtime(fresh_services.model_copy(update={"max_batch_in_flight": 4,
                                                        "engine_prefix_caching": True}))
    yield runtime
    runtime.db.dispose()


def headed_line(custom_id: str, header: str | None) -> dict[str, object]:
    line = chat_line(custom_id, f"Story {custom_id}: a cat sat on a mat.")
    if header is not None:
        line["body"]["messages"].insert(0, {"role": "system", "content": HEADERS[header]})
    return line


def _drain(rt: Runtime, batch_id: str) -> list[list[int]]:
    """Release rounds until nothing is pending, finishing each round's requests: the lines
    each round released, in the order released."""
    rounds = []
    while released := release(rt).released:
        by_id = {r.id: r.batch_line for r in requests_of(rt, batch_id)}
        rounds.append([by_id[i] for i in released])
        finish(rt, released)
    return rounds


def test_interleaved_lines_of_two_prefixes_are_released_grouped(rt: Runtime) -> None:
    # Lines 1-8 alternate between the two headers; line 9 is short (no key), line 10 first.
    layout = ["first", "second"] * 4 + [None, "first"]
    batch_id = make_batch(rt, [headed_line(f"c{n}", h) for n, h in enumerate(layout, 1)])
    assert expand(rt, batch_id) is Expansion.STARTED
    assert [line.prefix_group for line in lines_of(rt, batch_id)] == [1, 2] * 4 + [9, 1]

    rounds = _drain(rt, batch_id)
    # The first header's five lines, then the second's four, then the short one: file order
    # within each group, a window of 4 at a time.
    assert rounds == [[1, 3, 5, 7], [10, 2, 4, 6], [8, 9]]
    assert [line.status for line in lines_of(rt, batch_id)] == ["released"] * 10
    assert sorted(r.batch_line for r in requests_of(rt, batch_id)) == list(range(1, 11))


def test_lines_without_groups_keep_file_order(rt: Runtime) -> None:
    """A batch expanded before groups existed (every line's group NULL) goes in file order."""
    batch_id = make_batch(rt, [headed_line(f"c{n}", h)
                               for n, h in enumerate(["first", "second"] * 3, 1)])
    expand(rt, batch_id)
    with rt.db.session() as session:
        session.execute(update(BatchLine).where(BatchLine.batch_id == batch_id)
                        .values(prefix_group=None))
    assert _drain(rt, batch_id) == [[1, 2, 3, 4], [5, 6]]


def test_without_prefix_caching_lines_go_in_file_order(rt: Runtime) -> None:
    plain = Runtime(rt.settings.model_copy(update={"engine_prefix_caching": False}))
    try:
        batch_id = make_batch(plain, [headed_line(f"c{n}", h)
                                      for n, h in enumerate(["first", "second"] * 3, 1)])
        expand(plain, batch_id)
        assert [line.prefix_group for line in lines_of(plain, batch_id)] == [1, 2, 3, 4, 5, 6]
        assert _drain(plain, batch_id) == [[1, 2, 3, 4], [5, 6]]
    finally:
        plain.db.dispose()


def test_a_line_another_transaction_holds_is_skipped_not_lost(rt: Runtime) -> None:
    """SKIP LOCKED in the grouped order: the claim passes over a locked line and takes the next
    ones of its group; the locked line goes in a later round, once."""
    layout = ["first", "second"] * 4 + [None, "first"]
    batch_id = make_batch(rt, [headed_line(f"c{n}", h) for n, h in enumerate(layout, 1)])
    expand(rt, batch_id)
    with rt.db.session() as holder:
        holder.execute(select(BatchLine.line).where(BatchLine.batch_id == batch_id,
                                                    BatchLine.line == 1).with_for_update())
        skipped = release(rt).released
    by_id = {r.id: r.batch_line for r in requests_of(rt, batch_id)}
    assert [by_id[i] for i in skipped] == [3, 5, 7, 10]
    finish(rt, skipped)
    assert _drain(rt, batch_id) == [[1, 2, 4, 6], [8, 9]]
    assert sorted(r.batch_line for r in requests_of(rt, batch_id)) == list(range(1, 11))

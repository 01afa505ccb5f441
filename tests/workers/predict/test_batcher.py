"""The predict stage's micro-batcher: concurrent callers share batches, results stay theirs."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from workers.predict.batcher import MicroBatcher


class GatedDoubler:
    """Doubles numbers; the first batch blocks until released, so later callers pile up."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.batches: list[list[int]] = []

    def __call__(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        self.release.wait(5)
        return [2 * item for item in items]


def test_callers_waiting_together_share_one_batch_and_get_their_own_results() -> None:
    model = GatedDoubler()
    batcher = MicroBatcher(model, max_batch=8)
    first = batcher.submit(100)
    while not model.batches:  # the first batch is running and holds the model
        threading.Event().wait(0.001)
    futures = [batcher.submit(i) for i in range(12)]
    model.release.set()

    assert first.result(5) == 200
    assert [f.result(5) for f in futures] == [2 * i for i in range(12)]
    # 12 waiting callers: one full batch of 8, then the other 4; order kept inside batches.
    assert model.batches == [[100], list(range(8)), list(range(8, 12))]


def test_concurrent_threads_each_get_their_own_answer() -> None:
    batcher = MicroBatcher(lambda items: [f"answer-{i}" for i in items], max_batch=4)
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(batcher, range(200)))
    assert answers == [f"answer-{i}" for i in range(200)]


def test_a_failing_batch_fails_its_callers_and_the_next_batch_still_runs() -> None:
    def fragile(items: Sequence[int]) -> list[int]:
        if -1 in items:
            raise ValueError("bad item")
        return list(items)

    batcher = MicroBatcher(fragile, max_batch=1)
    with pytest.raises(ValueError, match="bad item"):
        batcher(-1, timeout=5)
    assert batcher(7, timeout=5) == 7


def test_a_model_returning_the_wrong_number_of_results_is_an_error() -> None:
    batcher = MicroBatcher(lambda items: [], max_batch=4)
    with pytest.raises(RuntimeError, match="gave 0 results"):
        batcher(1, timeout=5)


def test_higher_priority_items_go_into_the_next_batch_first() -> None:
    model = GatedDoubler()
    batcher = MicroBatcher(model, max_batch=3)
    first = batcher.submit(100)
    while not model.batches:
        threading.Event().wait(0.001)
    bulk = [batcher.submit(i, priority=1) for i in range(4)]
    interactive = [batcher.submit(10 + i, priority=0) for i in range(2)]
    model.release.set()

    assert [f.result(5) for f in interactive] == [20, 22]
    assert [f.result(5) for f in bulk] == [0, 2, 4, 6] and first.result(5) == 200
    # The interactive pair jumped the four bulk items that were waiting before them.
    assert model.batches == [[100], [10, 11, 0], [1, 2, 3]]

"""Micro-batching for the predict stage: task threads submit one item each; one thread runs the
model over whatever is waiting.

Batches form on their own under load and cost nothing when idle: the batcher never waits for a
batch to fill, it takes everything that queued up while the previous batch ran (at most
`max_batch`). A burst of requests arriving at a predictor worker with many task threads is thus
embedded in a few encoder passes instead of one pass per request. Items carry a priority (lower
first): interactive requests go into the next pass ahead of waiting bulk work.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

__all__ = ["MicroBatcher"]

Item = TypeVar("Item")
Result = TypeVar("Result")


class MicroBatcher(Generic[Item, Result]):
    """Calls `fn(items) -> results` (same length and order) on batches of submitted items."""

    def __init__(
        self,
        fn: Callable[[Sequence[Item]], Sequence[Result]],
        *,
        max_batch: int = 32,
        name: str = "micro-batcher",
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._fn = fn
        self.max_batch = max_batch
        # (priority, arrival, item, future): lower priority first, then first come.
        self._pending: queue.PriorityQueue[tuple[int, int, Any, Future[Result]]] = (
            queue.PriorityQueue())
        self._arrivals = itertools.count()
        self.batch_sizes: list[int] = []  # the last few batch sizes, for tests and logs
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: Item, priority: int = 0) -> Future[Result]:
        future: Future[Result] = Future()
        self._pending.put((priority, next(self._arrivals), item, future))
        return future

    def __call__(self, item: Item, timeout: float | None = None, priority: int = 0) -> Result:
        """Submit one item and wait for its result (re-raises the batch's exception)."""
        return self.submit(item, priority).result(timeout)

    def _take_batch(self) -> list[tuple[Item, Future[Result]]]:
        entries = [self._pending.get()]
        while len(entries) < self.max_batch:
            try:
                entries.append(self._pending.get_nowait())
            except queue.Empty:
                break
        return [(item, future) for _, _, item, future in entries]

    def _run(self) -> None:
        while True:
            batch = self._take_batch()
            self.batch_sizes = [*self.batch_sizes[-63:], len(batch)]
            try:
                results = self._fn([item for item, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"batch of {len(batch)} gave {len(results)} results")
            except BaseException as exc:  # noqa: BLE001 - handed to every waiting caller
                for _, future in batch:
                    future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                future.set_result(result)

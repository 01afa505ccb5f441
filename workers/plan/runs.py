"""Where the planner's simulations run: in the calling thread, or in worker processes.

A plan's time is nearly all simulation, and a search is a chain of verdicts, each deciding the
next run. With `jobs` above 1 the runs go to that many worker processes, so that the other core
works too: on the other pools and kinds (searched in threads of the calling process, which only
wait), and on runs a search will probably need next (`PoolJudge.prefetch`).

A run asked for ahead of need takes a worker only when no run that a search waits on is queued,
and one that a search comes to wait on before it started moves to the front (`hurry`). A
prefetched run decides nothing: the search asks for the same runs in the same order whatever ran
ahead, and takes each verdict from the run already made, so a plan is the same with any `jobs`.
"""

from __future__ import annotations

import heapq
import itertools
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

__all__ = ["Runner"]


@dataclass(eq=False)
class _Job:
    function: Callable[..., Any]
    args: tuple[Any, ...]
    ahead: bool
    future: Future[Any] = field(default_factory=Future)
    started: bool = False


class Runner:
    """Runs functions now (`jobs` 1) or in a pool of `jobs` worker processes, runs a search
    waits on before runs asked for ahead of need."""

    def __init__(self, jobs: int = 1) -> None:
        self.jobs = max(1, jobs)
        # NOTE: forkserver, not fork: the searches run in threads of this process, and a fork
        # of a threaded process may copy a lock some other thread holds.
        self._pool = (multiprocessing.get_context("forkserver").Pool(self.jobs)
                      if self.jobs > 1 else None)
        self._changed = threading.Condition()
        self._queue: list[tuple[bool, int, _Job]] = []  # (ahead, order, job): a heap
        self._jobs: dict[Future[Any], _Job] = {}
        self._order = itertools.count()
        self._busy = 0
        self._closed = False
        self._dispatcher: threading.Thread | None = None
        if self._pool is not None:
            self._dispatcher = threading.Thread(target=self._dispatch, daemon=True,
                                                name="plan-runs")
            self._dispatcher.start()

    @property
    def parallel(self) -> bool:
        """Whether runs go to worker processes (else running ahead of need only costs time)."""
        return self._pool is not None

    def submit(self, function: Callable[..., Any], *args: Any, ahead: bool = False
               ) -> Future[Any]:
        """`function(*args)`: in a worker process, or here and now (a done future). `ahead`:
        asked for ahead of need (it waits for a worker no search waits for)."""
        if self._pool is None:
            done: Future[Any] = Future()
            try:
                done.set_result(function(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits, as a pool does
                done.set_exception(exc)
            return done
        job = _Job(function, args, ahead)
        with self._changed:
            self._jobs[job.future] = job
            heapq.heappush(self._queue, (ahead, next(self._order), job))
            self._changed.notify_all()
        return job.future

    def hurry(self, future: Future[Any]) -> None:
        """A search waits on `future` now: if its run was asked for ahead and has not started,
        it queues with the runs searches wait on, before every run asked for ahead."""
        with self._changed:
            job = self._jobs.get(future)
            if job is not None and job.ahead and not job.started:
                job.ahead = False
                heapq.heappush(self._queue, (False, next(self._order), job))  # the old entry
                self._changed.notify_all()  # is skipped once this one has started

    def withdraw(self, future: Future[Any]) -> bool:
        """Drop a run asked for ahead that has not started (the search moved past it);
        whether it was dropped (its future is then cancelled)."""
        with self._changed:
            job = self._jobs.get(future)
            if job is None or not job.ahead or job.started:
                return False
            job.started = True  # its queue entry is skipped
            del self._jobs[future]
        return future.cancel()

    def _dispatch(self) -> None:
        assert self._pool is not None
        while True:
            with self._changed:
                while not self._closed and (self._busy >= self.jobs or not self._queue):
                    self._changed.wait()
                if self._closed:
                    return
                _, _, job = heapq.heappop(self._queue)
                if job.started:
                    continue
                job.started, self._busy = True, self._busy + 1
            self._pool.apply_async(
                job.function, job.args,
                callback=lambda result, job=job: self._finished(job, result, None),
                error_callback=lambda error, job=job: self._finished(job, None, error))

    def _finished(self, job: _Job, result: Any, error: BaseException | None) -> None:
        with self._changed:
            self._busy -= 1
            self._jobs.pop(job.future, None)
            self._changed.notify_all()
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    def close(self) -> None:
        """Stop the workers; runs still queued or running (asked for ahead, never needed) are
        dropped."""
        if self._pool is None:
            return
        with self._changed:
            self._closed = True
            for _, _, job in self._queue:
                if not job.started:
                    job.future.cancel()
            self._changed.notify_all()
        assert self._dispatcher is not None
        self._dispatcher.join()
        self._pool.terminate()
        self._pool.join()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

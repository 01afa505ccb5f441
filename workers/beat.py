"""Beat's periodic tasks on the worker side: each run at most once per half its interval,
judged by Redis's clock, so that a backlog collapses and no host's clock is read.

Beat sends every periodic task with its interval in a header (`domain.celery_app.PERIODIC_HEADER`).
A run first sets a Redis key for that task with a TTL of half the interval (SET NX PX); a run
that finds the key set returns at once. Runs sent on time are an interval apart and always
pass; the backlog beat leaves while no worker takes its messages (a health worker down for an
hour: 1,800 sweeps) drains as a few runs, not as sweeps back to back. The same task sent
otherwise (`dispatch.retrain_length`, a manual send) carries no header and always runs.

NOTE: this replaces Celery's `expires`, which is an absolute time by the sender's clock checked
against the worker's: a worker 30 s ahead of beat's host dropped every one of them.
"""

from __future__ import annotations

from typing import Any

import redis
from celery import Task

from domain.celery_app import PERIODIC_HEADER
from workers import runtime

__all__ = ["BeatTask", "first_in"]

_KEY = "blockq:beat:ran:"


def first_in(client: redis.Redis, task_name: str, every_s: float) -> bool:
    """Whether this is the first run of `task_name` within half of `every_s` (then it marks
    the run): the key's TTL is Redis's, the same for every host."""
    ttl_ms = max(1, int(every_s * 500))
    return bool(client.set(_KEY + task_name, 1, nx=True, px=ttl_ms))


class BeatTask(Task):  # type: ignore[misc]
    """The workers' task base: a run that beat sent goes through `first_in` first."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # NOTE: `run`, not `super().__call__`: that pushes a request of the arguments alone
        # over the worker's (id, retries and headers gone), as Celery's docs warn.
        every_s = getattr(self.request, PERIODIC_HEADER, None)
        if every_s and not first_in(runtime.get().redis, self.name, float(every_s)):
            return None
        return self.run(*args, **kwargs)

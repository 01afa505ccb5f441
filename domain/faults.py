"""Fault points that only tests arm, for the crashes that cannot be produced from outside.

`BLOCKQ_FAULT_CRASH_AFTER_COMMIT=<probability>` in a process's environment makes it exit (code
70) right after a transaction committed and before the messages it staged in the outbox were
sent: the window a crash or a broker outage can hit in production. Not a setting on purpose: no
configuration file can arm it.
"""

from __future__ import annotations

import logging
import os
import random

__all__ = ["CRASH_AFTER_COMMIT_ENV", "CRASH_EXIT_CODE", "crash_after_commit"]

logger = logging.getLogger(__name__)

CRASH_AFTER_COMMIT_ENV = "BLOCKQ_FAULT_CRASH_AFTER_COMMIT"
CRASH_EXIT_CODE = 70


def _armed_probability() -> float:
    try:
        return min(1.0, max(0.0, float(os.environ.get(CRASH_AFTER_COMMIT_ENV) or 0)))
    except ValueError:
        return 0.0


_CRASH_AFTER_COMMIT = _armed_probability()


def crash_after_commit() -> None:
    """Exit the process here, with the armed probability (never when not armed)."""
    if _CRASH_AFTER_COMMIT and random.random() < _CRASH_AFTER_COMMIT:
        logger.critical("fault point: exiting after a commit, before its messages were sent")
        logging.shutdown()
        os._exit(CRASH_EXIT_CODE)

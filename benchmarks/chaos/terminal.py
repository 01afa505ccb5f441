"""The statuses after which a request or a batch changes no more."""

from __future__ import annotations

from domain.models import TERMINAL_STATUSES

TERMINAL = {str(s) for s in TERMINAL_STATUSES}
TERMINAL_BATCH = {"completed", "failed", "expired", "cancelled"}

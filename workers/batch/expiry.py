"""The completion window: batches still unfinished when it ends are expired."""

from __future__ import annotations

from sqlalchemy import update

from domain import dispatch
from domain.batches import STOPPABLE
from domain.models import Batch, BatchStatus, utcnow
from workers.runtime import Runtime

__all__ = ["expire_due"]


def expire_due(rt: Runtime) -> list[str]:
    """Move validating and in-progress batches past `expires_at` to `finalizing` (to end
    `expired`), and sends them to finalization; returns their ids. Finalization cancels what
    still runs, and their unfinished lines go to the error file with code `batch_expired`."""
    now = utcnow()
    with rt.outbox.transaction() as tx:
        expired = list(tx.session.scalars(
            update(Batch)
            .where(Batch.status.in_([str(s) for s in STOPPABLE]), Batch.expires_at <= now)
            .values(status=BatchStatus.FINALIZING, final_status=BatchStatus.EXPIRED,
                    finalizing_at=now, updated_at=now)
            .returning(Batch.id)
            .execution_options(synchronize_session=False)
        ).all())
        for batch_id in expired:
            tx.post(dispatch.batch_task(dispatch.TASK_BATCH_FINALIZE, batch_id))
    return expired

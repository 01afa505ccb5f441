"""Ghosts of an earlier fleet: instances dead for good, and requests for models nobody serves.

An instance registers in Redis with its first publication and stayed registered forever: after
the fleet changed, /v1/instances listed the old instances as dead, and their models counted as
served, so a held call for such a model got "retry in 5 s" forever and an accepted request
waited in `predicting` forever. Each sweep (run by the health worker):

- forgets every instance without a heartbeat for `instance_expiry_s` (`Fleet.forget`: it
  leaves the listing and the model check; one that comes back registers again);
- fails each request in flight for a model no instance serves any more (none in the registry,
  none declared by the fleet setting) once it has waited `unserved_model_timeout_s`, with
  error code `model_not_served`, its webhook and its held completion told at once.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import select

from domain import dispatch, request_store
from domain.live_fleet import Fleet, InstanceStatus
from domain.models import InferenceRequest, RequestStatus, utcnow
from domain.outbox import Outbox
from domain.settings import Settings
from domain.streams import close_stream

__all__ = ["NOT_SERVED_CODE", "fail_unserved", "forget_ghosts", "ghost_ids"]

logger = logging.getLogger(__name__)

NOT_SERVED_CODE = "model_not_served"
#: Statuses of a request that waits for an instance of its model (no engine holds it).
_WAITING = (RequestStatus.QUEUED, RequestStatus.PREDICTING)
#: Most requests one sweep fails; the next sweep takes the rest.
_BATCH = 500


def ghost_ids(statuses: list[InstanceStatus], expiry_s: float) -> list[str]:
    """The instances without a heartbeat, last heard of more than `expiry_s` ago (or never)."""
    return [status.instance_id for status in statuses if not status.alive and (
        status.heartbeat_age_s is None or status.heartbeat_age_s > expiry_s)]


def forget_ghosts(fleet: Fleet, statuses: list[InstanceStatus], expiry_s: float) -> list[str]:
    """Forget the instances dead longer than `expiry_s`; the ids forgotten."""
    forgotten = fleet.forget(ghost_ids(statuses, expiry_s))
    if forgotten:
        logger.warning("forgot instance(s) without a heartbeat for over %.0f s: %s",
                       expiry_s, ", ".join(forgotten))
    return forgotten


def fail_unserved(outbox: Outbox, fleet: Fleet, settings: Settings, *,
                  timeout_s: float) -> list[str]:
    """Fail the requests waiting longer than `timeout_s` for a model that no registered
    instance serves and the fleet setting does not declare; their ids.

    Nothing is failed while the registry is empty: Redis restarted empty, and the instances
    have not published yet (they do within a heartbeat)."""
    registry = fleet.model_instances()
    if not registry:
        return []
    # NOTE: the fleet setting lists an autoscaled entry's every slot, running or not.
    served = {*registry, *(spec.model for spec in settings.instances), settings.default_model}
    cutoff = utcnow() - timedelta(seconds=timeout_s)
    with outbox.db.session() as session:
        rows = session.execute(
            select(InferenceRequest.id, InferenceRequest.model)
            .where(InferenceRequest.status.in_(_WAITING),
                   InferenceRequest.model.is_not(None),
                   InferenceRequest.model.not_in(served),
                   InferenceRequest.created_at < cutoff)
            .order_by(InferenceRequest.created_at).limit(_BATCH)).all()
    failed = [request_id for request_id, model in rows
              if _fail(outbox, fleet, request_id, str(model), timeout_s)]
    if failed:
        logger.warning("failed %d request(s) waiting over %.0f s for a model no instance "
                       "serves", len(failed), timeout_s)
    return failed


def _fail(outbox: Outbox, fleet: Fleet, request_id: str, model: str, waited_s: float) -> bool:
    message = (f"No instance serves the model '{model}' any more (the fleet no longer declares "
               f"it); the request waited over {waited_s:g} s and was failed.")
    with outbox.transaction() as tx:
        ended = request_store.transition_returning(
            tx.session, request_id, RequestStatus.FAILED, allowed_from=_WAITING,
            detail=f"model '{model}' not served",
            error={"type": "server_error", "code": NOT_SERVED_CODE, "message": message},
            finished_at=utcnow(),
            returning=(InferenceRequest.webhook_url, InferenceRequest.attempt))
        if ended is None:
            return False  # it moved on meanwhile
        if ended.webhook_url:
            tx.post(dispatch.webhook(request_id, "request.failed"))
    fleet.unhold(request_id)
    close_stream(fleet.redis, request_id, int(ended.attempt), message)
    return True

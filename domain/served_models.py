"""Which models the fleet serves: the live ones (a fresh heartbeat, from the states instances
publish in Redis) and every one ever served (the `served_models` table).

Why a table and not a Redis set: "ever served" must outlive Redis. A Redis restarted empty (its
data is a cache of live state here: heartbeats, states, streams) would otherwise turn every
accepted request's model into a 404 while its instances come back; the database is the record
that survives, and a row per model costs nothing. Each engine worker writes its model's row
when it registers; the API reads it only for a model no live instance serves.
"""

from __future__ import annotations

import redis
from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from domain.db import Database
from domain.errors import BlockqError, NotFound
from domain.live_fleet import Fleet
from domain.models import ServedModel, utcnow
from domain.settings import Settings

__all__ = ["ModelUnavailable", "check", "cold_start_timeout", "declare", "ever_served",
           "listed", "not_found", "scales_from_zero", "unavailable"]

#: Seconds a held completion for a model whose instances are all down is told to wait.
RETRY_AFTER_S = 5


class ModelUnavailable(BlockqError):
    """503: the model is served, but no instance of it is up now."""

    status = 503
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 retry_after_s: int = RETRY_AFTER_S) -> None:
        super().__init__(message, param=param, code=code)
        self.retry_after_s = retry_after_s  # the Retry-After header (app/api/errors.py)


def declare(session: Session, model: str, model_path: str) -> None:
    """Record that an instance serves `model` (loaded from `model_path`). One upsert: engines
    that start together declare the same model at once (a read, then an insert, raced into a
    unique violation that restarted one of them)."""
    now = utcnow()
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    session.execute(
        insert(ServedModel)
        .values(name=model, model_path=model_path, first_declared_at=now, last_declared_at=now)
        .on_conflict_do_update(index_elements=[ServedModel.name],
                               set_={"model_path": model_path, "last_declared_at": now}))


def ever_served(session: Session, model: str) -> bool:
    return session.get(ServedModel, model) is not None


def not_found(model: str) -> NotFound:
    return NotFound(f"The model '{model}' does not exist.", param="model",
                    code="model_not_found")


def scales_from_zero(settings: Settings) -> set[str]:
    """Models the autoscaler may start an instance of (autoscaling on, an entry with room)."""
    if not settings.autoscale:
        return set()
    return {entry.model for entry in settings.fleet if entry.highest_count > 0}


def check(fleet: Fleet, db: Database, settings: Settings, model: str, *, held: bool) -> bool:
    """Whether a request may name `model`: a 404 `model_not_found` for a model no instance has
    ever served, or no registered instance (live, or dead less than instance_expiry_s) serves
    now, that the configured fleet does not declare either; for a held call (sync or streamed
    completion), a 503 with Retry-After when every instance that serves the model is down. An
    asynchronous request for such a model is accepted: it waits for an instance. While Redis
    is unreachable an asynchronous request is checked against the database alone (it is
    accepted, its message waits in the outbox); a held call gets the outage's 503.

    With autoscaling, a model the fleet can start an instance of is never unavailable: a held
    call for it is accepted while no instance is up, and True says so (the call waits for a cold
    start, at most autoscale_max_wait_s). False otherwise."""
    try:
        registry: dict[str, dict[str, bool]] | None = fleet.model_instances()
    except redis.RedisError:
        if held:
            raise
        registry = None
    instances = registry.get(model) if registry is not None else None
    cold = model in scales_from_zero(settings)
    if instances is not None:
        if held and not any(instances.values()):
            if cold:
                return True
            raise unavailable(model)
        return False
    if cold:
        return True  # at zero since Redis started, or never started yet
    if model in {spec.model for spec in settings.instances}:
        return False  # declared by the operator; its instances have not published yet
    if registry:
        # NOTE: no registered instance serves it (the sweep forgets instances dead for
        # instance_expiry_s), nor does the fleet setting declare it: an earlier fleet's model.
        # An empty registry is a Redis restarted empty, whose instances publish again soon.
        raise not_found(model)
    with db.session() as session:
        if not ever_served(session, model):
            raise not_found(model)
    # NOTE: served before, but no instance of it has published since Redis started: a held
    # call is told to come back, as when its instances are down.
    if held:
        raise unavailable(model)
    return False


def listed(fleet: Fleet, db: Database, settings: Settings | None = None
           ) -> list[dict[str, object]]:
    """OpenAI model objects of the models a live instance serves, and (with autoscaling, given
    `settings`) of those it can start from zero, sorted by name."""
    live = sorted({*fleet.live_models(), *(scales_from_zero(settings) if settings else ())})
    if not live:
        return []
    with db.session() as session:
        rows = {row.name: row for row in session.scalars(
            select(ServedModel).where(ServedModel.name.in_(live)))}
    return [{"id": name, "object": "model",
             "created": int(rows[name].first_declared_at.timestamp()) if name in rows else 0,
             "owned_by": "blockq"} for name in live]


def cold_start_timeout(model: str, waited_s: float) -> ModelUnavailable:
    """503 of a held call whose model had no instance up, and none started within
    autoscale_max_wait_s (the request was cancelled: it will not run later)."""
    retry_s = max(RETRY_AFTER_S, round(waited_s / 4))
    return ModelUnavailable(
        f"No instance of the model '{model}' started within {waited_s:g} s (it was scaled to "
        f"zero and is starting); the request was cancelled: retry in {retry_s} s.",
        param="model", code="model_cold_start_timeout", retry_after_s=retry_s)


def unavailable(model: str) -> ModelUnavailable:
    return ModelUnavailable(
        f"No instance of the model '{model}' is up now; retry in {RETRY_AFTER_S} s (an "
        "asynchronous request, POST /v1/requests or a batch, waits for one instead).",
        param="model", code="model_unavailable")

"""Data functions for inference requests: create, guarded status transitions, serialization.

Callers own the session and its transaction. Every status change goes through `transition`, a
conditional UPDATE, so a task that runs twice (late acknowledgement, redelivery) changes nothing
the second time, and a request completes exactly once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import uuid
from collections.abc import Hashable, Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Row,
    Select,
    Update,
    bindparam,
    case,
    event,
    false,
    func,
    insert,
    literal,
    null,
    select,
    update,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import ClauseElement, Executable

from domain.errors import Conflict, NotFound
from domain.models import (
    TERMINAL_STATUSES,
    InferenceRequest,
    Priority,
    RequestEvent,
    RequestStatus,
    database_now,
    utcnow,
)

__all__ = [
    "new_request_id",
    "body_digest",
    "create_request",
    "create_requests",
    "get_request",
    "read_request",
    "transition",
    "transition_returning",
    "request_to_dict",
    "ACTIVE_STATUSES",
]

ACTIVE_STATUSES = frozenset(set(RequestStatus) - TERMINAL_STATUSES)
#: Terminal statuses that miss every latency target a request has: it never finished (failed,
#: cancelled, or refused at routing). SUCCEEDED records met or missed from its timings instead
#: (workers/serve/request_records.py).
MISSED_TARGETS_ON = frozenset({RequestStatus.FAILED, RequestStatus.CANCELLED,
                               RequestStatus.REJECTED})
#: `Session.info` key: the latency-target outcomes to count once the transaction commits.
_SLO_OUTCOMES_KEY = "blockq_slo_outcomes"


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def body_digest(body: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON form, so key order and spacing do not matter."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def create_request(
    session: Session, fields: dict[str, Any], *, idempotency_key: str | None
) -> tuple[InferenceRequest, bool]:
    """Insert a queued request, or return the one already made under the same idempotency key.

    Returns (request, created). The same key with another body raises Conflict. A created
    request comes back as a copy of its inserted columns, not attached to the session (see
    `create_requests`).
    """
    if idempotency_key is not None:
        existing = _by_idempotency_key(session, idempotency_key)
        if existing is not None:
            return _same_body_or_conflict(existing, fields["body_sha256"]), False
    if idempotency_key is None:
        # Nothing to collide with: no savepoint.
        return create_requests(session, [fields])[0], True
    try:
        with session.begin_nested():
            request = create_requests(session, [fields], idempotency_key=idempotency_key)[0]
    except IntegrityError:
        # Another API process inserted the same key between our lookup and insert.
        existing = _by_idempotency_key(session, idempotency_key or "")
        if existing is None:
            raise
        return _same_body_or_conflict(existing, fields["body_sha256"]), False
    return request, True


def create_requests(session: Session, rows: Sequence[dict[str, Any]], *,
                    idempotency_key: str | None = None) -> list[InferenceRequest]:
    """Insert queued requests (`rows`: their fields, as `create_request` takes them, the same
    columns in every row) and their first events; the requests, in order.

    NOTE: Core statements, one per request (its event inserted by a data-modifying CTE of the
    same statement, on PostgreSQL), not the ORM's unit of work, whose flush (two INSERTs and
    their bookkeeping) was most of the API's CPU per accepted request. The requests returned
    are transient copies of what was inserted (columns only, no events): what the caller
    changes on them is not written.
    """
    now = utcnow()
    given = [{"id": new_request_id(), "status": str(RequestStatus.QUEUED),
              "idempotency_key": idempotency_key, "attempt": 0, "created_at": now,
              "stream": False, "priority": str(Priority.INTERACTIVE),
              **fields} for fields in rows]
    # A column the fields leave out is SQL NULL, as the ORM leaves it; one they give as None is
    # written as the ORM writes it (JSON columns: JSON null).
    names = tuple(sorted(given[0])) if given else ()
    assert all(columns.keys() == given[0].keys() for columns in given), "rows differ in columns"
    connection = session.connection()
    postgresql = connection.dialect.name == "postgresql"
    statement = _insert_statement(names, postgresql)
    for columns in given:
        connection.execute(statement, {_COLUMN_KEYS.get(name, name): columns[name]
                                       for name in names})
    if not postgresql:  # no data-modifying CTEs: the events in a statement of their own
        connection.execute(insert(_EVENTS), [{"request_id": columns["id"], "status": columns[
            "status"], "at": now} for columns in given])
    return [InferenceRequest(**columns) for columns in given]


@functools.lru_cache(maxsize=16)
def _insert_statement(names: tuple[str, ...], postgresql: bool) -> Executable:
    """The INSERT of a request's columns `names` (parameters named by column) and, on
    PostgreSQL, of its queued event in a data-modifying CTE of the same statement; built once
    per set of columns, so that SQLAlchemy's compiled cache serves it without a cache key of
    the values."""
    keys = [_COLUMN_KEYS.get(name, name) for name in names]
    inserting = insert(_REQUESTS).values(
        {key: bindparam(key, type_=_REQUESTS.c[key].type) for key in keys})
    if not postgresql:
        return inserting
    inserted = inserting.returning(_REQUESTS.c.id, _REQUESTS.c.created_at).cte("inserted")
    events = insert(_EVENTS).from_select(
        ["request_id", "status", "at"],
        select(inserted.c.id, literal(str(RequestStatus.QUEUED), _EVENTS.c.status.type),
               inserted.c.created_at),
    ).cte("queued_events")
    return select(inserted.c.id).add_cte(events)


def create_requests_once(session: Session, rows: Sequence[dict[str, Any]],
                         idempotency_keys: Sequence[str]) -> tuple[list[InferenceRequest], bool]:
    """`create_requests` under one idempotency key per row (the choices of one OpenAI call), or
    the requests already made under those keys, in order, running or ended (but cancelled:
    those let go of their keys and new requests are made). Returns (requests, created).
    Another body under the same keys raises Conflict, as `create_request` does."""
    assert len(rows) == len(idempotency_keys), "one key per row"
    existing = _all_by_idempotency_keys(session, rows, idempotency_keys)
    if existing is not None and any(r.status == RequestStatus.CANCELLED for r in existing):
        # NOTE: cancelled (its clients left, or someone cancelled it): it will never answer, so
        # a retry under its key starts again rather than joining it; the old rows let go of it.
        session.execute(update(InferenceRequest)
                        .where(InferenceRequest.id.in_([r.id for r in existing]))
                        .values(idempotency_key=None))
        existing = None
    if existing is not None:
        return existing, False
    try:
        with session.begin_nested():
            keyed = [{**row, "idempotency_key": key} for row, key in zip(rows, idempotency_keys,
                                                                          strict=True)]
            return create_requests(session, keyed), True
    except IntegrityError:
        # Another API process inserted the same keys between our lookup and insert.
        existing = _all_by_idempotency_keys(session, rows, idempotency_keys)
        if existing is None:
            raise
        return existing, False


def _all_by_idempotency_keys(session: Session, rows: Sequence[dict[str, Any]],
                             keys: Sequence[str]) -> list[InferenceRequest] | None:
    """The requests made under `keys`, in order, each checked against its row's body; None when
    there are none. A different number of them (another call's key with fewer choices) is
    a Conflict, as another body is."""
    found = {request.idempotency_key: request for request in session.scalars(
        select(InferenceRequest).where(InferenceRequest.idempotency_key.in_(keys)))}
    if not found:
        return None
    if len(found) != len(keys) or set(found) != set(keys):
        raise Conflict("This Idempotency-Key was already used with a different request body.",
                       param="Idempotency-Key", code="idempotency_key_reused")
    return [_same_body_or_conflict(found[key], row["body_sha256"])
            for row, key in zip(rows, keys, strict=True)]


def _by_idempotency_key(session: Session, key: str) -> InferenceRequest | None:
    return session.scalar(select(InferenceRequest).where(InferenceRequest.idempotency_key == key))


def _same_body_or_conflict(existing: InferenceRequest, digest: str) -> InferenceRequest:
    if existing.body_sha256 != digest:
        raise Conflict(
            "This Idempotency-Key was already used with a different request body.",
            param="Idempotency-Key",
            code="idempotency_key_reused",
        )
    return existing


def get_request(session: Session, request_id: str, *, team_id: str | None = None
                ) -> InferenceRequest:
    """The request, if it exists and (given `team_id`) belongs to that team; else NotFound."""
    request = session.get(InferenceRequest, request_id)
    if request is None or (team_id is not None and request.team_id != team_id):
        raise NotFound(f"No request with id '{request_id}'.", param="id", code="not_found")
    return request


def read_request(connection: Connection, request_id: str) -> InferenceRequest:
    """The request as `get_request` gives it (NotFound when there is none), read by one Core
    SELECT on `connection`, without a session: a transient copy of its columns (what the caller
    changes on it is not written)."""
    row = connection.execute(_READ_REQUEST, {"id": request_id}).first()
    if row is None:
        raise NotFound(f"No request with id '{request_id}'.", param="id", code="not_found")
    return InferenceRequest(**row._asdict())


def transition(
    session: Session,
    request_id: str,
    to: RequestStatus,
    *,
    allowed_from: Iterable[RequestStatus],
    detail: str | None = None,
    extra_where: Iterable[Any] = (),
    **fields: Any,
) -> bool:
    """Move a request to `to` only if its status is in `allowed_from`; record the event.

    Returns whether this call made the change. `fields` are set in the same UPDATE.
    """
    return transition_returning(session, request_id, to, allowed_from=allowed_from,
                                detail=detail, extra_where=extra_where,
                                returning=(InferenceRequest.id,), **fields) is not None


def transition_returning(
    session: Session,
    request_id: str,
    to: RequestStatus,
    *,
    allowed_from: Iterable[RequestStatus],
    returning: Sequence[Any],
    detail: str | None = None,
    extra_where: Iterable[Any] = (),
    wait_for_wal: bool = True,
    **fields: Any,
) -> Row[Any] | None:
    """`transition` that also reads the changed row's `returning` columns (their values after
    the UPDATE) in the same statement, saving the hot path a SELECT; None when nothing changed.

    `wait_for_wal` False: on PostgreSQL the transaction's commit will not wait for its WAL
    flush (`synchronous_commit` off for this transaction, set by the same statement), for a
    change that need not survive a crash of the database server itself.
    """
    now = utcnow()
    missed = to in MISSED_TARGETS_ON
    if missed:
        # NOTE: in the same guarded UPDATE, so a request's outcome is written once, by the one
        # transition that ended it (a redelivery finds it ended and changes nothing).
        fields = {"slo_ttft_met": _missed_if_set(_REQUESTS.c.slo_ttft_ms),
                  "slo_e2e_met": _missed_if_set(_REQUESTS.c.slo_e2e_ms), **fields}
        returning = (*returning, _REQUESTS.c.slo_ttft_ms.label("_slo_ttft_ms"),
                     _REQUESTS.c.slo_e2e_ms.label("_slo_e2e_ms"))
    row = _transition(session, request_id, to, allowed_from, returning, detail, extra_where,
                      wait_for_wal, now, fields)
    if missed and row is not None:
        kinds = [kind for kind, target in (("ttft", row._mapping["_slo_ttft_ms"]),
                                           ("e2e", row._mapping["_slo_e2e_ms"]))
                 if target is not None]
        if kinds:
            session.info.setdefault(_SLO_OUTCOMES_KEY, []).append((to, kinds))
    return row


def _missed_if_set(target: Any) -> Any:
    """False (missed) where the request has this target, NULL where it has none."""
    return case((target.is_(None), null()), else_=false())


def _transition(session: Session, request_id: str, to: RequestStatus,
                allowed_from: Iterable[RequestStatus], returning: Sequence[Any],
                detail: str | None, extra_where: Iterable[Any], wait_for_wal: bool,
                now: datetime, fields: dict[str, Any]) -> Row[Any] | None:
    # NOTE: Core statements on the tables, on the session's connection: the ORM's bulk UPDATE
    # path (session.execute of an entity's update) cost twice the CPU for nothing used here
    # (synchronize_session is off), and every request passes here four times.
    connection = session.connection()
    if connection.dialect.name == "postgresql":
        # NOTE: one statement, one round trip: the event is inserted by a data-modifying CTE
        # from the UPDATE's own RETURNING (no row changed, no event), instead of a second
        # INSERT after the first statement's answer. Every request passes here four times.
        statement, params = _transition_statement(to, allowed_from, returning, extra_where,
                                                  wait_for_wal, fields)
        return connection.execute(statement, {"_request_id": request_id, "_now": now,
                                              "_detail": detail, **params}).first()
    changing = (
        update(_REQUESTS)
        .where(
            InferenceRequest.id == request_id,
            InferenceRequest.status.in_([str(s) for s in allowed_from]),
            *extra_where,
        )
        .values(status=str(to), updated_at=database_now(),
                **{_COLUMN_KEYS.get(name, name): value for name, value in fields.items()})
    )
    row = connection.execute(changing.returning(*returning)).first()
    if row is None:
        return None
    connection.execute(
        insert(_EVENTS).values(request_id=request_id, status=str(to), at=now, detail=detail)
    )
    return row


@event.listens_for(Session, "after_commit")
def _count_slo_outcomes(session: Session) -> None:
    """Count the latency targets missed by the transitions this transaction committed."""
    outcomes = session.info.pop(_SLO_OUTCOMES_KEY, None)
    if not outcomes:
        return
    from domain import metrics  # NOTE: late: domain.metrics imports modules that import this one

    for status, kinds in outcomes:
        metrics.observe_unfinished_targets(status, kinds)


@event.listens_for(Session, "after_begin")
def _forget_slo_outcomes(session: Session, transaction: Any, connection: Any) -> None:
    """A transaction starts with nothing to count (one rolled back before counts nothing)."""
    session.info.pop(_SLO_OUTCOMES_KEY, None)


#: Transition statements by shape (`_shape_of`): building one (its CTEs' column proxies) cost
#: more client CPU than running it. Bounded: shapes come from the code's call sites.
_TRANSITIONS: dict[Hashable, Select[Any]] = {}
_MAX_TRANSITIONS = 512


def _transition_statement(to: RequestStatus, allowed_from: Iterable[RequestStatus],
                          returning: Sequence[Any], extra_where: Iterable[Any],
                          wait_for_wal: bool, fields: dict[str, Any]
                          ) -> tuple[Select[Any], dict[str, Any]]:
    """The UPDATE of a transition with the INSERT of its event (`_with_event`), built once per
    shape, and its parameters: the request id (`_request_id`), the time (`_now`) and the
    event's detail (`_detail`) are bound when it runs, as is every plain field value; SQL
    expressions (in fields, `extra_where`, `returning`) are part of the shape, values and all."""
    allowed = tuple(sorted(str(s) for s in allowed_from))
    extra = tuple(extra_where)
    plain = {name: value for name, value in fields.items() if not isinstance(value, ClauseElement)}
    shape = _shape_of(to, allowed, returning, extra, wait_for_wal, fields, plain)
    statement = _TRANSITIONS.get(shape) if shape is not None else None
    if statement is None:
        now = bindparam("_now", type_=_EVENTS.c.at.type)
        detail = bindparam("_detail", type_=_EVENTS.c.detail.type)
        values = {_COLUMN_KEYS.get(name, name): (
            bindparam(f"_v_{name}", type_=_REQUESTS.c[_COLUMN_KEYS.get(name, name)].type)
            if name in plain else value) for name, value in fields.items()}
        changing = (update(_REQUESTS)
                    .where(_REQUESTS.c.id == bindparam("_request_id"),
                           _REQUESTS.c.status.in_(allowed), *extra)
                    .values(status=str(to), updated_at=database_now(), **values))
        statement = _with_event(changing, to, now, detail, returning, wait_for_wal)
        if shape is not None and len(_TRANSITIONS) < _MAX_TRANSITIONS:
            _TRANSITIONS[shape] = statement
    return statement, {f"_v_{name}": value for name, value in plain.items()}


def _shape_of(to: RequestStatus, allowed: tuple[str, ...], returning: Sequence[Any],
              extra: tuple[Any, ...], wait_for_wal: bool, fields: dict[str, Any],
              plain: dict[str, Any]) -> Hashable | None:
    """What makes two transitions one statement; None when an expression has no cache key
    or an unhashable value (such a statement is built each time)."""
    try:
        expressions = tuple(_expression_key(e) for e in (*returning, *extra))
        field_keys = tuple((name, None if name in plain else _expression_key(value))
                           for name, value in fields.items())
        shape = (str(to), allowed, wait_for_wal, expressions, field_keys)
        hash(shape)
    except (TypeError, _Uncacheable):
        return None
    return shape


class _Uncacheable(Exception):
    pass


def _expression_key(expression: Any) -> Hashable:
    """SQLAlchemy's cache key of an expression with its bound values: equal keys, the same SQL
    and the same values."""
    element = expression.__clause_element__() if hasattr(expression, "__clause_element__") \
        else expression
    key = element._generate_cache_key()
    if key is None:
        raise _Uncacheable
    return key.key, tuple(b.effective_value for b in key.bindparams)


def _with_event(changing: Update, to: RequestStatus, now: Any, detail: Any,
                returning: Sequence[Any], wait_for_wal: bool) -> Select[Any]:
    """`changing` with the event of its change, as one statement: the UPDATE and an INSERT of
    the event in CTEs, selecting the UPDATE's `returning` columns under their own names (and,
    unless `wait_for_wal`, turning the synchronous commit off for the transaction when a row
    changed: SET LOCAL's effect, without its round trip). `now`, `detail`: the event's time and
    detail, bound parameters."""
    changed = changing.returning(
        _REQUESTS.c.id.label("_id"),
        *(column.label(f"_r{i}") for i, column in enumerate(returning)),
    ).cte("changed")
    event = insert(_EVENTS).from_select(
        ["request_id", "status", "at", "detail"],
        select(changed.c._id, literal(str(to), _EVENTS.c.status.type), now, detail),
    ).cte("event")
    columns = [changed.c[f"_r{i}"].label(column.key) for i, column in enumerate(returning)]
    if not wait_for_wal:
        columns.append(func.set_config("synchronous_commit", "off", True).label("_no_wal_wait"))
    return select(*columns).add_cte(event)


_REQUESTS = InferenceRequest.__table__
_EVENTS = RequestEvent.__table__
#: Attribute name -> column name, where they differ (`metadata` is taken on a declarative class).
_COLUMN_KEYS = {attr.key: attr.columns[0].key
                for attr in sa_inspect(InferenceRequest).column_attrs
                if attr.key != attr.columns[0].key}
#: `read_request`'s SELECT: every column, labelled with its attribute's name.
_READ_REQUEST = select(*(attr.columns[0].label(attr.key)
                         for attr in sa_inspect(InferenceRequest).column_attrs)).where(
    _REQUESTS.c.id == bindparam("id"))


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def _slo_of(request: InferenceRequest) -> dict[str, Any] | None:
    """The request's latency targets and, once it is over, whether it met them."""
    if request.slo_ttft_ms is None and request.slo_e2e_ms is None:
        return None
    outcomes = [m for m in (request.slo_ttft_met, request.slo_e2e_met) if m is not None]
    met = (all(outcomes) if outcomes
           else False if request.status == RequestStatus.REJECTED else None)
    return {"ttft_ms": request.slo_ttft_ms, "e2e_ms": request.slo_e2e_ms,
            "miss_action": request.slo_miss_action, "ttft_met": request.slo_ttft_met,
            "e2e_met": request.slo_e2e_met, "met": met}


def request_to_dict(request: InferenceRequest, *, include_events: bool = True) -> dict[str, Any]:
    """The public JSON form of a request, as GET /v1/requests/<id> and webhooks show it."""
    body: dict[str, Any] = {
        "id": request.id,
        "object": "request",
        "status": request.status,
        "model": request.model,
        "priority": request.priority,
        "prompt_tokens": request.prompt_tokens,
        "output_tokens": request.output_tokens,
        "predicted_output_tokens": request.predicted_output_tokens,
        "predicted_output_tokens_p90": request.predicted_output_tokens_p90,
        "predictor": request.predictor,
        "predicted_ttft_s": request.predicted_ttft_s,
        "predicted_e2e_s": request.predicted_e2e_s,
        "max_tokens": request.max_tokens,
        "instance_id": request.instance_id,
        "policy": request.policy,
        "routing": request.routing,
        "attempt": request.attempt,
        "output": request.output_text,
        "finish_reason": request.finish_reason,
        "sampling": request.sampling,
        "logprobs": request.logprobs,
        "error": request.error,
        "metadata": request.request_metadata,
        "created_at": _iso(request.created_at),
        "predicted_at": _iso(request.predicted_at),
        "routed_at": _iso(request.routed_at),
        "started_at": _iso(request.started_at),
        "first_token_at": _iso(request.first_token_at),
        "finished_at": _iso(request.finished_at),
        "slo": _slo_of(request),
    }
    if include_events:
        body["events"] = [
            {"status": e.status, "at": _iso(e.at), "detail": e.detail} for e in request.events
        ]
    return body

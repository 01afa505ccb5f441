"""Guarded status transitions on PostgreSQL (app/request_store.py): the UPDATE and its event in one
statement, no event when the guard refuses, and the asynchronous commit set by the same
statement when asked; new requests and their first events, one statement each."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import event, select, text
from sqlalchemy import inspect as sa_inspect

from domain import request_store
from domain.db import Database
from domain.errors import NotFound
from domain.models import InferenceRequest, RequestEvent, RequestStatus
from domain.settings import Settings

pytestmark = pytest.mark.services

FIELDS = {"priority": "interactive", "prompt": "hello", "messages": None, "max_tokens": 8,
          "temperature": 0.0, "top_p": 1.0, "seed": None, "stop": None, "sampling": None,
          "prompt_token_ids": None, "webhook_url": None, "request_metadata": None,
          "prompt_tokens": 2, "body_sha256": "x", "team_id": None, "stream": False}


@pytest.fixture
def db(fresh_services: Settings) -> Iterator[Database]:
    database = Database(fresh_services.resolved_database_url)
    yield database
    database.dispose()


def _new_request(db: Database) -> str:
    with db.session() as session:
        request, _ = request_store.create_request(session, dict(FIELDS), idempotency_key=None)
        return request.id


def _events(db: Database, request_id: str) -> list[tuple[str, str | None]]:
    with db.session() as session:
        return [tuple(row) for row in session.execute(
            select(RequestEvent.status, RequestEvent.detail)
            .where(RequestEvent.request_id == request_id).order_by(RequestEvent.id))]


def test_a_transition_returns_its_columns_and_records_its_event(db: Database) -> None:
    request_id = _new_request(db)
    with db.session() as session:
        row = request_store.transition_returning(
            session, request_id, RequestStatus.ROUTED, allowed_from={RequestStatus.QUEUED},
            detail="to gpu.0", instance_id="gpu.0", attempt=InferenceRequest.attempt + 1,
            returning=(InferenceRequest.attempt, InferenceRequest.prompt))
    assert row is not None and (row.attempt, row.prompt) == (1, "hello")
    assert _events(db, request_id) == [("queued", None), ("routed", "to gpu.0")]


def test_a_refused_transition_changes_nothing_and_records_no_event(db: Database) -> None:
    request_id = _new_request(db)
    with db.session() as session:
        assert not request_store.transition(session, request_id, RequestStatus.RUNNING,
                                    allowed_from={RequestStatus.ROUTED}, detail="no")
    with db.session() as session:
        assert session.get(InferenceRequest, request_id).status == "queued"
    assert _events(db, request_id) == [("queued", None)]


@pytest.mark.parametrize(("wait_for_wal", "expected"), [(True, "on"), (False, "off")])
def test_the_commit_waits_for_the_wal_unless_told_not_to(db: Database, wait_for_wal: bool,
                                                         expected: str) -> None:
    request_id = _new_request(db)
    with db.session() as session:
        assert request_store.transition_returning(
            session, request_id, RequestStatus.PREDICTING, allowed_from={RequestStatus.QUEUED},
            returning=(InferenceRequest.id,), wait_for_wal=wait_for_wal) is not None
        assert session.execute(text("SHOW synchronous_commit")).scalar_one() == expected
    with db.session() as session:  # for this transaction only
        assert session.execute(text("SHOW synchronous_commit")).scalar_one() == "on"


def test_new_requests_are_inserted_with_their_event_one_statement_each(db: Database) -> None:
    """Each new request is one INSERT statement with its queued event; the fields given as None
    stay JSON nulls and the columns left out SQL NULL, as the ORM's unit of work wrote them."""
    statements: list[str] = []

    def seen(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(statement)

    event.listen(db.engine, "before_cursor_execute", seen)
    with db.session() as session:
        made = request_store.create_requests(session, [dict(FIELDS), dict(FIELDS, prompt="other")])
    event.remove(db.engine, "before_cursor_execute", seen)
    assert len(statements) == 2 and all("INSERT INTO request_events" in s for s in statements)
    assert [r.prompt for r in made] == ["hello", "other"]
    assert made[0].status == RequestStatus.QUEUED and made[0].attempt == 0
    with db.session() as session:
        for request in made:
            assert _events(db, request.id) == [("queued", None)]
            nulls = session.execute(text(
                "SELECT messages IS NULL, messages::text, routing IS NULL, error IS NULL, "
                "created_at = :at FROM requests WHERE id = :id"),
                {"id": request.id, "at": request.created_at}).one()
            assert tuple(nulls) == (False, "null", True, True, True)


def test_transitions_of_one_shape_keep_their_own_values(db: Database) -> None:
    """A transition's statement is built once per shape: the values of its SQL expressions are
    part of the shape, the plain ones bound per call (a guard on attempt 5 refuses, the same
    guard on attempt 0 applies, with its own detail and field value)."""
    request_id = _new_request(db)
    for attempt, detail, expected in ((5, "first", False), (0, "second", True)):
        with db.session() as session:
            changed = request_store.transition(
                session, request_id, RequestStatus.PREDICTING,
                allowed_from={RequestStatus.QUEUED}, detail=detail, predictor=detail,
                extra_where=[InferenceRequest.attempt == attempt])
        assert changed is expected
    assert _events(db, request_id) == [("queued", None), ("predicting", "second")]
    with db.session() as session:
        assert session.get(InferenceRequest, request_id).predictor == "second"


def test_a_request_read_without_a_session_has_the_columns_the_session_reads(
        db: Database) -> None:
    with db.session() as session:
        (request,) = request_store.create_requests(session, [{
            **FIELDS, "messages": [{"role": "user", "content": "a\x00b"}],
            "sampling": {"n": 1}, "request_metadata": {"k": "v"}, "stop": ["\n"]}])
    with db.session() as session:
        request_store.transition(session, request.id, RequestStatus.SUCCEEDED,
                         allowed_from={RequestStatus.QUEUED}, output_text="out\x00put",
                         output_tokens=3, finish_reason="length")
        loaded = request_store.get_request(session, request.id)
        expected = {attr.key: getattr(loaded, attr.key)
                    for attr in sa_inspect(InferenceRequest).column_attrs}
    with db.autocommit() as connection:
        read = request_store.read_request(connection, request.id)
        with pytest.raises(NotFound):
            request_store.read_request(connection, "req_missing")

    assert {key: getattr(read, key) for key in expected} == expected
    assert read.status == RequestStatus.SUCCEEDED and read.output_text == "out\x00put"

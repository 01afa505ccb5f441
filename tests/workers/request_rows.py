"""Request rows for the worker tests, made as the API stores an accepted request."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from domain import request_store
from domain.db import Database
from domain.models import InferenceRequest, Priority

#: A small interactive completion request, as the API's schema hands it to the request_store.
REQUEST_FIELDS: dict[str, Any] = {
    "priority": Priority.INTERACTIVE, "prompt": "Hello", "messages": None, "max_tokens": 16,
    "temperature": 1.0, "top_p": 1.0, "seed": None, "stop": None, "webhook_url": None,
    "stream": False, "request_metadata": None, "body_sha256": "0" * 64, "prompt_tokens": 3,
}


def new_request(session: Session, **fields: Any) -> str:
    """A queued request (flushed, not committed); its id."""
    request, _ = request_store.create_request(session, REQUEST_FIELDS | fields,
                                              idempotency_key=None)
    session.flush()
    return request.id


def stored_request(db: Database, request_id: str) -> InferenceRequest:
    """The request's row as committed, detached from its session."""
    with db.session() as session:
        request = session.get(InferenceRequest, request_id)
        assert request is not None
        session.expunge(request)
        return request

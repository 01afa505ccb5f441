"""`ExactText`: prompts and answers round-trip exactly, NUL included (PostgreSQL text cannot hold
NUL; vLLM's server takes it), and plain text is stored as it is."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select

from domain.db import Database
from domain.models import ExactText, InferenceRequest
from domain.request_store import new_request_id
from domain.settings import Settings

EXACT = ExactText()
#: Text that stresses the escaping: NUL, backslashes, zeros, the mark's own characters.
TRICKY = st.text(alphabet=st.sampled_from(["\x00", "\\", "0", "\x01", "b", "l", "q", ":",
                                           "é", "😀"]))


@given(st.one_of(TRICKY, st.text().filter(lambda t: not any(
    "\ud800" <= c <= "\udfff" for c in t))))
def test_any_text_round_trips(text: str) -> None:
    stored = EXACT.process_bind_param(text, None)
    assert stored is not None and "\x00" not in stored
    assert EXACT.process_result_value(stored, None) == text


def test_plain_text_is_stored_as_it_is() -> None:
    for text in ("", "Hello, world", "a\\0b", "\x01 not the mark"):
        assert EXACT.process_bind_param(text, None) == text


def test_postgresql_keeps_nul_in_prompts_and_answers(fresh_services: Settings) -> None:

    db = Database(fresh_services.resolved_database_url)
    texts = ["a\x00b", "\x01blockq-escaped:\x00\\0", "\\\\\x00\\", "plain"]
    ids = [new_request_id() for _ in texts]
    try:
        with db.session() as session:
            for request_id, text in zip(ids, texts, strict=True):
                session.add(InferenceRequest(
                    id=request_id, status="succeeded", priority="interactive", prompt=text,
                    max_tokens=8, temperature=1.0, top_p=1.0, body_sha256="0" * 64,
                    prompt_tokens=1, output_text=text[::-1], custom_id=text))
        with db.session() as session:
            rows = {r.id: r for r in session.scalars(select(InferenceRequest))}
            for request_id, text in zip(ids, texts, strict=True):
                row = rows[request_id]
                assert (row.prompt, row.output_text, row.custom_id) == (text, text[::-1], text)
    finally:
        db.dispose()

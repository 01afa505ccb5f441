"""Counting a batch input file's requests (domain.batch_input) in chunks gives what expansion counts
line by line, wherever the chunk boundaries fall."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain import batch_input
from domain.settings import Settings
from workers.batch.expand import physical_lines

#: Bytes that make lines blank or not, and line ends (CRLF included).
_ALPHABET = st.sampled_from([b"\n", b"\r\n", b" ", b"\t", b"\r", b"\x0b", b"{", b"a", b"\xff"])


def _as_expansion_counts(data: bytes) -> int:
    return sum(1 for raw in physical_lines(io.BytesIO(data), 1 << 30) if raw.strip())


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(_ALPHABET, max_size=60), chunk=st.integers(1, 9))
def test_chunked_count_is_expansions_count(pieces: list[bytes], chunk: int) -> None:
    data = b"".join(pieces)
    original = batch_input.COUNT_CHUNK_BYTES
    batch_input.COUNT_CHUNK_BYTES = chunk
    try:
        counted = batch_input.count_requests(io.BytesIO(data), stop_after=10**9)
    finally:
        batch_input.COUNT_CHUNK_BYTES = original
    assert counted == _as_expansion_counts(data)


@pytest.mark.parametrize(("content", "limit", "refused"), [
    (b"{}\n" * 3, 3, False),
    (b"{}\n" * 4, 3, True),
    (b"{}\n{}\n{}\n{}", 3, True),  # no line end after the last request
    (b"{}\n\n  \n\r\n{}\n{}\n\n\n", 3, False),  # blank lines are not requests
    (b"\n" * 10_000, 3, False),
])
def test_the_line_limit(tmp_path: Path, content: bytes, limit: int, refused: bool) -> None:
    path = tmp_path / "input.jsonl"
    path.write_bytes(content)
    settings_ = Settings(max_batch_lines=limit)
    if not refused:
        batch_input.check_input_file(settings_, path, size_bytes=len(content), param="f")
        return
    with pytest.raises(batch_input.InvalidRequest) as refusal:
        batch_input.check_input_file(settings_, path, size_bytes=len(content), param="f")
    assert refusal.value.code == "too_many_lines" and "at most 3" in refusal.value.message

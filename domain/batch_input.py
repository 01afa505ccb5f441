"""The limits of a batch input file, OpenAI's by default: at most `max_batch_lines` requests
(50,000) and `max_batch_file_bytes` (200 MB).

They are checked where the client can be told at once: at upload with purpose `batch` (the
size by the upload's byte limit, the lines here) and at batch creation (both here, as a 400
naming the limit). Expansion (workers/batch/expand.py) counts the lines again as it reads them,
so a file uploaded under a higher limit still cannot run past the current one.

A request is a non-blank line, as expansion counts them. Counting reads the file in chunks, at
C speed (200 MB in well under a second), and stops once past the limit.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import IO

from domain.errors import InvalidRequest
from domain.models import FilePurpose
from domain.settings import Settings

__all__ = ["count_requests", "check_input_file", "check_request_count", "max_upload_bytes"]

COUNT_CHUNK_BYTES = 1 << 20
#: ASCII whitespace but the line end: what makes a line blank (the set `bytes.strip` strips).
_BLANKS = b" \t\r\x0b\x0c"
_LINE_END = ord("\n")


def max_upload_bytes(settings: Settings, purpose: str | None) -> int:
    """The largest file an upload with `purpose` may store."""
    if purpose == FilePurpose.BATCH:
        return min(settings.max_file_bytes, settings.max_batch_file_bytes)
    return settings.max_file_bytes


def count_requests(handle: IO[bytes], *, stop_after: int) -> int:
    """The non-blank lines of `handle`, read in chunks; counting stops once past `stop_after`
    (the result is then some number above it).

    With the blanks deleted (C speed), a non-blank line is one run of bytes between line ends,
    and `bytes.split()` finds the runs; a run cut by a chunk's end is counted once.
    """
    count, open_run = 0, False  # open_run: the last chunk ended inside a non-blank line
    while chunk := handle.read(COUNT_CHUNK_BYTES):
        content = chunk.translate(None, _BLANKS)
        if not content:
            continue
        count += len(content.split()) - (open_run and content[0] != _LINE_END)
        open_run = content[-1] != _LINE_END
        if count > stop_after:
            break
    return count


#: A file to read: a path, or what opens one (FileStore.open of an id, for any storage).
Source = Path | Callable[[], IO[bytes]]


def _more_requests_than(source: Source, limit: int) -> bool:
    with source.open("rb") if isinstance(source, Path) else source() as handle:
        return count_requests(handle, stop_after=limit) > limit


def check_request_count(settings: Settings, source: Source, *, param: str) -> None:
    """400 when the file `source` holds more requests than a batch may."""
    limit = settings.max_batch_lines
    if _more_requests_than(source, limit):
        raise InvalidRequest(f"The batch input file has more than {limit:,} requests (non-blank "
                             f"lines): a batch holds at most {limit:,} requests.", param=param,
                             code="too_many_lines")


def check_input_file(settings: Settings, source: Source, *, size_bytes: int, param: str
                     ) -> None:
    """400 when the file `source` (of `size_bytes`) is past either limit of a batch input file.
    A file whose bytes are gone passes: expansion fails the batch with `file_not_found`."""
    limit = settings.max_batch_file_bytes
    if size_bytes > limit:
        raise InvalidRequest(f"The batch input file is {size_bytes:,} bytes; a batch input file "
                             f"is at most {limit:,} bytes.", param=param, code="file_too_large")
    try:
        check_request_count(settings, source, param=param)
    except FileNotFoundError:
        return

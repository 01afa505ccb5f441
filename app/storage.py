"""The bytes of the Files API on local disk: one file per id in the files directory.

Writers fill a temporary file in `<root>/.tmp` and rename it into place when complete, so a
reader never sees half a file and a crashed writer leaves only a temporary file behind. Nothing
here reads a whole file into memory: uploads and batch outputs are streamed in, contents are
streamed out.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, BinaryIO

from app.private_paths import private_dir
from app.settings import Settings

__all__ = ["FileStore", "FileTooLarge", "file_store"]

COPY_CHUNK_BYTES = 1 << 20


class FileTooLarge(Exception):
    """A stream was longer than the limit it was written under."""


class FileStore:
    """The files directory. Ids are chosen by blockq (`file-<hex>`), never by clients."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._tmp = root / ".tmp"
        # NOTE: teams' uploads and outputs: directories 0700, files 0600 (NamedTemporaryFile).
        private_dir(root)
        private_dir(self._tmp)

    def path(self, file_id: str) -> Path:
        assert "/" not in file_id and not file_id.startswith("."), file_id
        return self.root / file_id

    def open(self, file_id: str) -> BinaryIO:
        return self.path(file_id).open("rb")

    def delete(self, file_id: str) -> None:
        self.path(file_id).unlink(missing_ok=True)

    @contextmanager
    def writer(self, file_id: str) -> Iterator[IO[bytes]]:
        """A file to write `file_id` into; it appears under its id only if the block succeeds."""
        handle = tempfile.NamedTemporaryFile(dir=self._tmp, delete=False)  # noqa: SIM115
        try:
            with handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(handle.name, self.path(file_id))
        except BaseException:
            Path(handle.name).unlink(missing_ok=True)
            raise

    def save(self, file_id: str, source: IO[bytes], *, max_bytes: int) -> int:
        """Copy `source` to `file_id` in chunks; returns its size. Raises FileTooLarge past
        `max_bytes` (and keeps nothing)."""
        written = 0
        with self.writer(file_id) as target:
            while chunk := source.read(COPY_CHUNK_BYTES):
                written += len(chunk)
                if written > max_bytes:
                    raise FileTooLarge(f"more than {max_bytes} bytes")
                target.write(chunk)
        return written


def file_store(settings: Settings) -> FileStore:
    return FileStore(settings.resolved_files_dir)

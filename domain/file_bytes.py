"""The bytes of the Files API: on local disk (one file per id in the files directory), or in the
database (numbered chunks in `file_chunks`), as `Settings.files_storage` says.

Both keep the same promises. A writer's file appears under its id only when the writer's block
succeeds, so a reader never sees half a file and a crashed writer leaves nothing a reader finds.
Nothing here reads a whole file into memory: uploads and batch outputs are streamed in, contents
are streamed out, a chunk at a time.

Why the database and not PostgreSQL's large objects: chunks of `bytea` are ordinary rows, so a
file's bytes go with a plain DELETE, pg_dump and replication take them like any other row, and
the same code runs on SQLite (tests, `blockq serve` without PostgreSQL). Large objects need
lo_unlink (or a trigger, or vacuumlo) to be freed, have owners and privileges of their own, and
psycopg 3 has no client API for them. The disk keeps the one-host default: nothing to migrate,
and no database traffic for files.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO, Any, BinaryIO, Protocol

from sqlalchemy import delete, func, insert, select

from domain.db import Database
from domain.models import FileChunk
from domain.private_paths import private_dir
from domain.settings import Settings

__all__ = ["FileStore", "DiskFileStore", "DatabaseFileStore", "FileTooLarge", "file_store"]

COPY_CHUNK_BYTES = 1 << 20


class FileTooLarge(Exception):
    """A stream was longer than the limit it was written under."""


class FileStore(Protocol):
    """Where file contents live. Ids are chosen by blockq (`file-<hex>`), never by clients."""

    def open(self, file_id: str) -> BinaryIO:
        """The file's bytes to read; FileNotFoundError if there is no such file."""

    def size(self, file_id: str) -> int:
        """The file's size in bytes; FileNotFoundError if there is no such file."""

    def delete(self, file_id: str) -> None:
        """Forget the file's bytes (nothing happens if there are none)."""

    def writer(self, file_id: str) -> AbstractContextManager[IO[bytes]]:
        """A file to write `file_id` into; it appears under its id only if the block succeeds."""

    def save(self, file_id: str, source: IO[bytes], *, max_bytes: int) -> int:
        """Copy `source` to `file_id` in chunks; returns its size. Raises FileTooLarge past
        `max_bytes` (and keeps nothing)."""


def _copy(source: IO[bytes], target: IO[bytes], max_bytes: int) -> int:
    written = 0
    while chunk := source.read(COPY_CHUNK_BYTES):
        written += len(chunk)
        if written > max_bytes:
            raise FileTooLarge(f"more than {max_bytes} bytes")
        target.write(chunk)
    return written


class DiskFileStore:
    """The files directory. Writers fill a temporary file in `<root>/.tmp` and rename it into
    place when complete."""

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

    def size(self, file_id: str) -> int:
        return self.path(file_id).stat().st_size

    def delete(self, file_id: str) -> None:
        self.path(file_id).unlink(missing_ok=True)

    @contextmanager
    def writer(self, file_id: str) -> Iterator[IO[bytes]]:
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
        with self.writer(file_id) as target:
            return _copy(source, target, max_bytes)


class _ChunkWriter(io.RawIOBase):
    """Buffers writes into COPY_CHUNK_BYTES chunks, each inserted as one row on `connection`
    (inside the writer's transaction)."""

    def __init__(self, connection: Any, file_id: str) -> None:
        super().__init__()
        self._connection, self._file_id = connection, file_id
        self._buffer = bytearray()
        self._seq = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self._buffer += data
        while len(self._buffer) >= COPY_CHUNK_BYTES:
            self._insert(bytes(self._buffer[:COPY_CHUNK_BYTES]))
            del self._buffer[:COPY_CHUNK_BYTES]
        return len(data)

    def finish(self) -> None:
        """The last (possibly empty) chunk: an empty file still has its chunk 0."""
        if self._buffer or self._seq == 0:
            self._insert(bytes(self._buffer))
            self._buffer.clear()

    def _insert(self, data: bytes) -> None:
        self._connection.execute(
            insert(FileChunk).values(file_id=self._file_id, seq=self._seq, data=data))
        self._seq += 1


class _ChunkReader(io.RawIOBase):
    """Reads a file's chunks one at a time, each by its own short statement (no transaction
    held while a client downloads). A file deleted while read ends the read with an error."""

    def __init__(self, store: DatabaseFileStore, file_id: str, first: bytes) -> None:
        super().__init__()
        self._store, self._file_id = store, file_id
        self._chunk, self._offset, self._seq = first, 0, 0
        self._at_end = False

    def readable(self) -> bool:
        return True

    def readinto(self, target: bytearray | memoryview) -> int:  # type: ignore[override]
        while self._offset >= len(self._chunk):
            if self._at_end:
                return 0
            following = self._store.chunk(self._file_id, self._seq + 1)
            if following is None:
                # One DELETE removes every chunk: with chunk 0 still there, this is the end.
                if self._store.chunk(self._file_id, 0) is None:
                    raise OSError(f"file {self._file_id} was deleted while it was read")
                self._at_end = True
                return 0
            self._seq, self._chunk, self._offset = self._seq + 1, following, 0
        n = min(len(target), len(self._chunk) - self._offset)
        target[:n] = self._chunk[self._offset:self._offset + n]
        self._offset += n
        return n


class DatabaseFileStore:
    """File contents as numbered chunks in the table `file_chunks`. A writer inserts its chunks
    in one transaction of its own, committed when its block succeeds."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def chunk(self, file_id: str, seq: int) -> bytes | None:
        with self.db.autocommit() as connection:
            return connection.scalar(select(FileChunk.data).where(
                FileChunk.file_id == file_id, FileChunk.seq == seq))

    def open(self, file_id: str) -> BinaryIO:
        first = self.chunk(file_id, 0)
        if first is None:
            raise FileNotFoundError(file_id)
        return io.BufferedReader(_ChunkReader(self, file_id, first),  # type: ignore[return-value]
                                 buffer_size=COPY_CHUNK_BYTES)

    def size(self, file_id: str) -> int:
        with self.db.autocommit() as connection:
            count, size = connection.execute(
                select(func.count(), func.coalesce(func.sum(func.length(FileChunk.data)), 0))
                .where(FileChunk.file_id == file_id)).one()
        if not count:
            raise FileNotFoundError(file_id)
        return int(size)

    def delete(self, file_id: str) -> None:
        with self.db.autocommit() as connection:
            connection.execute(delete(FileChunk).where(FileChunk.file_id == file_id))

    @contextmanager
    def writer(self, file_id: str) -> Iterator[IO[bytes]]:
        with self.db.engine.begin() as connection:
            chunks = _ChunkWriter(connection, file_id)
            yield chunks  # type: ignore[misc]
            chunks.finish()

    def save(self, file_id: str, source: IO[bytes], *, max_bytes: int) -> int:
        with self.writer(file_id) as target:
            return _copy(source, target, max_bytes)


def file_store(settings: Settings, db: Database | None = None
               ) -> DiskFileStore | DatabaseFileStore:
    """The store `settings.files_storage` names; the database one needs `db`."""
    if settings.files_storage == "database":
        if db is None:
            raise ValueError("files_storage=database needs the database")
        return DatabaseFileStore(db)
    return DiskFileStore(settings.resolved_files_dir)

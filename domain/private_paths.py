"""Directories and files only blockq's own user may read: the data directory, logs, generated
secrets, stored files. Modes are set explicitly (0700 directories, 0600 files), whatever the
process's umask, and a path that already exists with a looser mode is tightened."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import BinaryIO

logger = logging.getLogger(__name__)

__all__ = ["private_dir", "open_private_append", "tighten", "DIR_MODE", "FILE_MODE"]

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """`path` as a directory of mode 0700 (created with its parents if missing)."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    tighten(path, DIR_MODE)
    return path


def open_private_append(path: Path) -> BinaryIO:
    """`path` opened for appending, created with mode 0600 (an existing file is tightened)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) & FILE_MODE)
    return os.fdopen(fd, "ab")


def tighten(path: Path, mode: int) -> None:
    """Remove from `path`'s permissions every bit `mode` does not grant (never widens). A path
    another user owns (a mounted volume's root) cannot be changed: that is logged, not raised."""
    current = stat.S_IMODE(path.stat().st_mode)
    if not current & ~mode:
        return
    try:
        path.chmod(current & mode)
    except PermissionError:
        logger.warning("%s has mode %o and is not ours to tighten to %o", path, current,
                       current & mode)

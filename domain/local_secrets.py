"""Secrets a local deployment may leave unset: generated once into data_dir (mode 0600) and
read from there afterwards, so every process of the stack agrees without the secret ever
appearing in a command line, a setting dump or a log."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

from pydantic import SecretStr

from domain.private_paths import FILE_MODE, private_dir, tighten

__all__ = ["configured_or_generated", "new_flower_basic_auth"]


def configured_or_generated(configured: SecretStr | None, path: Path,
                            generate: Callable[[], str]) -> str:
    """The configured secret, else the one in `path`, else a new one written there."""
    if configured is not None:
        return configured.get_secret_value()
    if not path.exists():
        private_dir(path.parent)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        except FileExistsError:
            pass  # another process made it first: read theirs
        else:
            with os.fdopen(fd, "w") as handle:
                handle.write(generate())
    tighten(path, FILE_MODE)  # one made by an older version, or copied in, may be looser
    return path.read_text().strip()


def new_flower_basic_auth() -> str:
    return f"admin:{secrets.token_urlsafe(18)}"

"""Where the signing secret comes from: Settings, or a file generated once in data_dir."""

from __future__ import annotations

import os

from app.settings import Settings
from workers.webhooks.signing import new_secret

__all__ = ["webhook_secret"]


def webhook_secret(settings: Settings) -> str:
    if settings.webhook_secret is not None:
        return settings.webhook_secret.get_secret_value()
    path = settings.data_dir / "webhook_secret"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(new_secret())
    return path.read_text().strip()

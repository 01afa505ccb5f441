"""Where the signing secret comes from: Settings, or a file generated once in data_dir."""

from __future__ import annotations

from app.local_secrets import configured_or_generated
from app.settings import Settings
from workers.webhooks.signing import new_secret

__all__ = ["webhook_secret"]


def webhook_secret(settings: Settings) -> str:
    return configured_or_generated(settings.webhook_secret, settings.data_dir / "webhook_secret",
                                   new_secret)

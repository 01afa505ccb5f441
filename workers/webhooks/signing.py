"""Standard Webhooks signatures (https://www.standardwebhooks.com): pure functions, no I/O."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence

from domain.team_secrets import SECRET_PREFIX as _PREFIX
from domain.team_secrets import new_secret

__all__ = ["new_secret", "sign", "signed_headers", "verify"]


def _key(secret: str) -> bytes:
    if not secret.startswith(_PREFIX):
        raise ValueError("webhook secrets start with 'whsec_'")
    return base64.b64decode(secret.removeprefix(_PREFIX))


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "id.timestamp.body">`."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(secrets: str | Sequence[str], msg_id: str, timestamp: int, body: bytes
                   ) -> dict[str, str]:
    """The Standard Webhooks headers, with one signature per secret (space-separated): a team
    rotating its secret has two in force during the grace period."""
    if isinstance(secrets, str):
        secrets = [secrets]
    if not secrets:
        raise ValueError("no signing secret")
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(sign(s, msg_id, timestamp, body) for s in secrets),
        "content-type": "application/json",
    }


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """True when one of the space-separated v1 signatures matches."""
    expected = sign(secret, headers["webhook-id"], int(headers["webhook-timestamp"]), body)
    return any(
        hmac.compare_digest(expected, candidate)
        for candidate in headers["webhook-signature"].split()
    )

"""Session affinity, the API's side: a client names its conversation (the `x-session-id`
header, the native body's `session_id`, or, on the OpenAI endpoints without either, the body's
`user`), and the request keeps a digest of it with its team (`session_key`). The router sends a
session's next turn to the instance that served the previous one while that instance has room
(workers/route/affinity.py): that instance holds the conversation's prefix in its cache.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from domain.errors import InvalidRequest

__all__ = ["SESSION_HEADER", "MAX_SESSION_ID_LEN", "session_from_headers", "session_key"]

#: The header naming the conversation a request belongs to.
SESSION_HEADER = "x-session-id"
MAX_SESSION_ID_LEN = 256


def session_from_headers(headers: Mapping[str, str]) -> str | None:
    """The `x-session-id` header's value (400 when empty or too long); None without it."""
    raw = headers.get(SESSION_HEADER)
    if raw is None:
        return None
    value = raw.strip()
    if not 0 < len(value) <= MAX_SESSION_ID_LEN or not value.isprintable():
        raise InvalidRequest(f"Invalid value for header '{SESSION_HEADER}': 1 to "
                             f"{MAX_SESSION_ID_LEN} printable characters are expected.",
                             param=SESSION_HEADER, code="invalid_value")
    return value


def session_key(team_id: str | None, session_id: str | None) -> str | None:
    """The stored key of a team's session: a digest, so two teams' ids never meet and the id
    itself is kept nowhere; None without a session."""
    if not session_id:
        return None
    digest = hashlib.sha256(f"{team_id or ''}\x00{session_id}".encode())
    return digest.hexdigest()[:32]

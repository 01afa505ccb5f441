"""A webhook receiver on 127.0.0.1 that records every delivery the stack makes, and the signing
secret a team's deliveries are verified with."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sqlalchemy import select

from domain.db import Database
from domain.models import Batch, Team
from domain.team_secrets import secrets_in_force
from tests.environment import free_port


def team_webhook_secret(database_url: str, *, team_name: str | None = None,
                        batch_id: str | None = None) -> str:
    """The current webhook signing secret of a team, named or the owner of a batch."""
    db = Database(database_url)
    try:
        with db.session() as session:
            if batch_id is not None:
                team_id = session.scalar(select(Batch.team_id).where(Batch.id == batch_id))
            else:
                team_id = session.scalar(select(Team.id).where(Team.name == team_name))
            assert team_id is not None, (team_name, batch_id)
            return secrets_in_force(session, team_id)[0]
    finally:
        db.dispose()


class WebhookReceiver:
    """Records every delivery; `/flaky` answers 500 to the first two attempts of each event."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[str, dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["content-length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver.lock:
                    receiver.deliveries.append((self.path, headers, body))
                    seen = sum(
                        1
                        for p, h, _ in receiver.deliveries
                        if p == self.path and h["webhook-id"] == headers["webhook-id"]
                    )
                failing = self.path == "/flaky" and seen <= 2
                self.send_response(500 if failing else 200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()

"""The webhook receiver: records every delivery, checks its signature, fails first attempts."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from workers.webhooks.signing import verify


@dataclass
class Delivery:
    path: str
    webhook_id: str
    payload: dict[str, Any] | None
    signature_ok: bool
    answered: int
    at: float


class WebhookReceiver:
    """Records every delivery and checks its signature against `secrets` (the teams' signing
    secrets, added once the teams exist); answers 500 to the first `fail_first` attempts of each
    event (by webhook-id), 200 after. Listens on `host` (a free port)."""

    def __init__(self, fail_first: int, host: str = "127.0.0.1") -> None:
        self.secrets: list[str] = []
        self.deliveries: list[Delivery] = []
        self.lock = threading.Lock()
        attempts: Counter[str] = Counter()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                webhook_id = headers.get("webhook-id", "")
                try:
                    signature_ok = any(verify(s, headers, body) for s in list(receiver.secrets))
                except (KeyError, ValueError):
                    signature_ok = False
                try:
                    payload = json.loads(body)
                except ValueError:
                    payload = None
                with receiver.lock:
                    attempts[webhook_id] += 1
                    answered = 500 if attempts[webhook_id] <= fail_first else 200
                    receiver.deliveries.append(Delivery(self.path, webhook_id, payload,
                                                        signature_ok, answered, time.time()))
                self.send_response(answered)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def snapshot(self) -> list[Delivery]:
        with self.lock:
            return list(self.deliveries)

    def close(self) -> None:
        self.server.shutdown()

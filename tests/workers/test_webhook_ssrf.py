"""Webhook deliveries cannot be aimed at internal addresses (SSRF), cannot be redirected, cannot
hold a worker past the deadline, and read a capped response.

No packet leaves this machine: refusals are tested with a resolver that answers internal
addresses for names under `.test`, and the test asserts that no socket connect was attempted;
the only servers really connected to listen on 127.0.0.1 (allow-listed where needed).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpcore
import pytest
from sqlalchemy import select, update

from domain.models import (
    InferenceRequest,
    RequestStatus,
    Team,
    TeamWebhookSecret,
    WebhookDelivery,
    utcnow,
)
from domain.team_secrets import rotate_secret, secrets_in_force
from domain.teams import create_team, team_by_name
from tests.environment import free_port
from tests.stack.webhook_receiver import WebhookReceiver
from workers.health.undelivered import WebhookPolicy, overdue_events
from workers.runtime import Runtime
from workers.webhooks import transport
from workers.webhooks.delivery import attempt_delivery
from workers.webhooks.signing import verify

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)
REAL_GETADDRINFO = socket.getaddrinfo


class Network:
    """Fake DNS for `*.test` names and a record of every connect attempted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answers: dict[str, list[list[str]]] = {}  # name -> one address list per lookup
        self.lookups: list[str] = []
        self.connects: list[Any] = []
        real_connect = socket.create_connection

        def getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
            if _is_address(host):  # socket.create_connection's own numeric lookup: no DNS
                return REAL_GETADDRINFO(host, port, *args, **kwargs)
            self.lookups.append(host)
            if host not in self.answers:
                assert host.endswith((".test", "localhost")), f"unexpected lookup of {host}"
                return REAL_GETADDRINFO(host, port, *args, **kwargs)
            answers = self.answers[host]
            ips = answers.pop(0) if len(answers) > 1 else answers[0]
            return [(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM, 6,
                     "", (ip, port)) for ip in ips]

        def create_connection(address: Any, *args: Any, **kwargs: Any) -> socket.socket:
            self.connects.append(address)
            assert ipaddress.ip_address(address[0]) in LOOPBACK[0], address  # never leave
            return real_connect(address, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        monkeypatch.setattr(socket, "create_connection", create_connection)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@pytest.fixture
def network(monkeypatch: pytest.MonkeyPatch) -> Network:
    return Network(monkeypatch)


class Server:
    """A 127.0.0.1 server: /ok answers 200, /redirect a 302 to the metadata address, /big 10 MB,
    /drip one byte every 0.1 s."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []  # (path, Host header)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers["content-length"]))
                server.requests.append((self.path, self.headers["host"]))
                try:
                    getattr(self, "reply_" + self.path.strip("/"))()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up: what the test wants

            def reply_ok(self) -> None:
                self._head(200, 2)
                self.wfile.write(b"ok")

            def reply_redirect(self) -> None:
                self.send_response(302)
                self.send_header("location", "http://169.254.169.254/latest/meta-data/")
                self.send_header("content-length", "0")
                self.end_headers()

            def reply_big(self) -> None:
                self._head(500, 10_000_000)
                for _ in range(1000):
                    self.wfile.write(b"x" * 10_000)

            def reply_drip(self) -> None:
                self._head(200, 600)
                for _ in range(600):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.1)

            def _head(self, status: int, length: int) -> None:
                self.send_response(status)
                self.send_header("content-length", str(length))
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server()
    yield running
    running.close()


def _post(url: str, *, allowed: Any = (), deadline_s: float = 2.0) -> transport.Response:
    return transport.post(url, b"{}", {"content-type": "application/json"}, allowed=allowed,
                          deadline_s=deadline_s)


@pytest.mark.parametrize(("ips", "named"), [
    (["10.0.0.5"], "a private address"),
    (["169.254.169.254"], "a link-local address"),
    (["fd00::1"], "a private address"),
    (["100.64.1.1"], "a carrier-grade NAT address"),
    (["::ffff:127.0.0.1"], "a loopback address"),
    (["127.0.0.1"], "a loopback address"),  # not allow-listed here
    (["0.0.0.0"], "the unspecified address"),
    (["224.0.0.1"], "a multicast address"),
    # One bad address among good ones is enough: the connection could go to any of them.
    (["93.184.215.14", "192.168.1.10"], "a private address"),
])
def test_a_name_resolving_to_a_refused_address_is_refused_before_any_connect(
    network: Network, ips: list[str], named: str,
) -> None:
    network.answers["hooks.test"] = [ips]
    with pytest.raises(transport.DestinationRefused, match=named) as refused:
        _post("https://hooks.test/hook")
    assert "hooks.test (resolves to" in str(refused.value)
    assert network.lookups == ["hooks.test"] and network.connects == []


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/", "http://[fd00::1]/", "http://10.1.2.3:8080/x",
    "http://[::ffff:10.0.0.1]/", "http://127.0.0.1:5432/", "http://[::]/",
])
def test_a_literal_refused_address_is_refused_without_lookup_or_connect(
    network: Network, url: str,
) -> None:
    with pytest.raises(transport.DestinationRefused, match="webhooks may not be sent to"):
        _post(url)
    assert network.lookups == [] and network.connects == []


@pytest.mark.parametrize(("url", "problem"), [
    ("http://user:secret@hooks.test/", "credentials"),
    ("file:///etc/passwd", "http or https"),
    ("gopher://hooks.test/", "http or https"),
    ("http://hooks.test/" + "a" * 3000, "at most 2048"),
])
def test_a_bad_url_is_refused_before_anything(network: Network, url: str, problem: str) -> None:
    with pytest.raises(transport.DestinationRefused, match=problem):
        _post(url)
    assert network.lookups == [] and network.connects == []


def test_the_connection_goes_to_the_checked_address_not_a_second_lookup(
    network: Network, server: Server,
) -> None:
    """DNS rebinding: the first answer is checked, later ones would name an internal address;
    there is no later lookup, and TLS/Host still use the name."""
    network.answers["rebind.test"] = [["127.0.0.1"], ["10.0.0.5"]]
    response = _post(f"http://rebind.test:{server.port}/ok", allowed=LOOPBACK)
    assert response.status_code == 200
    assert network.lookups == ["rebind.test"]
    assert network.connects == [("127.0.0.1", server.port)]
    assert server.requests == [("/ok", f"rebind.test:{server.port}")]


def test_redirects_are_not_followed(network: Network, server: Server) -> None:
    response = _post(f"http://127.0.0.1:{server.port}/redirect", allowed=LOOPBACK)
    assert (response.status_code, response.location) == (
        302, "http://169.254.169.254/latest/meta-data/")
    assert len(network.connects) == 1 and [p for p, _ in server.requests] == ["/redirect"]


def test_a_slow_drip_server_cannot_hold_the_delivery_past_its_deadline(server: Server) -> None:
    started = time.monotonic()
    with pytest.raises(httpcore.TimeoutException):
        _post(f"http://127.0.0.1:{server.port}/drip", allowed=LOOPBACK, deadline_s=1.0)
    # Each byte comes within any per-read timeout; only a total deadline ends it (60 s of drip).
    assert time.monotonic() - started < 1.5


def test_the_response_read_is_capped(server: Server) -> None:
    started = time.monotonic()
    response = _post(f"http://127.0.0.1:{server.port}/big", allowed=LOOPBACK)
    assert response.status_code == 500
    assert len(response.body) == transport.RESPONSE_READ_LIMIT
    assert time.monotonic() - started < 1.0


@pytest.fixture
def request_to(rt: Runtime, routed_request: Callable[..., str]) -> Callable[..., str]:
    """A succeeded request of a new team with a webhook to `url`; returns its id."""

    def make(url: str, team: str = "hooks") -> str:
        request_id = routed_request("gpu.0", 1, RequestStatus.SUCCEEDED)
        with rt.db.session() as session:
            team_id = create_team(session, team).id
            session.execute(update(InferenceRequest).where(InferenceRequest.id == request_id)
                            .values(webhook_url=url, team_id=team_id))
        return request_id

    return make


def test_a_refused_delivery_is_recorded_once_and_never_retried(
    rt: Runtime, request_to: Callable[..., str], network: Network,
) -> None:
    network.answers["internal.test"] = [["10.0.0.5"]]
    request_id = request_to("http://internal.test:8080/hook")

    outcomes = [attempt_delivery(rt.db, rt.settings, request_id, "request.succeeded")
                for _ in range(2)]

    assert [(o.number, o.succeeded, o.permanent) for o in outcomes if o] == [
        (1, False, True), (1, False, True)]
    assert network.connects == []
    with rt.db.session() as session:
        rows = session.execute(select(WebhookDelivery.permanent, WebhookDelivery.error)).all()
        policy = WebhookPolicy(backoff_s=0.0, max_attempts=6, grace_s=0.0)
        overdue = overdue_events(session, policy, utcnow() + timedelta(minutes=5))
    assert len(rows) == 1 and rows[0].permanent
    assert rows[0].error.startswith("refused: webhooks may not be sent to internal.test "
                                    "(resolves to 10.0.0.5): it is a private address")
    assert overdue == []  # the sweep does not send it again either


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    server = WebhookReceiver()
    yield server
    server.close()


def test_redirect_and_error_answers_are_recorded_as_failures(
    rt: Runtime, request_to: Callable[..., str], server: Server,
) -> None:
    request_id = request_to(f"http://127.0.0.1:{server.port}/redirect")
    outcome = attempt_delivery(rt.db, rt.settings, request_id, "request.succeeded")
    assert outcome is not None and not outcome.succeeded and not outcome.permanent
    with rt.db.session() as session:
        row = session.scalars(select(WebhookDelivery)).one()
    assert (row.status_code, row.error) == (
        302, "redirect to http://169.254.169.254/latest/meta-data/ not followed")


def test_each_team_signs_with_its_own_secret_and_rotation_keeps_both_for_the_grace(
    rt: Runtime, request_to: Callable[..., str], receiver: WebhookReceiver,
) -> None:
    mine = request_to(f"{receiver.url}/ok", team="team-a")
    theirs = request_to(f"{receiver.url}/ok", team="team-b")
    for request_id in (mine, theirs):
        attempt_delivery(rt.db, rt.settings, request_id, "request.succeeded")
    secret_a, secret_b = _current_secret(rt, "team-a"), _current_secret(rt, "team-b")
    (_, a_headers, a_body), (_, b_headers, b_body) = receiver.deliveries
    assert verify(secret_a, a_headers, a_body) and verify(secret_b, b_headers, b_body)
    assert not verify(secret_a, b_headers, b_body)  # team A cannot check (or forge) B's events
    assert not verify(rt.settings.webhook_secret.get_secret_value(),  # type: ignore[union-attr]
                      a_headers, a_body)  # nor is the global secret used for a team's events

    with rt.db.session() as session:
        rotated = rotate_secret(session, team_by_name(session, "team-a"),
                                grace=timedelta(hours=24))
    during = _deliver_again(rt, receiver, mine, "request.cancelled")
    assert len(during[0]["webhook-signature"].split()) == 2
    assert verify(secret_a, *during) and verify(rotated.secret, *during)

    with rt.db.session() as session:  # the grace is over (24 h later)
        session.execute(update(TeamWebhookSecret).where(TeamWebhookSecret.expires_at.is_not(None))
                        .values(expires_at=utcnow() - timedelta(seconds=1)))
    after = _deliver_again(rt, receiver, mine, "request.failed")
    assert after[0]["webhook-signature"].count("v1,") == 1
    assert verify(rotated.secret, *after) and not verify(secret_a, *after)


def _current_secret(rt: Runtime, team: str) -> str:
    with rt.db.session() as session:
        team_id: Team = team_by_name(session, team)
        return secrets_in_force(session, team_id.id)[0]


def _deliver_again(rt: Runtime, receiver: WebhookReceiver, request_id: str, event_type: str
                   ) -> tuple[dict[str, str], bytes]:
    """Deliver another event of the request (its own event id); the headers and body sent."""
    outcome = attempt_delivery(rt.db, rt.settings, request_id, event_type)
    assert outcome is not None and outcome.succeeded
    _, headers, body = receiver.deliveries[-1]
    return headers, body

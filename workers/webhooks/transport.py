"""The HTTP POST of one webhook delivery, safe against server-side request forgery.

- The host is resolved here, every address it resolves to is checked (app/webhook_targets), and
  the connection goes to a checked address: no second lookup a rebinding DNS server could answer
  differently. TLS still verifies the certificate against the URL's host name.
- Redirects are not followed (httpcore follows none), proxies from the environment are not used.
- One deadline covers the whole attempt (resolution, connect, TLS, send, read): every socket
  operation gets at most the time left, so a server dripping a byte a second cannot hold the
  worker past it.
- At most `RESPONSE_READ_LIMIT` bytes of the response are read.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import httpcore

from domain.webhook_targets import IPAddress, IPNetwork, address_refusal, url_problem

__all__ = ["RESPONSE_READ_LIMIT", "DestinationRefused", "DeadlineExceeded", "Response", "post"]

RESPONSE_READ_LIMIT = 4096

#: getaddrinfo has no timeout of its own: it runs here, and the attempt waits at most its
#: deadline for it.
_resolvers = ThreadPoolExecutor(max_workers=16, thread_name_prefix="webhook-dns")


class DestinationRefused(Exception):
    """The URL may not be delivered to (it resolves to a refused address): a permanent failure."""


class DeadlineExceeded(httpcore.TimeoutException):
    """The attempt's total deadline passed."""


@dataclass(frozen=True, slots=True)
class Response:
    status_code: int
    body: bytes  # at most RESPONSE_READ_LIMIT bytes
    location: str | None  # of a redirect, which is not followed


def post(url: str, body: bytes, headers: dict[str, str], *, allowed: Iterable[IPNetwork],
         deadline_s: float) -> Response:
    """POST `body` to `url` within `deadline_s` seconds. Raises DestinationRefused, or an
    httpcore exception (connect error, timeout, protocol error) for a failure worth retrying."""
    problem = url_problem(url)
    if problem:
        raise DestinationRefused(problem)
    deadline = time.monotonic() + deadline_s
    backend = GuardedBackend(tuple(allowed), deadline)
    timeouts = dict.fromkeys(("connect", "read", "write", "pool"), deadline_s)
    request_headers = [*headers.items(), ("content-length", str(len(body)))]
    with httpcore.ConnectionPool(ssl_context=ssl.create_default_context(), retries=0,
                                 network_backend=backend, max_connections=1) as pool, \
            pool.stream("POST", url, headers=request_headers, content=body,
                        extensions={"timeout": timeouts}) as response:
        data = _read_capped(response)
        location = next((v.decode("latin-1") for k, v in response.headers
                         if k.lower() == b"location"), None)
    return Response(response.status, data, location)


def _read_capped(response: httpcore.Response) -> bytes:
    data = b""
    for chunk in response.iter_stream():
        data += chunk
        if len(data) >= RESPONSE_READ_LIMIT:
            break
    return data[:RESPONSE_READ_LIMIT]


class GuardedBackend(httpcore.NetworkBackend):
    """httpcore's network backend that resolves and checks before it connects, and holds every
    stream to the deadline."""

    def __init__(self, allowed: tuple[IPNetwork, ...], deadline: float) -> None:
        self._allowed = allowed
        self._deadline = deadline
        self._sockets = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None, socket_options: Any = None
                    ) -> httpcore.NetworkStream:
        addresses = self.checked_addresses(host, port)
        error: Exception | None = None
        for ip in addresses:
            try:
                stream = self._sockets.connect_tcp(
                    str(ip), port, timeout=left(self._deadline, timeout),
                    local_address=local_address, socket_options=socket_options)
            except httpcore.ConnectError as exc:
                error = exc
                continue
            return DeadlineStream(stream, self._deadline)
        raise error or httpcore.ConnectError(f"{host} has no address")

    def checked_addresses(self, host: str, port: int) -> list[IPAddress]:
        """Every address `host` resolves to, or DestinationRefused if any of them is refused."""
        addresses = resolve(host, port, left(self._deadline, None))
        for ip in addresses:
            refusal = address_refusal(ip, self._allowed)
            if refusal:
                shown = host if host == str(ip) else f"{host} (resolves to {ip})"
                raise DestinationRefused(f"webhooks may not be sent to {shown}: it is {refusal}")
        return addresses

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def resolve(host: str, port: int, timeout: float) -> list[IPAddress]:
    """The addresses of `host` (a literal address is its own), in getaddrinfo's order."""
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    future = _resolvers.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    try:
        infos = future.result(timeout=timeout)
    except FutureTimeout:
        raise DeadlineExceeded(f"resolving {host} took longer than the deadline") from None
    except OSError as exc:
        raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from None
    found: list[IPAddress] = []
    for *_, sockaddr in infos:
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])  # drop an IPv6 scope id
        if ip not in found:
            found.append(ip)
    return found


def left(deadline: float, timeout: float | None) -> float:
    """The time an operation may take: what is left of the deadline (at most `timeout`)."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise DeadlineExceeded("the webhook delivery deadline passed")
    return remaining if timeout is None else min(timeout, remaining)


class DeadlineStream(httpcore.NetworkStream):
    """A connected stream whose reads and writes end by the deadline."""

    def __init__(self, inner: httpcore.NetworkStream, deadline: float) -> None:
        self._inner = inner
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, left(self._deadline, timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, left(self._deadline, timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname,
                                      left(self._deadline, timeout))
        return DeadlineStream(inner, self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)

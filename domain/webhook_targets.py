"""Where webhooks may go: only to public addresses, unless an operator allows a network.

A webhook is a POST the platform sends from inside its network to a URL a team chose, so a URL
naming (or resolving to) loopback, a private range or a cloud metadata address would let a team
reach internal services (server-side request forgery). The checks here are pure (no I/O): the
API refuses what it can see in the URL itself; the webhook worker checks every address a name
resolves to and connects only to a checked one (workers/webhooks/transport.py).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from domain.errors import InvalidRequest

__all__ = ["MAX_URL_LENGTH", "IPAddress", "IPNetwork", "address_refusal", "url_problem",
           "check_submitted_url"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_URL_LENGTH = 2048
_SCHEMES = ("http", "https")


def address_refusal(ip: IPAddress, allowed: Iterable[IPNetwork] = ()) -> str | None:
    """Why a webhook may not be sent to `ip` ("a loopback address" ...), or None when it may:
    a public unicast address, or one inside an allowed network."""
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    candidates: list[IPAddress] = [mapped] if mapped else [*_embedded_ipv4(ip), ip]
    if any(c in net for c in candidates for net in allowed if c.version == net.version):
        return None
    for candidate in candidates:
        reason = _non_public(candidate)
        if reason:
            return reason
    return None


def _embedded_ipv4(ip: IPAddress) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses a 6to4 or Teredo address carries."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    found = [ip.sixtofour, *(ip.teredo or ())]
    return [a for a in found if a is not None]


def _non_public(ip: IPAddress) -> str | None:
    checks = (
        (ip.is_unspecified, "the unspecified address"),
        (ip.is_loopback, "a loopback address"),
        (ip.is_link_local, "a link-local address (cloud metadata services live there)"),
        (ip.is_multicast, "a multicast address"),
        (ip in _SHARED, "a carrier-grade NAT address (100.64.0.0/10)"),
        (ip.is_private, "a private address"),
        (ip.is_reserved, "a reserved address"),
        (not ip.is_global, "an address that is not globally routable"),
    )
    return next((reason for blocked, reason in checks if blocked), None)


_SHARED = ipaddress.IPv4Network("100.64.0.0/10")


def url_problem(url: str) -> str | None:
    """What is wrong with a webhook URL on its face (no DNS): scheme, userinfo, length, host."""
    if len(url) > MAX_URL_LENGTH:
        return f"a webhook URL may be at most {MAX_URL_LENGTH} characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port out of range
    except ValueError as exc:
        return f"not a valid URL ({exc})"
    if parts.scheme.lower() not in _SCHEMES:
        return "a webhook URL must use http or https"
    if parts.username is not None or parts.password is not None:
        return "a webhook URL may not carry credentials (user:password@)"
    if not parts.hostname:
        return "a webhook URL needs a host"
    return None


def literal_address(url: str) -> IPAddress | None:
    """The IP address a URL names literally, or None when it names a host. IPv4 in the forms
    the resolver takes as addresses too (`2130706433`, `0x7f.1`, `127.1`)."""
    host = urlsplit(url).hostname or ""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))  # parses only: no lookup
    except OSError:
        return None


def check_submitted_url(url: str | None, allowed: Iterable[IPNetwork]) -> str | None:
    """The URL as submitted, or InvalidRequest (400, param webhook_url) when it is refused
    without resolving anything: bad on its face, or a literal address that is not public."""
    if url is None:
        return None
    problem = url_problem(url)
    ip = literal_address(url) if problem is None else None
    refusal = address_refusal(ip, allowed) if ip is not None else None
    if refusal:
        problem = f"webhooks may not be sent to {ip}: it is {refusal}"
    if problem:
        raise InvalidRequest(f"Invalid webhook_url: {problem}.", param="webhook_url",
                             code="invalid_webhook_url")
    return url

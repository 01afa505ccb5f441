"""HAProxy in front of the control hosts' APIs, on the balancer host."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from benchmarks.multihost.network import in_namespace


def haproxy_config(bind: str, servers: Sequence[tuple[str, str]], *, timeout_s: int) -> str:
    """Round robin over `servers` (name, address:port), each checked on /readyz every second
    and out after two failures; a request whose connection fails is sent to the other server.
    `timeout_s` must outlast the longest answer (a sync completion, a stream's silences).
    /metrics is not for clients (it answers without credentials unless the metrics token is
    set): scrapers ask each API host directly."""
    lines = [
        "global",
        "    maxconn 4096",
        "defaults",
        "    mode http",
        "    timeout connect 2s",
        f"    timeout client {timeout_s}s",
        f"    timeout server {timeout_s}s",
        "    retries 2",
        "    option redispatch",
        "frontend api",
        f"    bind {bind}",
        "    http-request deny if { path_beg /metrics }",
        "    default_backend control",
        "backend control",
        "    balance roundrobin",
        "    option httpchk GET /readyz",
        "    http-check expect status 200",
        "    default-server inter 1s fall 2 rise 1",
    ]
    lines += [f"    server {name} {address} check" for name, address in servers]
    return "\n".join(lines) + "\n"


def start_haproxy(host: str, config: str, work_dir: Path) -> subprocess.Popen[bytes]:
    path = work_dir / "haproxy.cfg"
    path.write_text(config)
    log = open(work_dir / "haproxy.log", "ab")  # noqa: SIM115 - lives with the process
    return subprocess.Popen([*in_namespace(host), "haproxy", "-f", str(path), "-db"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

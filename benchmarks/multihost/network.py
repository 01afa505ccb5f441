"""The rig's network: one network namespace per host, all on one bridge the rig creates, with
addresses of a private /24 and no route anywhere else. Every name starts with the rig's prefix,
so that a run removes what an interrupted run left (`remove_leftovers`).

The rig's own thread (load, webhook receiver, checks) works from the `client` host: `enter`
moves the calling thread into a namespace (setns(2) acts on one thread; threads started
afterwards inherit it), `leave` moves it back.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

PREFIX = "bqmh"
BRIDGE = f"{PREFIX}-br"
SUBNET = "10.213.0"
CLONE_NEWNET = 0x40000000


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=30)


def namespace(host: str) -> str:
    return f"{PREFIX}-{host}"


def in_namespace(host: str) -> list[str]:
    """The command prefix that runs a command in `host`'s namespace."""
    return ["ip", "netns", "exec", namespace(host)]


@dataclass(frozen=True)
class HostAddress:
    name: str
    number: int  # last byte of its address, also its veth's number

    @property
    def ip(self) -> str:
        return f"{SUBNET}.{self.number}"

    @property
    def veth(self) -> str:
        return f"{PREFIX}v{self.number}"


def remove_leftovers() -> list[str]:
    """Deletes every namespace and link whose name starts with the prefix, and SIGKILLs the
    processes an interrupted run left in those namespaces; what it deleted."""
    removed = []
    for line in ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(f"{PREFIX}-"):
            for pid in ip("netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            ip("netns", "del", name, check=False)
            removed.append(name)
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            link = parts[1].strip().split("@")[0]
            if link.startswith(PREFIX):
                ip("link", "del", link, check=False)
                removed.append(link)
    return removed


def create(hosts: Sequence[HostAddress]) -> None:
    """The bridge, and for each host its namespace, a veth pair (one end on the bridge, the
    other `eth0` in the namespace) and its address; loopback up everywhere."""
    ip("link", "add", BRIDGE, "type", "bridge")
    ip("link", "set", BRIDGE, "up")
    for host in hosts:
        ns = namespace(host.name)
        ip("netns", "add", ns)
        ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", host.veth, "master", BRIDGE)
        ip("link", "set", host.veth, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")


def partition(host: str, peers: Sequence[str], *, cut: bool) -> None:
    """Drop (cut=True) or allow again every packet between `host` and each of `peers`
    (addresses), inside `host`'s namespace: its connections hang as over a broken link."""
    action = "-I" if cut else "-D"
    for peer in peers:
        for chain, side in (("OUTPUT", "-d"), ("INPUT", "-s")):
            subprocess.run([*in_namespace(host), "iptables", action, chain, side, peer,
                            "-j", "DROP"], check=True, capture_output=True, timeout=30)


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


class ThreadNetns:
    """Moves the calling thread into a namespace and back (setns(2) on one thread)."""

    def __init__(self) -> None:
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)

    def enter(self, host: str) -> None:
        fd = os.open(f"/run/netns/{namespace(host)}", os.O_RDONLY)
        try:
            _setns(fd)
        finally:
            os.close(fd)

    def leave(self) -> None:
        _setns(self._home)

    def close(self) -> None:
        os.close(self._home)

"""The rig's own RabbitMQ node, on the data host (`--broker rabbitmq`): a second rabbitmq-server
beside any other on the machine, with its own node name, Mnesia directory, logs, Erlang cookie
(its HOME) and listener on the data host's address. Its epmd runs in the data host's namespace
and goes with it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from kombu import Connection

from benchmarks.multihost.network import in_namespace

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
RABBITMQCTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"
NODE = "blockq-rig@localhost"
PORT = 5672


def rabbitmq_config(host: str, consumer_timeout_ms: int) -> str:
    """The node's rabbitmq.conf: a listener on the host's address, guest allowed from other
    hosts (the rig's network only), and the consumer timeout (docs/multihost.md)."""
    return (f"listeners.tcp.default = {host}:{PORT}\n"
            "loopback_users = none\n"
            f"consumer_timeout = {consumer_timeout_ms}\n")


class OwnRabbitMQ:
    def __init__(self, root: Path, host: str, namespace_host: str,
                 consumer_timeout_ms: int = 3_600_000) -> None:
        self.root, self.host = root, host
        self.prefix = in_namespace(namespace_host)
        self.consumer_timeout_ms = consumer_timeout_ms
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{PORT}//"

    def _env(self) -> dict[str, str]:
        return {**os.environ, "HOME": str(self.root), "RABBITMQ_NODENAME": NODE,
                "RABBITMQ_MNESIA_BASE": str(self.root / "mnesia"),
                "RABBITMQ_LOG_BASE": str(self.root / "log"),
                "RABBITMQ_CONFIG_FILE": str(self.root / "rabbitmq"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
                "RABBITMQ_PID_FILE": str(self.root / "rabbitmq.pid")}

    def _as_rabbitmq(self, command: list[str]) -> list[str]:
        # runuser sets HOME to the user's: the node's cookie lives in its own HOME instead.
        return [*self.prefix, "runuser", "-u", "rabbitmq", "--", "env", f"HOME={self.root}",
                *command]

    def start(self, timeout_s: float = 120.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "rabbitmq.conf").write_text(rabbitmq_config(self.host,
                                                                 self.consumer_timeout_ms))
        (self.root / "enabled_plugins").write_text("[].\n")
        shutil.chown(self.root, "rabbitmq")
        for path in self.root.iterdir():
            shutil.chown(path, "rabbitmq")
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - lives with the process
        self.process = subprocess.Popen(self._as_rabbitmq([RABBITMQ_SERVER]), env=self._env(),
                                        cwd=self.root, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with Connection(self.url, connect_timeout=2) as connection:
                    connection.ensure_connection(max_retries=1)
                return
            except Exception:  # noqa: BLE001 - not up yet
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"RabbitMQ did not start; see {self.root}/server.log "
                                       f"and {self.root}/log") from None
                time.sleep(1)

    def queues(self) -> dict[str, tuple[int, int]]:
        """Every queue's (ready, unacknowledged) messages."""
        done = subprocess.run(
            self._as_rabbitmq([RABBITMQCTL, "-n", NODE, "-q", "list_queues", "--no-table-headers",
                               "name", "messages_ready", "messages_unacknowledged"]),
            env=self._env(), capture_output=True, text=True, timeout=60, check=True)
        result = {}
        for line in done.stdout.splitlines():
            parts = line.split()
            if len(parts) == 3:
                result[parts[0]] = (int(parts[1]), int(parts[2]))
        return result

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(self._as_rabbitmq([RABBITMQCTL, "-n", NODE, "stop"]),
                           env=self._env(), capture_output=True, timeout=60, check=False)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, 9)
        self.process.wait()


def wait_for_idle_queues(broker: OwnRabbitMQ, within_s: float, interval_s: float = 2.0) -> None:
    """Wait up to `within_s` for every queue but the delayed-delivery ones to be empty.

    NOTE: a countdown sent from a host whose clock runs ahead carries an ETA that far in the
    future of the other hosts' clocks: a worker there takes the message when the broker delivers
    it and holds it unacknowledged until its own clock reaches the ETA (docs/deploy.md,
    "Clocks"). Such a retry is late by the skew, not left over; one that stays past the skew
    is.
    """
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and _holding(broker):
        time.sleep(interval_s)


def lasting_messages(broker: OwnRabbitMQ, samples: int = 4, interval_s: float = 2.0
                     ) -> list[str]:
    """Queues holding messages in every one of a few samples (beat's periodic tasks come and
    go; the delayed-delivery queues hold countdowns that are due later, and are left out)."""
    seen: list[set[str]] = []
    for sample in range(samples):
        if sample:
            time.sleep(interval_s)
        seen.append({f"{name}: {ready} ready, {unacked} unacknowledged"
                     for name, (ready, unacked) in _holding(broker).items()})
    return sorted(set.intersection(*seen))


def _holding(broker: OwnRabbitMQ) -> dict[str, tuple[int, int]]:
    """The queues holding messages, but the delayed-delivery ones (countdowns due later)."""
    return {name: (ready, unacked) for name, (ready, unacked) in broker.queues().items()
            if (ready or unacked) and not name.startswith("celery_delayed_")}

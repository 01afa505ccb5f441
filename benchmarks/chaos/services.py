"""The run's own PostgreSQL and Redis: killing them disturbs nothing else on the machine."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import psycopg
import redis

from app.cli.stack import free_port


class OwnServices:
    """A PostgreSQL server and a Redis server of this run only, in a temporary directory.

    By default on free ports of 127.0.0.1; the multi-host rig runs them on `host` with every
    command behind `command_prefix` (`ip netns exec <its data host>`)."""

    DATABASE = "blockq_chaos"

    def __init__(self, root: Path, *, host: str = "127.0.0.1",
                 command_prefix: tuple[str, ...] = (), pg_port: int | None = None,
                 redis_port: int | None = None, max_connections: int = 400) -> None:
        self.root = root
        self.host = host
        self.command_prefix = command_prefix
        self.max_connections = max_connections
        self.pg_dir = root / "pg"
        self.pg_port = pg_port or free_port()
        self.redis_port = redis_port or free_port()
        self.redis_process: subprocess.Popen[bytes] | None = None

    @property
    def database_url(self) -> str:
        return f"postgresql+psycopg://postgres@{self.host}:{self.pg_port}/{self.DATABASE}"

    @property
    def redis_url(self) -> str:
        return f"redis://{self.host}:{self.redis_port}/0"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root: its files are postgres's
            shutil.chown(self.root, "postgres")
        self._as_postgres(["initdb", "-D", str(self.pg_dir), "-U", "postgres", "--auth=trust",
                           "-E", "UTF8", "--no-sync"])
        if self.host != "127.0.0.1":  # trust clients of the host's own subnets too
            with (self.pg_dir / "pg_hba.conf").open("a") as hba:
                hba.write("host all all samenet trust\n")
        self._pg_ctl("start")
        with psycopg.connect(self._admin_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {self.DATABASE}")
        self.start_redis()

    def stop(self) -> None:
        self.kill_redis()
        with contextlib.suppress(subprocess.CalledProcessError):
            self._pg_ctl("stop", "-m", "immediate")

    # PostgreSQL ---------------------------------------------------------------------------------
    @property
    def _admin_dsn(self) -> str:
        return f"host={self.host} port={self.pg_port} user=postgres dbname=postgres"

    def _as_postgres(self, command: list[str]) -> None:
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        command = [*self.command_prefix, *command]
        done = subprocess.run(command, capture_output=True, timeout=120, check=False)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): "
                               f"{(done.stderr or done.stdout).decode(errors='replace')[-800:]}")

    def _pg_ctl(self, action: str, *extra: str) -> None:
        # fsync off: a crash of the server (not of the OS) loses nothing; commits stay synchronous.
        options = (f"-p {self.pg_port} -k {self.pg_dir} -c listen_addresses={self.host} "
                   f"-c max_connections={self.max_connections} -c fsync=off")
        self._as_postgres(["pg_ctl", "-D", str(self.pg_dir), "-l", str(self.root / "pg.log"),
                           "-w", "-t", "60", "-o", options, action, *extra])

    def restart_postgres(self) -> None:
        """`pg_ctl -m immediate restart`: every backend dies at once, then crash recovery."""
        self._pg_ctl("restart", "-m", "immediate")

    def terminate_connections(self) -> int:
        """Ends every connection to the stack's database; how many there were."""
        with psycopg.connect(self._admin_dsn, autocommit=True, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()", (self.DATABASE,)).fetchall()
        return len(rows)

    # Redis --------------------------------------------------------------------------------------
    def start_redis(self) -> None:
        """A Redis server that keeps nothing on disk: each start is an empty one."""
        redis_dir = self.root / "redis"
        redis_dir.mkdir(exist_ok=True)
        log = open(self.root / "redis.log", "ab")  # noqa: SIM115 - lives with the process
        self.redis_process = subprocess.Popen(
            [*self.command_prefix, "redis-server", "--port", str(self.redis_port),
             "--bind", self.host, "--save", "", "--appendonly", "no", "--dir", str(redis_dir),
             # Off the loopback (the rig's data host): clients of its subnet, no password.
             "--protected-mode", "yes" if self.host == "127.0.0.1" else "no"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        client = redis.Redis.from_url(self.redis_url, socket_timeout=1)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()

    def kill_redis(self) -> None:
        if self.redis_process is not None and self.redis_process.poll() is None:
            self.redis_process.kill()
            self.redis_process.wait()

"""The local stack as processes: the API, the Celery workers (predict, predict_bulk, route, health,
batches, webhooks, one per engine instance), beat and Flower.

The processes run the same commands an operator would run by hand (docs/operations.md), with the
settings passed through the environment, and their logs written to data_dir/logs.

Supervised (`Stack.supervise()`, what `blockq serve` and `blockq demo` do), a process that exits is
restarted after a backoff that doubles from RESTART_BACKOFF_MIN_S to RESTART_BACKOFF_MAX_S and
resets once the process has stayed up STABLE_AFTER_S; the others keep running meanwhile.

The processes die with their supervisor: each gets SIGTERM, its own warm shutdown, when the
supervisor dies, even by SIGKILL (Linux's parent-death signal; gunicorn's workers follow their
master, which they watch). A started stack holds its data directory's lock (app/cli/stack_lock.py)
until its last process exits: a second stack on the same data directory is refused, naming them.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from queue import SimpleQueue
from typing import Any

import httpx

from app.cli.stack_lock import StackLock, StackRunning
from domain.celery_app import SOFT_SHUTDOWN_TIMEOUT_S
from domain.db import Database
from domain.local_secrets import configured_or_generated, new_flower_basic_auth
from domain.metrics import prepare_multiproc_dir
from domain.private_paths import open_private_append, private_dir
from domain.settings import Settings
from domain.teams import ensure_team_key

__all__ = ["Stack", "StackError", "free_port", "process_commands", "stop_stacks_on_sigterm"]

logger = logging.getLogger(__name__)

_BIN = Path(sys.executable).parent

#: First wait before restarting a process that exited; doubles on each exit in a row.
RESTART_BACKOFF_MIN_S = 0.5
#: The longest wait before a restart.
RESTART_BACKOFF_MAX_S = 10.0
#: A process up this long is healthy again: its next exit waits RESTART_BACKOFF_MIN_S.
STABLE_AFTER_S = 30.0
#: How often the supervisor looks at the processes.
SUPERVISE_POLL_S = 0.2
# NOTE: `Stack.signal` shadows the module inside the class body, where defaults are evaluated.
_SIGKILL = signal.SIGKILL

#: How long a process may take over its warm shutdown (SIGTERM) before it is pressed harder.
STOP_GRACE_S = 60.0
#: An engine worker's warm shutdown finishes every request it has admitted: the longest of them
#: may have just started (up to max_model_len tokens to decode), behind a full engine.
ENGINE_STOP_GRACE_S = 180.0
#: After SIGQUIT (Celery's cold shutdown), how long before SIGKILL.
COLD_STOP_GRACE_S = SOFT_SHUTDOWN_TIMEOUT_S + 10.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a local stack's servers)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_stacks_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit in this (main) thread, so that the `finally` blocks that stop
    a script's stacks run.

    A stack's processes run in sessions of their own: a script killed by the default SIGTERM
    action leaves them running, and they go on working on the database and Redis db that the
    next run of the script recreates (a benchmark whose requests an orphaned sweep re-routed
    for minutes)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


#: The team of the stack's own API key.
LOCAL_TEAM = "local"


class StackError(RuntimeError):
    """The stack could not start; the message says which process and where its log is."""


#: Rate limit of the teams the local stack creates for itself (demo, tests, benchmarks).
LOCAL_RATE_LIMIT_RPM = 1_000_000


def _celery(*args: str) -> list[str]:
    return [str(_BIN / "celery"), "-A", "workers", *args]


#: Celery worker options of every worker: no gossip (each worker would otherwise read every
#: other worker's heartbeat, every 2 s each: with ten workers that is the larger part of an idle
#: worker's CPU; nothing in blockq uses it, and Flower still gets the heartbeats) and no mingle
#: (a startup exchange of revoked task ids and clocks, which blockq does not use either).
WORKER_OPTIONS = ("--without-gossip", "--without-mingle")


def _worker(queues: str, name: str, concurrency: int) -> list[str]:
    """A Celery worker with a thread pool consuming `queues`, named `<name>@<host>`."""
    return _celery("worker", "-Q", queues, "-n", f"{name}@%h", "--pool", "threads",
                   "--concurrency", str(concurrency), "-l", "INFO", *WORKER_OPTIONS)


#: CPU niceness of the processes that must yield the CPU to the interactive path.
LOW_PRIORITY = {"predict_bulk": 10, "batches": 10}


def _niced(name: str, command: list[str]) -> list[str]:
    return ["nice", "-n", str(LOW_PRIORITY[name]), *command]


def set_session_niceness(pid: int, niceness: int) -> bool:
    """Give the scheduler autogroup of `pid`'s session the niceness `niceness`; False where the
    kernel has no autogroup (or refuses).

    NOTE: with Linux's autogroup scheduling (`kernel.sched_autogroup_enabled`, on by default in
    most distributions) every session competes as one unit, and a process's own nice ranks it only
    inside its session. Each stack process runs in a session of its own, so `nice -n 10` alone
    gives a bulk worker the same CPU share as the API or the predictor; its session must be niced
    too. Measured on this machine: a nice-0 process got less CPU than each of three nice-19
    processes in sessions of their own.
    """
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(niceness))
    except OSError:
        return False
    return True


#: The API's gunicorn worker: gevent's, answering gunicorn's own errors in OpenAI's format.
API_WORKER_CLASS = "app.api.gunicorn_worker.OpenAIErrorsGeventWorker"


def process_commands(settings: Settings) -> dict[str, list[str]]:
    """Name -> command line of every process of the local stack."""
    commands = {
        "api": [
            str(_BIN / "gunicorn"),
            "--bind",
            f"{settings.api_host}:{settings.api_port}",
            "--workers",
            str(settings.api_workers),
            # NOTE: gevent: a held completion (a stream, a waiting sync call) is a greenlet
            # waiting on the stream hub, not a thread; thousands fit in one worker.
            "--worker-class",
            API_WORKER_CLASS,
            "--worker-connections",
            str(settings.api_connections),
            "--graceful-timeout",
            "10",
            "--keep-alive",
            str(settings.api_keepalive_s),
            # NOTE: gunicorn 27 opens a control socket at one fixed path per user by default
            # (~/.gunicorn/gunicorn.ctl): two stacks on a host (tests, a benchmark beside them)
            # replaced each other's. blockq uses none.
            "--no-control-socket",
            "app:create_app()",
        ],
        # NOTE: many task threads let a burst meet in the length model's micro-batcher.
        "predict": _worker("predict,learn", "predict", 16),
        # Batch lines' predictions, apart from the interactive ones, at a lower CPU priority.
        "predict_bulk": _niced("predict_bulk", _worker("predict_bulk", "predict_bulk", 16)),
        "route": _worker("route", "route", 4),
        # NOTE: the health sweep has a worker of its own: behind a busy route queue (kombu reads
        # a worker's queues in a fixed order) it would wait, and stranded work with it.
        "health": _worker("health", "health", 2),
        # Batch expansion and finalization (reading, counting and writing whole files), apart
        # from routing so that large uploads never hold the router's threads; lower CPU priority.
        "batches": _niced("batches", _worker("batches", "batches", 2)),
        "webhooks": _worker("webhooks", "webhooks", 8),
        "beat": _celery("beat", "-l", "INFO", "-s", str(settings.data_dir / "celerybeat-schedule")),
        # NOTE: basic auth comes from FLOWER_BASIC_AUTH in its environment, not argv (`ps`).
        # NOTE: on flower_host (loopback only, domain/settings.py), never on api_host: its
        # /metrics and /healthcheck answer without credentials.
        "flower": _celery("flower", f"--address={settings.flower_host}",
                          f"--port={settings.flower_port}"),
    }
    for instance_id in settings.instance_ids:
        commands[instance_id] = _worker(instance_id, instance_id, settings.engine_concurrency)
    return commands


def describe_exit(returncode: int) -> str:
    """'exit code 3' or 'signal SIGKILL' (Popen's negative return code)."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


#: The signal a stack process gets when its supervisor dies: SIGTERM, the warm shutdown that
#: `Stack.stop` starts with (a Celery worker finishes its tasks, gunicorn its requests).
PARENT_DEATH_SIGNAL = signal.SIGTERM
_PR_SET_PDEATHSIG = 1
# NOTE: resolved here, before any fork: the child between fork and exec only calls it.
_prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None) if sys.platform == "linux" \
    else None


def _dies_with(parent_pid: int) -> Callable[[], None]:
    """A preexec_fn: the child gets PARENT_DEATH_SIGNAL when `parent_pid` dies.

    It survives exec (`nice` then `celery`) and goes to the direct child only: gunicorn's workers
    leave when their master does (they check their parent pid), and nothing else forks."""
    def preexec() -> None:
        if _prctl is None:
            return
        _prctl(_PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before the prctl
            os.kill(os.getpid(), PARENT_DEATH_SIGNAL)
    return preexec


class _Spawner:
    """Starts the stack's processes from one thread that lives as long as this process.

    NOTE: Linux sends the parent-death signal when the *thread* that forked the child exits,
    not its process: a child the supervisor thread restarted would be signalled when `stop()`
    ends that thread, and one a short-lived caller's thread started at once."""

    def __init__(self) -> None:
        self._requests: SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, *args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="blockq-spawner",
                                                daemon=True)
                self._thread.start()
        future: Future[subprocess.Popen[bytes]] = Future()
        self._requests.put((lambda: subprocess.Popen(*args, **kwargs), future))
        return future.result()

    def _serve(self) -> None:
        while True:
            start, future = self._requests.get()
            try:
                future.set_result(start())
            except BaseException as exc:  # the caller raises it
                future.set_exception(exc)


_SPAWNER = _Spawner()


@dataclass
class _Restarts:
    """The supervisor's record of one process: when it started, how often it was restarted."""

    started_at: float
    backoff_s: float = RESTART_BACKOFF_MIN_S
    count: int = 0
    #: When the exited process is due to start again; None while it runs.
    restart_at: float | None = None


@dataclass
class Stack:
    """Starts, watches and stops the processes of the local stack."""

    settings: Settings
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    #: An admin key of the team `LOCAL_TEAM`, issued when the stack is ready.
    api_key: str | None = None
    #: Command line of every process started, to start it again.
    commands: dict[str, list[str]] = field(default_factory=dict)
    _restarts: dict[str, _Restarts] = field(default_factory=dict, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _supervisor: threading.Thread | None = field(default=None, repr=False)
    _stopping: threading.Event = field(default_factory=threading.Event, repr=False)
    _data_lock: StackLock | None = field(default=None, repr=False)

    @property
    def api_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.settings.api_port}"

    @property
    def log_dir(self) -> Path:
        return self.settings.data_dir / "logs"

    def start(self, names: list[str] | None = None) -> None:
        """Start the processes (`names`, or all); StackError if another stack holds data_dir."""
        self.hold_data_dir()
        private_dir(self.log_dir)  # logs may name requests and errors: this user's only
        # Every process writes its metrics here for the API's /metrics; emptied on a full start.
        self.env["PROMETHEUS_MULTIPROC_DIR"] = str(prepare_multiproc_dir(
            self.settings.data_dir / "prometheus", wipe=names is None))
        # An autoscaled entry's slots beyond its starting count wait for the autoscaler.
        standby = set(self.settings.instance_ids) - set(self.settings.initial_instance_ids)
        for name, command in process_commands(self.settings).items():
            if (name in names) if names is not None else name not in standby:
                self.start_process(name, command)

    def hold_data_dir(self) -> None:
        """Take data_dir's stack lock, which every process started from now on holds too;
        StackError naming the processes of another stack that holds it."""
        if self._data_lock is None:
            private_dir(self.settings.data_dir)
            self._data_lock = StackLock(self.settings.data_dir)
        try:
            self._data_lock.acquire()
        except StackRunning as exc:
            raise StackError(str(exc)) from None

    def start_process(self, name: str, command: list[str]) -> None:
        """Start (or start again) process `name`; its output is appended to its log.

        It gets SIGTERM when this process dies, and holds data_dir's lock if this stack does."""
        env = self.env
        if name == "flower":
            env = {**env, "FLOWER_BASIC_AUTH": self.flower_basic_auth}
        lock_fd = self._data_lock.fd if self._data_lock is not None else None
        with open_private_append(self.log_dir / f"{name}.log") as log:  # the child keeps a copy
            process = _SPAWNER.popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                preexec_fn=_dies_with(os.getpid()), pass_fds=() if lock_fd is None else (lock_fd,),
            )
        if self._data_lock is not None:
            self._data_lock.record(name, process.pid)
        if name in LOW_PRIORITY:
            set_session_niceness(process.pid, LOW_PRIORITY[name])
        with self._lock:
            self.processes[name] = process
            self.commands[name] = command
            record = self._restarts.setdefault(name, _Restarts(started_at=time.monotonic()))
            record.started_at = time.monotonic()
            record.restart_at = None

    # --- supervision ----------------------------------------------------------------------------
    @property
    def supervising(self) -> bool:
        return self._supervisor is not None and self._supervisor.is_alive()

    def supervise(self) -> None:
        """Restart, from now on, every process that exits, after a backoff (module docstring).

        A background thread; `stop()` ends it before it stops the processes.
        """
        if self.supervising:
            return
        self._stopping.clear()
        self._supervisor = threading.Thread(
            target=self._supervise_loop, name="blockq-supervisor", daemon=True
        )
        self._supervisor.start()

    def restart_count(self, name: str) -> int:
        """How often the supervisor has started process `name` again."""
        with self._lock:
            record = self._restarts.get(name)
            return record.count if record else 0

    def release(self, name: str) -> subprocess.Popen[bytes] | None:
        """Stop supervising process `name` (an engine the autoscaler drains and stops itself)
        and hand it over; None if the stack does not run it."""
        with self._lock:
            self.commands.pop(name, None)
            self._restarts.pop(name, None)
            return self.processes.pop(name, None)

    def _supervise_loop(self) -> None:
        while not self._stopping.wait(SUPERVISE_POLL_S):
            for name in list(self.processes):
                try:
                    self._supervise_one(name, time.monotonic())
                except Exception:  # one failed restart must not end supervision of the rest
                    logger.exception("supervisor: restarting %s failed; trying again", name)

    def _supervise_one(self, name: str, now: float) -> None:
        with self._lock:
            if self._stopping.is_set() or name not in self.processes:
                return  # stopping, or released meanwhile
            process, record = self.processes[name], self._restarts[name]
            if process.poll() is None:
                if now - record.started_at >= STABLE_AFTER_S:
                    record.backoff_s = RESTART_BACKOFF_MIN_S
                return
            if record.restart_at is None:
                record.restart_at = now + record.backoff_s
                _kill_leftovers(process.pid)
                logger.warning(
                    "process %s (pid %d) died with %s after %.1f s; restarting in %.1f s",
                    name, process.pid, describe_exit(process.returncode),
                    now - record.started_at, record.backoff_s,
                )
                return
            if now < record.restart_at:
                return
            record.count += 1
            record.backoff_s = min(record.backoff_s * 2, RESTART_BACKOFF_MAX_S)
            self.start_process(name, self.commands[name])
            logger.warning("process %s restarted (pid %d, restart %d)",
                           name, self.processes[name].pid, record.count)

    def signal(self, name: str, sig: int) -> None:
        """Send `sig` to process `name` and return at once (SIGKILL, SIGTERM, SIGSTOP, ...).

        Supervised, a process the signal ends is restarted like any other that exits.
        """
        with self._lock:
            process = self.processes[name]
        if process.poll() is None:
            process.send_signal(sig)

    @property
    def flower_url(self) -> str:
        return f"http://{self.settings.flower_host}:{self.settings.flower_port}"

    @property
    def flower_basic_auth(self) -> str:
        """'user:password' of Flower: configured, or generated once into data_dir."""
        return configured_or_generated(self.settings.flower_basic_auth,
                                       self.settings.data_dir / "flower_basic_auth",
                                       new_flower_basic_auth)

    def wait_ready(self, *, num_instances: int, timeout_s: float = 180.0) -> None:
        """Until the API is ready and `num_instances` engines publish fresh heartbeats."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.api_url, timeout=5) as client:
            while time.monotonic() < deadline:
                self.check_alive()
                if _ready(client):
                    break
                time.sleep(0.5)
        self.api_key = self.issue_api_key(LOCAL_TEAM, is_admin=True)
        with self.client(timeout=5) as client:
            while time.monotonic() < deadline:
                self.check_alive()
                if _alive_instances(client) >= num_instances:
                    return
                time.sleep(0.5)
        raise StackError(f"stack not ready after {timeout_s:.0f} s; logs in {self.log_dir}")

    def wait_workers_ready(self, timeout_s: float) -> None:
        """Until every Celery worker has logged '<name>@<host> ready.': the predictor loads its
        length model before that (`wait_ready` waits for the API and the engines only)."""
        deadline = time.monotonic() + timeout_s
        waiting = {name for name, command in self.commands.items() if "worker" in command}
        while waiting and time.monotonic() < deadline:
            self.check_alive()
            for name in list(waiting):
                log = self.log_dir / f"{name}.log"
                if log.exists() and f"{name}@" in (text := log.read_text(errors="replace")) \
                        and " ready." in text:
                    waiting.discard(name)
            time.sleep(0.5)
        if waiting:
            raise StackError(f"workers not ready after {timeout_s:.0f} s: {sorted(waiting)}")

    def issue_api_key(self, team_name: str, *, is_admin: bool = False) -> str:
        """A new API key of the named team (created if needed), straight in the database.

        Teams created here poll hard (demo, tests, benchmarks): they get LOCAL_RATE_LIMIT_RPM.
        """
        db = Database(self.settings.resolved_database_url)
        try:
            with db.session() as session:
                return ensure_team_key(session, team_name, is_admin=is_admin,
                                       rate_limit_rpm=LOCAL_RATE_LIMIT_RPM).key
        finally:
            db.dispose()

    def client(self, api_key: str | None = None, **options: Any) -> httpx.Client:
        """An HTTP client of the API authenticated with `api_key` (default: the local key)."""
        key = api_key or self.api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.api_url, headers=headers,
                            **{"timeout": 30.0, **options})

    def check_alive(self) -> None:
        """Raise StackError if a process has exited.

        Supervised, an exited process is being restarted: only a dead supervisor raises.
        """
        if self._supervisor is not None:
            if not self.supervising and not self._stopping.is_set():
                raise StackError(f"the supervisor stopped; logs in {self.log_dir}")
            return
        with self._lock:
            processes = dict(self.processes)
        for name, process in processes.items():
            if process.poll() is not None:
                raise StackError(
                    f"process '{name}' exited with {describe_exit(process.returncode)}; "
                    f"see {self.log_dir / (name + '.log')}"
                )

    def kill(self, name: str, sig: int = _SIGKILL) -> None:
        """Send `sig` to process `name` and wait until it exits."""
        with self._lock:
            process = self.processes[name]
        process.send_signal(sig)
        process.wait(timeout=30)

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop supervising, then shut every process down softly (docs/operations.md, "Processes and
        supervision"): SIGTERM, Celery's warm shutdown, and up to the grace of its kind
        (`timeout_s` for all, if given) to finish its work; a Celery worker still running then
        gets SIGQUIT, the cold shutdown that requeues its unfinished tasks after
        SOFT_SHUTDOWN_TIMEOUT_S; whatever is left after COLD_STOP_GRACE_S is SIGKILLed."""
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join()
            self._supervisor = None
        with self._lock:
            processes = dict(self.processes)
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        for name, process in processes.items():
            grace_s = timeout_s if timeout_s is not None else self.stop_grace_s(name)
            if _exited(process, started + grace_s):
                continue
            logger.warning("process %s still running %.0f s after SIGTERM", name, grace_s)
            if _is_celery_worker(self.commands.get(name, [])):
                process.send_signal(signal.SIGQUIT)
                if _exited(process, time.monotonic() + COLD_STOP_GRACE_S):
                    continue
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        with self._lock:
            self.processes.clear()
        self._release_data_dir()

    def kill_all(self) -> None:
        """SIGKILL every process group at once, with no shutdown: for a throwaway stack whose
        database and queues nobody reads again (a benchmark point). Unfinished work is lost."""
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join()
            self._supervisor = None
        with self._lock:
            processes, self.processes = dict(self.processes), {}
        for process in processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for process in processes.values():
            process.wait()
        self._release_data_dir()

    def _release_data_dir(self) -> None:
        """Let go of data_dir's lock; it is free once no process of this stack holds it."""
        if self._data_lock is not None:
            self._data_lock.release()

    def stop_grace_s(self, name: str) -> float:
        """How long process `name` may take over its warm shutdown."""
        return ENGINE_STOP_GRACE_S if name in self.settings.instance_ids else STOP_GRACE_S


def _exited(process: subprocess.Popen[bytes], deadline: float) -> bool:
    try:
        process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return False
    return True


def _is_celery_worker(command: list[str]) -> bool:
    return "worker" in command and any(word.endswith("celery") for word in command)


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.HTTPError:
        return False


def _alive_instances(client: httpx.Client) -> int:
    try:
        data = client.get("/v1/instances").json()["data"]
    except (httpx.HTTPError, KeyError, ValueError):
        return 0
    return sum(1 for instance in data if instance["alive"])


def _kill_leftovers(pgid: int) -> None:
    """SIGKILL what is left of a dead process's group (each process leads its own session):
    gunicorn's workers outlive a killed master and keep its port, so its successor could not
    bind it."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left

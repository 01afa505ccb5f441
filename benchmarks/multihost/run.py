"""One rig run, start to finish: the network, the data host's PostgreSQL and Redis, the blockq
hosts, HAProxy, traffic from the client host under host-level faults, settling, the chaos
run's checks, and the summary. Everything it made is removed when it returns, also on error
or Ctrl-C (and a run first removes what an interrupted run left)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, or_, select

from app.cli.stack import LOCAL_RATE_LIMIT_RPM
from benchmarks.chaos.checks import Checker, Finding
from benchmarks.chaos.config import RunConfig
from benchmarks.chaos.faults import Fault
from benchmarks.chaos.processes import ProcessWatch, log_tail
from benchmarks.chaos.receiver import WebhookReceiver
from benchmarks.chaos.recovery import stranded_recovery
from benchmarks.chaos.services import OwnServices
from benchmarks.chaos.settle import settle
from benchmarks.chaos.stack_setup import create_teams, signing_secrets, stack_env, stack_settings
from benchmarks.chaos.summaries import summarize_faults, workload_summary
from benchmarks.chaos.workload import Workload
from benchmarks.multihost import layout, network
from benchmarks.multihost.balancer import haproxy_config, start_haproxy
from benchmarks.multihost.faults import KINDS, HostFaults, slot_s
from benchmarks.multihost.hosts import HostStack
from benchmarks.multihost.rabbitmq import OwnRabbitMQ, lasting_messages, wait_for_idle_queues
from benchmarks.multihost.summary import summary
from domain.db import Database
from domain.migrate import upgrade
from domain.models import InferenceRequest, RequestEvent
from domain.settings import Settings
from domain.teams import ensure_team_key

#: Seconds of traffic before the first fault.
FIRST_FAULT_S = 5.0


@dataclass
class RigConfig:
    requests: int = 300
    broker: str = "redis"
    kinds: list[str] = field(default_factory=lambda: list(KINDS))
    seed: int = 1
    clients: int = 16
    duration_s: float | None = None  # None: long enough for the faults
    time_scale: float = 0.5
    down_s: float = 10.0  # a killed host boots again after this
    partition_s: float = 60.0
    clock_skew_s: float = 30.0  # the clock-skew fault's host runs this far ahead
    webhook_fail_first: int = 1
    settle_timeout_s: float = 420.0
    recover_timeout_s: float = 180.0
    model_path: Path | None = None
    #: A real vLLM engine on the tiny model beside eng-3's emulated one (layout.Fleet).
    vllm: bool = True
    keep: bool = False

    @property
    def fleet(self) -> layout.Fleet:
        return layout.Fleet(vllm=self.vllm)

    def traffic_s(self) -> float:
        if self.duration_s is not None:
            return self.duration_s
        faults = sum(slot_s(kind, self.down_s, self.partition_s) for kind in self.kinds)
        return max(45.0, FIRST_FAULT_S + faults + 15.0)


class FrontDoor:
    """The API as clients see it: through the balancer (what benchmarks.chaos.workload needs of a
    stack: `api_url`, `api_key`, `client()`)."""

    def __init__(self, api_url: str, api_key: str) -> None:
        self.api_url, self.api_key = api_url, api_key

    def client(self, api_key: str | None = None, **options: Any) -> httpx.Client:
        return httpx.Client(base_url=self.api_url,
                            headers={"Authorization": f"Bearer {api_key or self.api_key}"},
                            **{"timeout": 30.0, **options})


@dataclass
class _Rig:
    """What a run has started."""

    config: RigConfig
    work_dir: Path
    log: Callable[[str], None]
    services: OwnServices | None = None
    rabbitmq: OwnRabbitMQ | None = None
    stacks: dict[str, HostStack] = field(default_factory=dict)
    watches: dict[str, ProcessWatch] = field(default_factory=dict)
    haproxy: subprocess.Popen[bytes] | None = None
    receiver: WebhookReceiver | None = None
    db: Database | None = None
    timings: dict[str, float] = field(default_factory=dict)


def run(config: RigConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """One run; its summary (benchmarks.multihost.summary). Removes everything it made."""
    if os.geteuid() != 0:
        raise SystemExit("the rig creates network namespaces, veth pairs, a bridge and "
                         "iptables rules: run it as root")
    if config.broker not in ("redis", "rabbitmq"):
        raise SystemExit(f"--broker {config.broker}: redis or rabbitmq")
    unknown = set(config.kinds) - set(KINDS)
    if unknown:
        raise SystemExit(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    removed = network.remove_leftovers()
    if removed:
        log(f"removed leftovers of an earlier run: {', '.join(removed)}")
    netns = network.ThreadNetns()
    with _work_dir(config) as work_dir:
        rig = _Rig(config, work_dir, log)
        try:
            network.create(layout.ALL)
            netns.enter(layout.CLIENT.name)
            return _run(rig)
        finally:
            _stop(rig)
            netns.leave()
            netns.close()
            network.remove_leftovers()


@contextlib.contextmanager
def _work_dir(config: RigConfig) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="blockq-multihost-"))
    path.chmod(0o755)  # PostgreSQL's user must reach its directory below
    try:
        yield path
    finally:
        if not config.keep:
            shutil.rmtree(path, ignore_errors=True)


def _chaos_config(config: RigConfig) -> RunConfig:
    return RunConfig(requests=config.requests, seed=config.seed,
                     instances=config.fleet.instance_count(),
                     clients=config.clients, crash_after_commit=0.0,
                     webhook_fail_first=config.webhook_fail_first, time_scale=config.time_scale,
                     settle_timeout_s=config.settle_timeout_s, model_path=config.model_path)


def _host_settings(base: Settings, work_dir: Path, host: layout.BlockqHost) -> Settings:
    """The fleet's settings as one host runs them: its data directory, its API address, the
    files in the database, webhooks allowed to the rig's subnet."""
    return base.model_copy(update={
        "data_dir": work_dir / "hosts" / host.name, "api_host": host.address.ip,
        "api_port": layout.API_PORT, "files_storage": "database", "api_workers": 1,
        "webhook_allowed_networks": (ipaddress.ip_network(f"{network.SUBNET}.0/24"),),
    })


def _run(rig: _Rig) -> dict[str, Any]:
    config, began = rig.config, time.monotonic()
    rig.services = services = OwnServices(
        rig.work_dir / "data", host=layout.DATA.ip,
        command_prefix=tuple(network.in_namespace(layout.DATA.name)),
        pg_port=layout.PG_PORT, redis_port=layout.REDIS_PORT, max_connections=800)
    services.start()
    upgrade(services.database_url)
    chaos = _chaos_config(config)
    base = stack_settings(chaos, services, rig.work_dir / "hosts").model_copy(
        update={"fleet": config.fleet.specs()})
    if config.broker == "rabbitmq":
        rig.rabbitmq = OwnRabbitMQ(rig.work_dir / "rabbitmq", layout.DATA.ip, layout.DATA.name)
        rig.rabbitmq.start()
        base = base.model_copy(update={"broker_url": rig.rabbitmq.url})
    hosts = layout.blockq_hosts(config.fleet)
    for host in hosts:
        settings = _host_settings(base, rig.work_dir, host)
        stack = HostStack(settings, env=stack_env(settings, chaos), host=host.name)
        rig.stacks[host.name] = stack
        stack.boot(list(host.processes))
    lb = f"{layout.BALANCER.ip}:{layout.API_PORT}"
    rig.haproxy = start_haproxy(layout.BALANCER.name, haproxy_config(
        lb, [(h.name, f"{h.address.ip}:{layout.API_PORT}") for h in hosts[:2]],
        timeout_s=int(chaos.sync_timeout_s) + 60), rig.work_dir)
    rig.db = Database(base.resolved_database_url)
    front = _wait_ready(rig, base, f"http://{lb}")
    rig.timings["ready_s"] = time.monotonic() - began
    for name, stack in rig.stacks.items():
        rig.watches[name] = ProcessWatch(stack)
        rig.watches[name].start()
    rig.receiver = WebhookReceiver(config.webhook_fail_first, host=layout.CLIENT.ip)
    teams = create_teams(base, rig.receiver.url)
    rig.receiver.secrets.extend(signing_secrets(base))
    rig.log(f"{len(hosts)} blockq hosts up in {rig.timings['ready_s']:.0f} s; "
            f"{config.requests} requests over {config.traffic_s():.0f} s; faults: "
            f"{', '.join(config.kinds)}; work dir {rig.work_dir}")
    workload, faults = _traffic_under_faults(rig, front, base, teams, hosts)
    return _result(rig, base, front, workload, faults, teams, began)


def _wait_ready(rig: _Rig, settings: Settings, url: str, timeout_s: float = 300.0) -> FrontDoor:
    """Until the balancer answers /readyz and every engine is alive; the front door with an
    admin key of the team "local"."""
    deadline = time.monotonic() + timeout_s
    assert rig.db is not None
    with rig.db.session() as session:
        key = ensure_team_key(session, "local", is_admin=True,
                              rate_limit_rpm=LOCAL_RATE_LIMIT_RPM).key
    front = FrontDoor(url, key)
    with front.client(timeout=5) as client:
        while time.monotonic() < deadline:
            if _alive_engines(client) >= rig.config.fleet.instance_count():
                return front
            time.sleep(1)
    raise RuntimeError(f"the rig was not ready after {timeout_s:.0f} s; logs under "
                       f"{rig.work_dir}/hosts/*/logs")


def _ready(client: httpx.Client, base: str) -> bool:
    try:
        return client.get(f"{base}/readyz").status_code == 200
    except httpx.HTTPError:
        return False


def _alive(client: httpx.Client, instance_ids: tuple[str, ...]) -> bool:
    """Every one of `instance_ids` is alive."""
    try:
        alive = {i["id"] for i in client.get("/v1/instances").json()["data"] if i["alive"]}
    except (httpx.HTTPError, KeyError, ValueError):
        return False
    return alive.issuperset(instance_ids)


def _alive_engines(client: httpx.Client) -> int:
    try:
        if client.get("/readyz").status_code != 200:
            return 0
        return sum(1 for i in client.get("/v1/instances").json()["data"] if i["alive"])
    except (httpx.HTTPError, KeyError, ValueError):
        return 0


def _traffic_under_faults(rig: _Rig, front: FrontDoor, settings: Settings,
                          teams: dict[str, tuple[str, str]], hosts: list[layout.BlockqHost]
                          ) -> tuple[Workload, list[Fault]]:
    config = rig.config
    assert rig.services is not None and rig.receiver is not None
    rng = random.Random(config.seed)
    traffic_s = config.traffic_s()
    chaos = _chaos_config(config)
    deadline = time.monotonic() + traffic_s + config.settle_timeout_s
    workload = Workload(front, rig.receiver, {n: k for n, (_, k) in teams.items()}, chaos,
                        deadline=deadline)  # type: ignore[arg-type]
    probe = front.client(timeout=2)

    def fleet_back(fault: Fault) -> bool:
        """The fault's target works again: a host's processes all run and its workers are
        ready, a control host's API answers ready, an engine host's instance is alive; and
        the API answers ready through the balancer."""
        if not _ready(probe, front.api_url):
            return False
        stack = rig.stacks.get(fault.target)
        if stack is not None and not (stack.all_running() and stack.workers_ready()):
            return False
        control = {h.name: h.ip for h in layout.CONTROL}
        if fault.target in control:
            return _ready(probe, f"http://{control[fault.target]}:{layout.API_PORT}")
        engines = config.fleet.by_host()
        if fault.target in engines:
            return _alive(probe, engines[fault.target])
        return _alive_engines(probe) >= config.fleet.instance_count()

    def load() -> dict[str, int]:
        """Engine host -> requests routed to or running on its instances now."""
        assert rig.db is not None
        hosts_of = config.fleet.host_of()
        r = InferenceRequest
        with rig.db.session() as session:
            rows = session.execute(
                select(r.instance_id, func.count()).where(r.status.in_(["routed", "running"]))
                .group_by(r.instance_id)).all()
        load: dict[str, int] = {}
        for instance_id, n in rows:
            if instance_id in hosts_of:
                load[hosts_of[instance_id]] = load.get(hosts_of[instance_id], 0) + n
        return load

    injector = HostFaults(
        stacks=rig.stacks, watches=rig.watches, processes={h.name: list(h.processes)
                                                           for h in hosts},
        services=rig.services, data_ip=layout.DATA.ip,
        engine_hosts=[h.name for h in layout.ENGINE], control_host=layout.CONTROL[0].name,
        down_s=config.down_s, partition_s=config.partition_s, fleet_back=fleet_back,
        recover_timeout_s=config.recover_timeout_s, load=load,
        skew_host=layout.CONTROL[1].name, skew_s=config.clock_skew_s,
        partition_host=layout.VLLM_HOST if config.vllm else None)
    faults: list[Fault] = []
    stop = threading.Event()
    start = time.monotonic() + 1.0
    thread = threading.Thread(target=injector.run, args=(
        list(config.kinds), start + FIRST_FAULT_S, random.Random(rng.random()), faults, stop),
        daemon=True)
    thread.start()
    try:
        workload.run(start, traffic_s, random.Random(rng.random()))
        rig.timings["traffic_s"] = time.monotonic() - start
        rig.log(f"all {workload.submitted} requests answered; waiting for the last faults")
        thread.join()
    finally:
        stop.set()
        probe.close()
    rig.timings["faults_s"] = time.monotonic() - start
    rig.log(f"faults over ({len(faults)}); settling")
    return workload, faults


def _result(rig: _Rig, settings: Settings, front: FrontDoor, workload: Workload,
            faults: list[Fault], teams: dict[str, tuple[str, str]], began: float
            ) -> dict[str, Any]:
    assert rig.db is not None and rig.receiver is not None and rig.services is not None
    settled = settle(rig.db, rig.receiver, rig.config.settle_timeout_s)
    # Recovery counts from each fault's start: what was in flight when the host went away.
    recovery = stranded_recovery(rig.db, [replace(f, end=f.start) for f in faults])
    findings = Checker(rig.db, rig.services, settings, rig.receiver, workload.outcomes,
                       dict(teams.values()), front.api_url).run()
    workload.close()
    if rig.rabbitmq is not None:  # the checker looks for leftovers in Redis' lists only
        if any(f.kind == "host:clock-skew" for f in faults):
            wait_for_idle_queues(rig.rabbitmq, within_s=rig.config.clock_skew_s + 10.0)
        for entry in lasting_messages(rig.rabbitmq):
            findings["leftover queue messages"].add(f"rabbitmq {entry}")
    unexpected = findings["unexpected process exits"] = _unexpected(rig)
    rig.timings["total_s"] = time.monotonic() - began
    fleet = rig.config.fleet
    fault_rows = [{**f.to_json(), "in_flight": n, "recovery_s": t, "last_request": rid,
                   "moved_off": _moved_off(rig.db, fleet, f)}
                  for f, (n, t, rid) in zip(faults, recovery, strict=True)]
    return summary(
        requests=workload.submitted, broker=rig.config.broker,
        findings={name: asdict(f) for name, f in findings.items()}, settle=settled,
        fault_summary=summarize_faults(faults, recovery), faults=fault_rows,
        batches_not_terminal=max(0, settled.get("batches_unfinished", 0)),
        extra={"instances": _by_instance(rig.db, fleet),
               "examples": {name: f.examples[:3] for name, f in findings.items() if f.count},
               "unexpected_exits": unexpected.count,
               "workload": workload_summary(workload),
               "timings": {k: round(v, 1) for k, v in
                                                        rig.timings.items()}})


def _moved_off(db: Database, fleet: layout.Fleet, fault: Fault) -> dict[str, int] | None:
    """For a fault on an engine host: the requests re-routed off its instances from the
    fault's start until 60 s after it healed, and how many of them then succeeded elsewhere as
    a later attempt (the host's own stale attempts lost: fencing)."""
    instances = fleet.by_host().get(fault.target)
    if instances is None:
        return None
    start = datetime.fromtimestamp(fault.start, UTC)
    until = datetime.fromtimestamp(fault.end + 60, UTC)
    requeued = or_(*(RequestEvent.detail.like(f"requeued: instance {i} %") for i in instances))
    with db.session() as session:
        ids = set(session.scalars(select(RequestEvent.request_id).where(
            requeued, RequestEvent.at >= start, RequestEvent.at <= until)))
        rows = session.execute(select(InferenceRequest.status, InferenceRequest.instance_id,
                                      InferenceRequest.attempt)
                               .where(InferenceRequest.id.in_(ids))).all() if ids else []
    elsewhere = sum(1 for status, on, attempt in rows
                    if status == "succeeded" and on not in instances and attempt > 1)
    return {"rerouted": len(ids), "succeeded_elsewhere_later_attempt": elsewhere}


def _by_instance(db: Database, fleet: layout.Fleet) -> dict[str, dict[str, Any]]:
    """Instance -> its host, engine kind, the requests its engine admitted (any attempt) and
    those that ended on it, by status (a request re-routed counts on its last attempt's)."""
    r, e = InferenceRequest, RequestEvent
    with db.session() as session:
        ended = session.execute(select(r.instance_id, r.status, func.count())
                                .where(r.instance_id.is_not(None))
                                .group_by(r.instance_id, r.status)).all()
        admitted = session.execute(select(e.detail, func.count(func.distinct(e.request_id)))
                                   .where(e.detail.like("admitted by %"))
                                   .group_by(e.detail)).all()
    table: dict[str, dict[str, Any]] = {
        i: {"host": host, "engine": fleet.engine_of(i), "admitted": 0}
        for i, host in sorted(fleet.host_of().items())}
    for detail, n in admitted:
        table.setdefault(detail.removeprefix("admitted by "), {})["admitted"] = n
    for instance_id, status, n in ended:
        table.setdefault(instance_id, {})[status] = n
    return table


def _unexpected(rig: _Rig) -> Finding:
    """Every process exit no fault caused, with its log's last error line."""
    finding = Finding("unexpected process exits")
    for host, watch in rig.watches.items():
        for e in watch.exits:
            if e.cause is None:
                tail = log_tail(rig.stacks[host].log_dir / f"{e.name}.log", e.at)
                finding.add(f"{host} {e.name} pid {e.pid} exit {e.code}: {tail}")
    return finding


def _stop(rig: _Rig) -> None:
    """Stops everything the run started (each step on its own: one failing stops no other)."""
    for watch in rig.watches.values():
        watch.stop()
    for stack in rig.stacks.values():
        with contextlib.suppress(Exception):
            stack.kill_all()
    if rig.haproxy is not None and rig.haproxy.poll() is None:
        rig.haproxy.kill()
        rig.haproxy.wait()
    if rig.receiver is not None:
        rig.receiver.close()
    if rig.db is not None:
        rig.db.dispose()
    if rig.rabbitmq is not None:
        rig.rabbitmq.stop()
    if rig.services is not None:
        with contextlib.suppress(Exception):
            rig.services.stop()

"""What a long run costs as it goes (the soak): every interval, each stack process's resident
memory and open file descriptors (the process and its children: gunicorn's and Celery's
workers), and the sizes of PostgreSQL's database and of Redis. A process the faults restart
starts again from nothing, so growth is read per process name between the run's start (after a
warm-up) and its end, each a median over a tenth of the run.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis
from sqlalchemy import create_engine, text

from app.cli.stack import Stack

__all__ = ["ResourceSampler", "growth_rows", "plot_resources", "tree_usage"]

_MB = 1024 * 1024


def tree_usage(pid: int) -> tuple[float, int] | None:
    """Resident MB and open file descriptors of `pid` and its descendants (None: gone)."""
    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    rss = fds = 0
    for member in members:
        try:
            rss += member.memory_info().rss
            fds += member.num_fds()
        except psutil.Error:  # exited meanwhile
            continue
    return rss / _MB, fds


@dataclass
class ResourceSampler:
    """Samples `stack`'s processes and the services every `interval_s` in a thread."""

    stack: Stack
    database_url: str
    redis_url: str
    interval_s: float = 30.0
    samples: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="chaos-resources", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()  # the end

    def _loop(self) -> None:
        while not self._stop.wait(0 if not self.samples else self.interval_s):
            self.sample()

    def sample(self) -> None:
        processes = {}
        for name, process in dict(self.stack.processes).items():
            usage = tree_usage(process.pid)
            if usage is not None:
                processes[name] = {"pid": process.pid, "rss_mb": round(usage[0], 1),
                                   "fds": usage[1]}
        self.samples.append({"t_s": round(time.monotonic() - self._began, 1),
                             "at": time.time(), "processes": processes, **self._services()})

    def _services(self) -> dict[str, float | int | None]:
        """PostgreSQL's database and Redis's memory and keys (None: down at that moment, as a
        fault may have it)."""
        sizes: dict[str, float | int | None] = {"postgres_mb": None, "redis_mb": None,
                                                "redis_keys": None}
        try:
            engine = create_engine(self.database_url, pool_pre_ping=False)
            try:
                with engine.connect() as connection:
                    size = connection.scalar(text("SELECT pg_database_size(current_database())"))
                sizes["postgres_mb"] = round(float(size) / _MB, 1)
            finally:
                engine.dispose()
        except Exception:  # noqa: BLE001 - a restart fault: no figure this time
            pass
        try:
            client = redis.Redis.from_url(self.redis_url, socket_timeout=2)
            sizes["redis_mb"] = round(client.info("memory")["used_memory"] / _MB, 1)
            sizes["redis_keys"] = client.dbsize()
            client.close()
        except redis.RedisError:
            pass
        return sizes


def growth_rows(samples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per process name: median resident MB and descriptors over the run's second tenth (after
    its warm-up) and over its last tenth, the largest, and how many times it was restarted (its
    pid changed)."""
    if len(samples) < 10:
        return []
    tenth = max(1, len(samples) // 10)
    early, late = samples[tenth:2 * tenth], samples[-tenth:]
    names = sorted({name for s in samples for name in s["processes"]})
    rows = []
    for name in names:
        def median(window: Sequence[Mapping[str, Any]], key: str, name: str = name
                   ) -> float | None:
            values = [s["processes"][name][key] for s in window if name in s["processes"]]
            return statistics.median(values) if values else None

        pids = [s["processes"][name]["pid"] for s in samples if name in s["processes"]]
        rows.append({
            "process": name,
            "rss_mb_early": median(early, "rss_mb"), "rss_mb_late": median(late, "rss_mb"),
            "rss_mb_max": max(s["processes"][name]["rss_mb"] for s in samples
                              if name in s["processes"]),
            "fds_early": median(early, "fds"), "fds_late": median(late, "fds"),
            "fds_max": max(s["processes"][name]["fds"] for s in samples
                           if name in s["processes"]),
            "restarts": sum(1 for a, b in itertools.pairwise(pids) if a != b)})
    return rows


def plot_resources(samples: Sequence[Mapping[str, Any]], fault_times: Sequence[float],
                   path: Path) -> None:
    """Three panels over the run: resident MB and open descriptors per process, and the
    services' sizes; the faults (wall times) as vertical lines."""
    import matplotlib  # here: a second to import, and only the soak draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s["t_s"] / 60 for s in samples]
    names = sorted({name for s in samples for name in s["processes"]})
    figure, (memory, descriptors, services) = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    for name in names:
        points = [(m, s["processes"].get(name)) for m, s in zip(minutes, samples, strict=True)]
        xs = [m for m, p in points if p]
        memory.plot(xs, [p["rss_mb"] for _, p in points if p], label=name, linewidth=1)
        descriptors.plot(xs, [p["fds"] for _, p in points if p], label=name, linewidth=1)
    for key, label in (("postgres_mb", "PostgreSQL database MB"), ("redis_mb", "Redis used MB")):
        services.plot(minutes, [s[key] for s in samples], label=label)
    for axis in (memory, descriptors, services):
        for at in fault_times:
            axis.axvline((at - samples[0]["at"]) / 60 + minutes[0], color="grey", alpha=0.25,
                         linewidth=0.8)
    memory.set_ylabel("resident MB (with children)")
    descriptors.set_ylabel("open file descriptors")
    services.set_ylabel("MB")
    services.set_xlabel("minutes (grey: a fault)")
    memory.legend(fontsize=7, ncol=4)
    services.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)

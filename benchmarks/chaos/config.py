"""What a run is asked to do."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class RunConfig:
    requests: int = 5000
    faults_per_kind: int = 20
    kinds: list[str] | None = None  # None: every kind of fault_kinds()
    seed: int = 1
    instances: int = 2
    clients: int = 48
    #: Seconds of traffic; None: faults x seconds_per_fault.
    duration_s: float | None = None
    seconds_per_fault: float = 4.0
    crash_after_commit: float = 0.002  # probability per commit (0: not armed)
    webhook_fail_first: int = 2
    time_scale: float = 0.5
    heartbeat_ttl_s: float = 2.0
    sync_timeout_s: float = 90.0
    recover_timeout_s: float = 60.0
    settle_timeout_s: float = 300.0
    model_path: Path | None = None
    work_dir: Path | None = None  # None: a new temporary directory, removed after
    keep: bool = False  # keep the work directory (logs, databases) after the run
    #: An autoscaled fleet (BLOCKQ_AUTOSCALE): `instances` at start, between 1 and
    #: `max_instances`, with the scale fault kinds (benchmarks/chaos/scaling.py).
    autoscale: bool = False
    max_instances: int = 4
    start_s: float = 4.0  # each instance's emulated cold start (times time_scale)
    autoscale_interval_s: float = 1.0
    scale_down_after_s: float = 10.0

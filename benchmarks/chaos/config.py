"""What a run is asked to do."""

from __future__ import annotations

import argparse
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
    #: Sample each process's memory and descriptors and the services' sizes this often (the
    #: soak; benchmarks/chaos/resources.py). None: not sampled.
    resource_interval_s: float | None = None

    @classmethod
    def of_args(cls, args: argparse.Namespace) -> RunConfig:
        """The run `scripts/chaos.py`'s command line asks for."""
        return cls(
            requests=args.requests, faults_per_kind=args.faults_per_kind,
            kinds=args.kinds.split(",") if args.kinds else None, seed=args.seed,
            instances=args.instances, clients=args.clients, duration_s=args.duration,
            seconds_per_fault=args.seconds_per_fault, crash_after_commit=args.crash_after_commit,
            webhook_fail_first=args.webhook_fail_first, time_scale=args.time_scale,
            settle_timeout_s=args.settle_timeout, recover_timeout_s=args.recover_timeout,
            model_path=args.model_path, work_dir=args.work_dir, keep=args.keep,
            autoscale=args.autoscale, max_instances=args.max_instances, start_s=args.start_s,
            scale_down_after_s=args.scale_down_after, resource_interval_s=args.sample_resources)

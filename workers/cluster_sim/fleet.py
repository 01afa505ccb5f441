"""A declared fleet (`workers.sim.fleet_spec`, the `BLOCKQ_FLEET` format) as the cluster
simulation's instances: each one's vLLM settings and step times from its execution-time model's
hardware (`workers.sim.hardware`), and its measured capacity for capacity-weighted routing."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from workers.sim import ExecModel, bundled_model, bundled_model_names
from workers.sim.fleet_spec import InstanceSpec
from workers.sim.hardware import instance_config

from .simulation import FleetMember, saturation_rate
from .workload import Workload

__all__ = ["exec_model_name", "fleet_label", "fleet_members", "with_equal_kv",
           "with_throughputs"]


def exec_model_name(spec: InstanceSpec) -> str:
    """The execution-time model an instance runs on: its `exec_model`, or its `model` when that
    names a bundled one."""
    if spec.exec_model:
        return spec.exec_model
    if spec.model in bundled_model_names():
        return spec.model
    raise ValueError(f"fleet instance of model {spec.model!r} names no exec_model; the "
                     f"simulation needs one of {bundled_model_names()}")


def fleet_members(specs: Sequence[InstanceSpec], **config_overrides: object
                  ) -> list[FleetMember]:
    """One member per instance, in order; `config_overrides` (e.g. ``max_model_len``) apply to
    every instance's `InstanceConfig`."""
    models: dict[str, ExecModel] = {}
    members = []
    for spec in specs:
        name = exec_model_name(spec)
        if name not in models:
            models[name] = bundled_model(name)
        members.append(FleetMember(instance_config(name, **config_overrides), models[name]))
    return members


def fleet_label(specs: Sequence[InstanceSpec]) -> str:
    """``4xllama-2-7b-a100+8xllama-2-7b-a30``: runs of equal execution-time models, in order."""
    runs: list[list] = []
    for spec in specs:
        name = exec_model_name(spec)
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return "+".join(f"{count}x{name}" for name, count in runs)


def with_equal_kv(members: Sequence[FleetMember]) -> list[FleetMember]:
    """Every instance with the vLLM settings of the one with the fewest KV blocks: only the
    speed differs (the issue's "fast instances with no more KV than the slow ones")."""
    smallest = min((m.config for m in members), key=lambda c: c.num_total_blocks)
    return [dataclasses.replace(m, config=smallest) for m in members]


def with_throughputs(members: Sequence[FleetMember], workload: Workload,
                     num_requests: int | None = None) -> list[FleetMember]:
    """Each member told its capacity: the requests per second one instance of its kind completes
    with the first `num_requests` of `workload` queued at once (`saturation_rate`), what an
    operator measures to set weights."""
    measured: dict[tuple, float] = {}
    out = []
    for member in members:
        key = (member.config, member.exec_model.name)
        if key not in measured:
            measured[key] = saturation_rate(workload, member.config, member.exec_model,
                                            num_requests)
        out.append(dataclasses.replace(member, throughput_rps=measured[key]))
    return out

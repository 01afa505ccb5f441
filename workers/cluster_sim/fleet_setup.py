"""A declared fleet (`workers.sim.fleet_declaration`, the `BLOCKQ_FLEET` format) as the cluster
simulation's instances: each one's vLLM settings and step times from its execution-time model's
hardware (`workers.sim.hardware`), and its measured capacity for capacity-weighted routing."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from workers.sim import ExecModel, bundled_model_names, exec_model_of
from workers.sim.fleet_declaration import InstanceSpec
from workers.sim.hardware import instance_config

from .simulation import FleetMember, saturation_rate
from .workload import Workload

__all__ = ["declared_fleet", "exec_model_name", "fleet_label", "fleet_members", "with_equal_kv",
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
    every instance's `InstanceConfig`, after an entry's own `num_blocks` and `max_num_seqs`."""
    models: dict[str, ExecModel] = {}
    members = []
    for spec in specs:
        name = exec_model_name(spec)
        if name not in models:
            models[name] = exec_model_of(name)
        sized = {field: value for field, value in (("num_total_blocks", spec.num_blocks),
                                                   ("max_num_seqs", spec.max_num_seqs))
                 if value is not None}
        members.append(FleetMember(instance_config(name, **(sized | config_overrides)),
                                   models[name]))
    return members


def declared_fleet(specs: Sequence[InstanceSpec], workload: Workload,
                   **config_overrides: object) -> list[InstanceSpec]:
    """The fleet as a live stack declares it to run as the simulation runs `specs`: each
    instance's KV blocks and max_num_seqs from its hardware (as `fleet_members` sizes it), and
    its capacity on `workload` (`with_throughputs`: what capacity_weighted weighs it by), where
    the entry does not give them."""
    members = with_throughputs(fleet_members(specs, **config_overrides), workload)
    return [spec.model_copy(update={
        "num_blocks": member.config.num_total_blocks,
        "max_num_seqs": member.config.max_num_seqs,
        "capacity_rps": spec.capacity_rps or round(member.throughput_rps or 0.0, 4) or None,
    }) for spec, member in zip(specs, members, strict=True)]


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

"""A fleet declared as JSON (the `BLOCKQ_FLEET` setting, `bench_cluster --fleet`): which model each
instance serves, on which engine, on which (emulated) hardware.

The JSON is a list of objects, each with `model` (required), `count` (default 1), and optionally
`model_path`, `engine` ("vllm" or "emulated"), `exec_model` (the execution-time model of the
emulated hardware, a bundled name such as "llama-2-7b-a100"), an emulated instance's
`num_blocks` and `max_num_seqs` (its KV cache and batch size), and `capacity_rps` (what the
operator measured one such instance completes saturated: the capacity-weighted policy's weight).

An autoscaled entry (docs/autoscaling.md) also carries `min_count` and `max_count`, the bounds the
autoscaler keeps it within (`count` is then its starting size, and may be 0), `gpu_kind` (its
name in the GPU catalog, which prices it) and, emulated, `start_s` (its cold start).

`parse_fleet_entries` validates the entries as declared. `fleet_slots` expands them into slots:
`max_count` per entry (`count` without one), in declaration order, slot k being instance
`gpu.<k>` whether it runs or not, so that an instance's id never changes as the fleet grows and
shrinks; the first `count` slots of an entry run at start. `parse_fleet` gives the instances that
run at start (counts expanded), what a fixed fleet runs.

Pure: no I/O beyond listing the bundled execution-time models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .exec_model import bundled_model_names, is_exec_model

__all__ = ["InstanceSpec", "FleetError", "FleetSlot", "fleet_slots", "parse_fleet",
           "parse_fleet_entries"]


class FleetError(ValueError):
    """The fleet's JSON is malformed; the message names the entry and field."""


class InstanceSpec(BaseModel):
    """One entry of a fleet (after `parse_fleet`, one instance: count 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, description="Name under which the instance's model is "
                       "served (what requests name).")
    count: int = Field(1, ge=0, description="Instances of this entry (autoscaled: at start; "
                       "0 only with a max_count above it).")
    min_count: int | None = Field(None, ge=0, description="Fewest instances the autoscaler "
                                  "keeps (0: the model may sleep at zero); unset: count.")
    max_count: int | None = Field(None, ge=0, description="Most instances the autoscaler "
                                  "runs; unset: count.")
    gpu_kind: str | None = Field(None, min_length=1, description="The instance's GPU kind, "
                                 "its name in the GPU catalog (which prices it).")
    start_s: float | None = Field(None, ge=0, description="Cold start of an emulated "
                                  "instance: emulated seconds from process start to ready.")
    model_path: Path | None = Field(None, description="Hugging Face model directory the engine "
                                    "loads (a vLLM engine), or whose tokenizer it counts with.")
    engine: Literal["vllm", "emulated"] | None = Field(
        None, description="Engine kind; unset: the configured default.")
    exec_model: str | None = Field(
        None, min_length=1, description="Execution-time model of the emulated hardware (a "
        "bundled name, or the path of a model file: a derived GPU kind's, as `blockq plan "
        "--fleet-out` writes it, with num_blocks and max_num_seqs); unset: the configured "
        "default.")

    num_blocks: int | None = Field(
        None, gt=0, description="KV-cache blocks of an emulated instance; unset: the "
        "configured default (emulated_num_blocks).")
    max_num_seqs: int | None = Field(
        None, gt=0, description="vLLM max_num_seqs of the instance; unset: the configured "
        "default.")
    capacity_rps: float | None = Field(
        None, gt=0, description="Requests per second one such instance completes saturated, "
        "as the operator measured it: what capacity_weighted divides its backlog by; unset: "
        "every instance weighs the same.")

    @field_validator("exec_model")
    @classmethod
    def _known_exec_model(cls, value: str | None) -> str | None:
        if value is not None and not is_exec_model(value):
            raise ValueError(f"unknown execution-time model {value!r}: neither a bundled one "
                             f"({', '.join(bundled_model_names())}) nor a model file (.json)")
        return value

    @model_validator(mode="after")
    def _model_file_is_sized(self) -> InstanceSpec:
        if (self.exec_model is not None and self.exec_model not in bundled_model_names()
                and (self.num_blocks is None or self.max_num_seqs is None)):
            raise ValueError(f"exec_model {self.exec_model!r} is a model file: give num_blocks "
                             "and max_num_seqs too (nothing else knows its GPU)")
        return self

    @model_validator(mode="after")
    def _bounds_hold(self) -> InstanceSpec:
        low, high = self.lowest_count, self.highest_count
        if self.min_count is not None and self.max_count is not None and low > high:
            raise ValueError(f"min_count ({low}) is above max_count ({high})")
        if not low <= self.count <= high:
            raise ValueError(f"count ({self.count}) must lie within min_count ({low}) and "
                             f"max_count ({high}): it is the starting size")
        if high == 0:
            raise ValueError("count: 0 instances and no max_count above 0: the entry would "
                             "never serve (give max_count to let it scale from zero)")
        return self

    @property
    def lowest_count(self) -> int:
        """The fewest instances the autoscaler keeps: min_count, else count."""
        return self.count if self.min_count is None else self.min_count

    @property
    def highest_count(self) -> int:
        """The most instances the autoscaler runs: max_count, else count."""
        return self.count if self.max_count is None else self.max_count


@dataclass(frozen=True, slots=True)
class FleetSlot:
    """One instance the fleet may run: slot k is instance `gpu.<k>`, running or not."""

    index: int  # k, its place over every entry's slots
    entry_index: int  # the declared entry it belongs to (0-based)
    spec: InstanceSpec  # the entry, count 1
    starts_running: bool  # among the entry's first `count`

    @property
    def instance_id(self) -> str:
        return f"gpu.{self.index}"


def fleet_slots(entries: list[InstanceSpec] | tuple[InstanceSpec, ...]) -> list[FleetSlot]:
    """Every entry's `highest_count` slots, in declaration order."""
    slots: list[FleetSlot] = []
    for entry_index, entry in enumerate(entries):
        spec = entry.model_copy(update={"count": 1})
        slots.extend(FleetSlot(len(slots), entry_index, spec, position < entry.count)
                     for position in range(entry.highest_count))
    return slots


def parse_fleet(text: str) -> list[InstanceSpec]:
    """The instances a fleet JSON runs at start, counts expanded, in order. Raises FleetError
    naming the bad entry (0-based index) and field."""
    return [slot.spec for slot in fleet_slots(parse_fleet_entries(text)) if slot.starts_running]


def parse_fleet_entries(text: str) -> list[InstanceSpec]:
    """The entries of a fleet JSON as declared (counts not expanded). Raises FleetError naming
    the bad entry (0-based index) and field."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FleetError(f"fleet is not valid JSON: {exc}") from None
    if not isinstance(raw, list) or not raw:
        raise FleetError("fleet must be a non-empty JSON list of objects like "
                         '{"model": "tiny-llama", "count": 2}')
    specs: list[InstanceSpec] = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise FleetError(f"fleet entry {index}: expected an object, got {entry!r}")
        try:
            spec = InstanceSpec.model_validate(entry)
        except ValidationError as exc:
            raise FleetError(_describe(index, exc)) from None
        specs.append(spec)
    return specs


def _describe(index: int, error: ValidationError) -> str:
    problems = []
    for problem in error.errors(include_url=False):
        field = "".join(f"{part}: " for part in problem["loc"])
        problems.append(f"fleet entry {index}: {field}"
                        f"{problem['msg'].removeprefix('Value error, ')}")
    return "; ".join(problems)

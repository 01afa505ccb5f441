"""A fleet declared as JSON (the `BLOCKQ_FLEET` setting, `bench_cluster --fleet`): which model each
instance serves, on which engine, on which (emulated) hardware.

The JSON is a list of objects, each with `model` (required), `count` (default 1), and optionally
`model_path`, `engine` ("vllm" or "emulated"), `exec_model` (the execution-time model of the
emulated hardware, a bundled name such as "llama-2-7b-a100"), an emulated instance's
`num_blocks` and `max_num_seqs` (its KV cache and batch size), and `capacity_rps` (what the
operator measured one such instance completes saturated: the capacity-weighted policy's weight).
`parse_fleet` expands the counts: one `InstanceSpec` per instance, in declaration order
(instance k is queue `gpu.<k>`).

Pure: no I/O beyond listing the bundled execution-time models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .exec_model import bundled_model_names

__all__ = ["InstanceSpec", "FleetError", "parse_fleet"]


class FleetError(ValueError):
    """The fleet's JSON is malformed; the message names the entry and field."""


class InstanceSpec(BaseModel):
    """One entry of a fleet (after `parse_fleet`, one instance: count 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, description="Name under which the instance's model is "
                       "served (what requests name).")
    count: int = Field(1, ge=1, description="Instances of this entry.")
    model_path: Path | None = Field(None, description="Hugging Face model directory the engine "
                                    "loads (a vLLM engine), or whose tokenizer it counts with.")
    engine: Literal["vllm", "emulated"] | None = Field(
        None, description="Engine kind; unset: the configured default.")
    exec_model: str | None = Field(
        None, min_length=1, description="Execution-time model of the emulated hardware (a "
        "bundled name); unset: the configured default.")

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
        if value is not None and value not in (known := bundled_model_names()):
            raise ValueError(f"unknown execution-time model {value!r}; known: {known}")
        return value


def parse_fleet(text: str) -> list[InstanceSpec]:
    """The instances a fleet JSON declares, counts expanded, in order. Raises FleetError naming
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
        specs.extend(spec.model_copy(update={"count": 1}) for _ in range(spec.count))
    return specs


def _describe(index: int, error: ValidationError) -> str:
    problems = []
    for problem in error.errors(include_url=False):
        field = ".".join(str(part) for part in problem["loc"]) or "entry"
        problems.append(f"fleet entry {index}: {field}: "
                        f"{problem['msg'].removeprefix('Value error, ')}")
    return "; ".join(problems)

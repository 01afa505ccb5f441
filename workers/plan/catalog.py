"""The GPU catalog: the kinds a plan may use, their datasheet figures and hourly prices.

A catalog is JSON: ``{"source": ..., "kinds": [{"name", "memory_gib", "bandwidth_gb_s",
"bf16_tflops", "price_per_hour", "price_source", "price_date", "max_count"?,
"profiled_as"?}]}``. ``profiled_as`` names the GPU of `workers.sim.hardware.GPUS` whose bundled
execution-time models are this kind's own (``"a30"``, ``"a100"``, ``"h100"``); every other kind's
step times are derived from its datasheet (`workers.plan.derive`). The default catalog ships in
``workers/plan/data/catalog.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from workers.sim.hardware import GPU, GPUS

from .workload import PlanInputError

__all__ = ["Catalog", "DEFAULT_CATALOG", "GpuKind", "load_catalog", "parse_catalog"]

#: The catalog shipped with blockq.
DEFAULT_CATALOG = Path(__file__).resolve().parent / "data" / "catalog.json"
_MIB_PER_GIB = 1024


class GpuKind(BaseModel):
    """One GPU kind a plan may rent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="The kind's name, e.g. 'A100-80GB'.")
    memory_gib: float = Field(gt=0, description="GPU memory, GiB.")
    bandwidth_gb_s: float = Field(gt=0, description="Memory bandwidth, GB/s (datasheet).")
    bf16_tflops: float = Field(gt=0, description="Dense BF16 tensor throughput, TFLOPS.")
    price_per_hour: float = Field(gt=0, description="On-demand price of one GPU, per hour.")
    price_source: str = Field("", description="Where the price was read.")
    price_date: str = Field("", description="When the price was read (YYYY-MM).")
    max_count: int | None = Field(None, ge=0, description="At most this many (None: any).")
    profiled_as: str | None = Field(None, description="The workers.sim.hardware GPU whose "
                                    "bundled execution-time models are this kind's own.")

    @field_validator("profiled_as")
    @classmethod
    def _known_gpu(cls, value: str | None) -> str | None:
        if value is not None and value not in GPUS:
            raise ValueError(f"unknown profiled GPU {value!r}; known: {sorted(GPUS)}")
        return value

    @property
    def gpu(self) -> GPU:
        """The kind as `workers.sim.hardware` sizes KV caches with."""
        return GPU(self.name, int(self.memory_gib * _MIB_PER_GIB), self.bandwidth_gb_s,
                   self.bf16_tflops)


class Catalog(BaseModel):
    """The kinds, by name, in the file's order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = ""
    kinds: tuple[GpuKind, ...]

    def kind(self, name: str) -> GpuKind:
        for kind in self.kinds:
            if kind.name == name:
                return kind
        raise PlanInputError(f"no GPU kind {name!r} in the catalog; known: "
                             f"{[k.name for k in self.kinds]}")

    def only(self, names: list[str]) -> Catalog:
        """The catalog restricted to `names` (in the catalog's order)."""
        for name in names:
            self.kind(name)
        return Catalog(source=self.source, kinds=tuple(k for k in self.kinds if k.name in names))


def parse_catalog(text: str, source: str = "catalog") -> Catalog:
    """The catalog in JSON `text`. Raises `PlanInputError` naming the bad kind and field."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanInputError(f"{source}: not JSON ({exc.msg} at line {exc.lineno})") from None
    entries = raw.get("kinds") if isinstance(raw, dict) else None
    if not isinstance(entries, list) or not entries:
        raise PlanInputError(f'{source}: expected {{"kinds": [...]}} with at least one kind')
    kinds = []
    for index, entry in enumerate(entries):
        label = (entry.get("name") if isinstance(entry, dict) else None) or f"#{index}"
        try:
            kinds.append(GpuKind.model_validate(entry))
        except ValidationError as exc:
            raise PlanInputError(f"{source}: GPU kind {label!r}: {_describe(exc)}") from None
    names = [k.name for k in kinds]
    if duplicates := sorted({n for n in names if names.count(n) > 1}):
        raise PlanInputError(f"{source}: GPU kind {duplicates[0]!r} is listed twice")
    return Catalog(source=str(raw.get("source", "")), kinds=tuple(kinds))


def load_catalog(path: str | Path = DEFAULT_CATALOG) -> Catalog:
    return parse_catalog(Path(path).read_text(), source=str(path))


def _describe(error: ValidationError) -> str:
    problems = []
    for problem in error.errors(include_url=False):
        field = ".".join(str(part) for part in problem["loc"]) or "entry"
        message = "missing" if problem["type"] == "missing" else problem["msg"]
        problems.append(f"{field}: {message.removeprefix('Value error, ')}")
    return "; ".join(problems)

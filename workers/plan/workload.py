"""A planning workload: requests with arrival times, models and lengths (the JSONL of
`blockq plan --workload`), split into one cluster-simulation `Workload` per model.

Each line is ``{"arrival_s", "model", "prompt_tokens", "output_tokens"}``, optionally
``"prompt"``. Arrival times are seconds from any origin; the file need not be sorted. A bad
line raises `PlanInputError` naming its number (1-based), so an operator can fix the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workers.cluster_sim import Workload

__all__ = ["PlanInputError", "PlanRequest", "PlanWorkload", "parse_workload", "workload_of"]


class PlanInputError(ValueError):
    """An input of the planner is unusable; the message names the line, model or kind."""


class PlanRequest(BaseModel):
    """One request of a planning workload."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    arrival_s: float = Field(ge=0, allow_inf_nan=False,
                             description="Arrival time in seconds (any origin).")
    model: str = Field(min_length=1, description="The model the request asks for.")
    prompt_tokens: int = Field(ge=1, description="Prompt length in tokens.")
    output_tokens: int = Field(ge=1, description="Generated tokens (the real length).")
    prompt: str | None = Field(None, description="The prompt's text, if known (unused).")


@dataclass(frozen=True, slots=True)
class PlanWorkload:
    """Requests by model, each model's as a unit-rate `Workload` and its real rate."""

    #: Each model's requests, arrival times rescaled to a mean rate of one.
    by_model: Mapping[str, Workload]
    #: Each model's real mean rate (requests per second over the whole workload's span).
    rate_by_model: Mapping[str, float]
    #: Seconds from the first arrival to the last, over all models.
    span_s: float

    @property
    def models(self) -> list[str]:
        return sorted(self.by_model)

    @property
    def num_requests(self) -> int:
        return sum(len(w) for w in self.by_model.values())


def parse_workload(lines: Iterable[str], source: str = "workload") -> PlanWorkload:
    """The workload in JSONL `lines`; blank lines are skipped. Raises `PlanInputError` naming
    the first bad line."""
    requests: list[PlanRequest] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PlanInputError(f"{source} line {number}: not JSON ({exc.msg})") from None
        if not isinstance(raw, dict):
            raise PlanInputError(f"{source} line {number}: expected an object like "
                                 '{"arrival_s": 0.5, "model": "llama-2-7b", '
                                 '"prompt_tokens": 200, "output_tokens": 150}')
        try:
            requests.append(PlanRequest.model_validate(raw))
        except ValidationError as exc:
            raise PlanInputError(f"{source} line {number}: {_describe(exc)}") from None
    if not requests:
        raise PlanInputError(f"{source}: no requests")
    return workload_of(requests)


def workload_of(requests: Iterable[PlanRequest], max_model_len: int | None = None
                ) -> PlanWorkload:
    """`requests` grouped by model. With `max_model_len`, outputs are capped where vLLM stops
    them (a prompt of max_model_len tokens or more must be rejected before: see the caller)."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    if not ordered:
        raise PlanInputError("no requests")
    start, end = ordered[0].arrival_s, ordered[-1].arrival_s
    span_s = max(end - start, 1e-9)
    grouped: dict[str, list[PlanRequest]] = {}
    for request in ordered:
        grouped.setdefault(request.model, []).append(request)
    by_model, rates = {}, {}
    for model, rows in grouped.items():
        outputs = [r.output_tokens if max_model_len is None
                   else max(1, min(r.output_tokens, max_model_len - r.prompt_tokens))
                   for r in rows]
        # NOTE: every model's rate is its count over the whole workload's span, not its own
        # first-to-last span: a model seen only in a short burst still averages over the hour.
        rate = len(rows) / span_s if len(ordered) > 1 else 1.0
        by_model[model] = Workload(model, tuple((r.arrival_s - start) * rate for r in rows),
                                   tuple(r.prompt_tokens for r in rows), tuple(outputs))
        rates[model] = rate
    return PlanWorkload(by_model, rates, span_s)


def _describe(error: ValidationError) -> str:
    problems = []
    for problem in error.errors(include_url=False):
        field = ".".join(str(part) for part in problem["loc"]) or "line"
        message = "missing" if problem["type"] == "missing" else problem["msg"]
        problems.append(f"{field}: {message}")
    return "; ".join(problems)

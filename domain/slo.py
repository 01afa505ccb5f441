"""Per-request latency targets (SLOs): what a client may ask for, what its team does when no
instance can meet them, and whether a finished request met them.

A target is measured from the request's acceptance by the API (`created_at`): time to first
token (`ttft_ms`) and end-to-end latency (`e2e_ms`), each optional. The router (workers/route)
picks an instance whose simulated what-if meets them; when none can, the team's
`slo_miss_action` decides: route anyway (`route`), run it as batch work (`queue`), or refuse it
(`refuse`: the request ends `rejected`, and a held OpenAI call answers 429 with Retry-After).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from domain.errors import BlockqError, InvalidRequest

# NOTE: the targets as the router reads them live in the pure core, which routes by them.
from workers.route.targets import RequestTargets, SloMissAction

__all__ = ["SloTargets", "SloMissAction", "RequestTargets", "SloUnmeetable", "TTFT_HEADER",
           "E2E_HEADER", "MAX_TARGET_MS", "MIN_TARGET_MS", "targets_from_headers",
           "merge_header_targets", "outcome", "REJECTED_CODE"]

#: Headers of the OpenAI-compatible endpoints giving the targets in milliseconds.
TTFT_HEADER = "x-slo-ttft-ms"
E2E_HEADER = "x-slo-e2e-ms"
#: Bounds of a target: under a millisecond or over an hour is no latency target.
MIN_TARGET_MS = 1.0
MAX_TARGET_MS = 3_600_000.0
#: The error code of a request refused because no instance could meet its targets.
REJECTED_CODE = "slo_unmeetable"
#: A header value: a plain decimal number (no sign, exponent, NaN or infinity).
_NUMBER = re.compile(r"[0-9]{1,9}(\.[0-9]{1,6})?")


class SloTargets(BaseModel):
    """The `slo` body field: latency targets in milliseconds from acceptance, at least one."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    ttft_ms: float | None = Field(
        None, ge=MIN_TARGET_MS, le=MAX_TARGET_MS,
        description="Time to first token to meet, in milliseconds from acceptance.")
    e2e_ms: float | None = Field(
        None, ge=MIN_TARGET_MS, le=MAX_TARGET_MS,
        description="End-to-end latency (last token) to meet, in milliseconds from acceptance.")

    @model_validator(mode="after")
    def _at_least_one(self) -> SloTargets:
        if self.ttft_ms is None and self.e2e_ms is None:
            raise ValueError("give ttft_ms, e2e_ms or both")
        if (self.ttft_ms is not None and self.e2e_ms is not None
                and self.e2e_ms < self.ttft_ms):
            raise ValueError("e2e_ms cannot be below ttft_ms")
        return self


def targets_from_headers(headers: Mapping[str, str]) -> dict[str, float]:
    """The targets given as `x-slo-ttft-ms` / `x-slo-e2e-ms` headers (400 on a bad value)."""
    found: dict[str, float] = {}
    for header, key in ((TTFT_HEADER, "ttft_ms"), (E2E_HEADER, "e2e_ms")):
        raw = headers.get(header)
        if raw is None:
            continue
        value = raw.strip()
        if not _NUMBER.fullmatch(value):
            raise InvalidRequest(f"Invalid value for header '{header}': a number of "
                                 f"milliseconds ({MIN_TARGET_MS:g} to {MAX_TARGET_MS:g}) is "
                                 "expected.", param=header, code="invalid_value")
        number = float(value)
        if not MIN_TARGET_MS <= number <= MAX_TARGET_MS:
            raise InvalidRequest(f"Invalid value for header '{header}': {value} is outside "
                                 f"{MIN_TARGET_MS:g} to {MAX_TARGET_MS:g} milliseconds.",
                                 param=header, code="invalid_value")
        found[key] = number
    return found


def merge_header_targets(slo: SloTargets | None, headers: Mapping[str, str]) -> SloTargets | None:
    """The call's targets: the body's `slo` and the headers; a target given both ways must be
    the same (400 otherwise)."""
    from_headers = targets_from_headers(headers)
    if not from_headers:
        return slo
    merged: dict[str, Any] = slo.model_dump(exclude_none=True) if slo is not None else {}
    for key, value in from_headers.items():
        if merged.get(key, value) != value:
            raise InvalidRequest(f"The header and the body field slo.{key} disagree: give the "
                                 "target once.", param=f"slo.{key}", code="invalid_value")
        merged[key] = value
    try:
        return SloTargets.model_validate(merged)
    except ValidationError as exc:
        raise InvalidRequest(f"Invalid latency targets: {exc.errors()[0]['msg']}",
                             param="slo", code="invalid_value") from None


def outcome(ttft_ms: float | None, e2e_ms: float | None, created_at: datetime,
            first_token_at: datetime | None, finished_at: datetime | None
            ) -> tuple[bool | None, bool | None]:
    """(TTFT met, e2e met) of a finished request, each None without that target."""

    def met(target_ms: float | None, at: datetime | None) -> bool | None:
        if target_ms is None:
            return None
        return at is not None and (at - created_at).total_seconds() * 1000 <= target_ms

    return met(ttft_ms, first_token_at or finished_at), met(e2e_ms, finished_at)


class SloUnmeetable(BlockqError):
    """A request refused because no instance could meet its latency targets (OpenAI's
    rate-limit shape: 429, type `requests`, with Retry-After)."""

    status = 429
    type = "requests"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, param="slo", code=REJECTED_CODE)
        self.retry_after_s = retry_after_s

"""One instance as routers and the API see it: the engine's published state, its heartbeat, the
requests routed to it that the state does not show yet, the load expected to arrive next (from
the requests routed to it recently), and the operator's hold.

`domain.live_fleet` reads these from Redis; the route planner decides on them. Pure: no I/O,
nothing of
ours outside workers.sim.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .engine_state import EngineState
from .future_load import NO_FUTURE_LOAD, FutureLoad, estimate_future_load
from .published import Published
from .snapshot import InstanceConfig, SimRequest, engine_priority

__all__ = ["Assignment", "InstanceStatus", "future_load_of", "routable"]


@dataclass(frozen=True, slots=True)
class Assignment:
    """A request routed to an instance and not yet admitted by its engine."""

    request_id: str
    num_prompt_tokens: int
    predicted_output_tokens: int | None
    at: float  # time.time() of the routing decision
    priority_class: int = 0  # Priority.rank: 0 interactive, 1 batch

    def to_json(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "num_prompt_tokens": self.num_prompt_tokens,
                "predicted_output_tokens": self.predicted_output_tokens, "at": self.at,
                "priority_class": self.priority_class}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Assignment:
        predicted = data["predicted_output_tokens"]
        return cls(request_id=str(data["request_id"]),
                   num_prompt_tokens=int(data["num_prompt_tokens"]),
                   predicted_output_tokens=None if predicted is None else int(predicted),
                   at=float(data["at"]),
                   # NOTE: entries written before the class was kept are interactive.
                   priority_class=int(data.get("priority_class", 0)))

    def to_sim_request(self, config: InstanceConfig | None = None) -> SimRequest:
        """The request as the simulator takes it: waiting, nothing computed yet; on an
        instance scheduling by priority (`config`), with the priority its engine will give
        it (its class, then the routing moment, a little before the engine takes it)."""
        priority = 0
        if config is not None and config.is_priority:
            priority = engine_priority(self.priority_class, self.at,
                                       self.predicted_output_tokens,
                                       config.priority_ms_per_token)
        return SimRequest(request_id=self.request_id, num_prompt_tokens=self.num_prompt_tokens,
                          num_computed_tokens=0, num_output_tokens=0,
                          predicted_output_tokens=self.predicted_output_tokens,
                          is_running=False, priority=priority)


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    """One instance as routers and the API see it."""

    instance_id: str
    alive: bool
    # Seconds since the state was last published (None: never published).
    heartbeat_age_s: float | None
    # The published state: engine_kind, model, counts, KV blocks, config, requests
    # (None: registered, but no state stored).
    state: EngineState | None
    # Requests routed here that the published state does not show yet, in routing order.
    assigned: tuple[Assignment, ...]
    # The operator's hold: "drained" (no new routing; its work finishes) or "paused" (no new
    # routing and its queue is not consumed), or None.
    control: str | None = None
    # Requests expected to arrive next (rate and mean shape of those routed here recently,
    # see `future_load_of`): what-ifs inject them. None expected when the window is off.
    future_load: FutureLoad = NO_FUTURE_LOAD

    @property
    def num_assigned(self) -> int:
        return len(self.assigned)

    @property
    def model(self) -> str | None:
        """The model the instance declares it serves (None: no state published yet)."""
        return self.state.model if self.state is not None else None

    @property
    def accepting(self) -> bool:
        """False while the instance finishes its work before stopping, or while an operator
        holds it (drained, paused): route nothing new."""
        return (self.state is None or self.state.accepting) and self.control is None

    @property
    def routable(self) -> bool:
        """Alive and accepting: a routing decision may choose it."""
        return self.alive and self.accepting

    @property
    def hardware(self) -> tuple[str, str | None] | None:
        """What it runs on as published (its hardware and execution-time model): a pool whose
        instances differ here is a mixed fleet. None before its first state."""
        return None if self.state is None else (self.state.hardware, self.state.exec_model)

    def published(self) -> Published:
        """Its published state and the requests routed to it since, as the routing planner
        reads them (built anew at each call: the state is read anew for each decision)."""
        assert self.state is not None, f"{self.instance_id} has published no state"
        snapshot = self.state.to_instance_snapshot()
        return Published(snapshot, tuple(a.to_sim_request(snapshot.config)
                                         for a in self.assigned), self.state.capacity_rps)

    @property
    def num_running(self) -> int:
        return self.state.num_running if self.state is not None else 0

    @property
    def num_waiting(self) -> int:
        return self.state.num_waiting if self.state is not None else 0


def future_load_of(recent: Iterable[Assignment], now: float, window_s: float) -> FutureLoad:
    """The load expected at an instance from the requests routed to it in the last `window_s`
    seconds before `now` (admitted or not): their rate, mean prompt and predicted length."""
    return estimate_future_load(
        ((a.at, a.num_prompt_tokens, a.predicted_output_tokens) for a in recent), now, window_s)


class _Routable(Protocol):
    @property
    def routable(self) -> bool: ...

    @property
    def model(self) -> str | None: ...


R = TypeVar("R", bound=_Routable)


def routable(instances: Sequence[R], model: str | None) -> list[R]:
    """The routing candidates: instances of `model` (any, for a request of no recorded model)
    that are alive and accepting. The decision pipeline's filter, and the API's."""
    return [i for i in instances if i.routable and (model is None or i.model == model)]

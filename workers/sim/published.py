"""An instance as a router knows it between two publications: its published snapshot and the
requests routed to it since, prepared once for every what-if that reads them.

Production builds one per candidate per decision from the state in Redis
(`InstanceStatus.published`); the cluster simulation keeps one per instance until the instance
publishes again or is routed a request (`workers.route.policies.FleetLedger`), so a burst of
decisions between two publications prepares each instance once. Either way the routing planner
(`workers.route.planner`) reads it the same way. Pure.

Prefix caching: a request may carry its prompt's prefix hashes (`SimRequest.prefix_hashes`); an
instance's cache holds what it published (`InstanceSnapshot.cached_prefixes`) and the prefixes of
the requests routed to it since (they will have computed theirs first). `credit_prefix` gives a
request the tokens of its prompt that cache serves (`num_cached_tokens`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .snapshot import (
    InstanceConfig,
    InstanceSnapshot,
    PreparedInstance,
    SimRequest,
    matched_prefix_tokens,
    prefix_keys,
    prepare,
    with_waiting,
)

__all__ = ["Published", "credit_prefix", "prepare_published"]


@dataclass(slots=True, eq=False)
class Published:
    """A published snapshot plus the requests routed to the instance since (routing order),
    with what is derived from them kept until they change."""

    snapshot: InstanceSnapshot
    assigned: tuple[SimRequest, ...] = ()
    #: The instance's capacity (requests per second with a full queue), when known.
    capacity_rps: float | None = None
    #: The snapshot alone, prepared: what every `Published` of the same snapshot shares, with
    #: more or fewer requests routed since (set on first use).
    snapshot_prepared: PreparedInstance | None = field(default=None, repr=False)
    _prepared: PreparedInstance | None = field(default=None, repr=False)
    _cached: set[int] | frozenset[int] | None = field(default=None, repr=False)
    #: The planner's view of the instance without a request (kept by the planner).
    base_view: Any = field(default=None, repr=False)

    def prepared(self) -> PreparedInstance:
        """The snapshot with the routed requests queued last, normalised for what-ifs."""
        if self._prepared is None:
            if self.snapshot_prepared is None:
                self.snapshot_prepared = prepare(self.snapshot)
            self._prepared = _routed_after(self.snapshot_prepared, self.snapshot, self.assigned)
        return self._prepared

    def cached_units(self) -> set[int] | frozenset[int]:
        """Prefix units the instance's cache will hold: published, plus the routed requests'."""
        if self._cached is None:
            self._cached = _cached_after(self.snapshot, self.assigned)
        return self._cached

    def credit(self, request: SimRequest) -> SimRequest:
        """`credit_prefix` against this instance's cache."""
        if not request.prefix_hashes:
            return request
        return _with_match(request, self.cached_units(), self.snapshot.config)

    def without(self, request_id: str) -> Published:
        """The same without `request_id` among the routed requests: a redelivered decision's
        own earlier assignment is not load to weigh it against."""
        if all(r.request_id != request_id for r in self.assigned):
            return self
        return Published(self.snapshot, tuple(r for r in self.assigned
                                              if r.request_id != request_id), self.capacity_rps,
                         self.snapshot_prepared)


def prepare_published(snapshot: InstanceSnapshot,
                      assigned: Sequence[SimRequest] = ()) -> PreparedInstance:
    """A published snapshot with the requests routed to it since, queued last in routing order.

    NOTE: the engine admits those requests after everything it had waiting (FCFS), so a
    what-if from this state sees them ahead of the new request: a burst spreads out instead
    of piling onto the instance that looked idle when it published. Each starts with the
    prefix the instance's cache will hold for it credited (`credit_prefix`).
    """
    return _routed_after(prepare(snapshot), snapshot, assigned)


def _routed_after(prepared: PreparedInstance, snapshot: InstanceSnapshot,
                  assigned: Sequence[SimRequest]) -> PreparedInstance:
    """The prepared snapshot with the routed requests queued last (`prepare_published`)."""
    if not assigned:
        return prepared
    credited = _credited(snapshot, assigned)
    if any(r.is_running for r in credited):  # not a routed request: prepared with the rest
        return prepare(InstanceSnapshot(snapshot.config, snapshot.num_free_blocks,
                                        snapshot.requests + tuple(credited)))
    return with_waiting(prepared, credited)


def credit_prefix(request: SimRequest, snapshot: InstanceSnapshot,
                  assigned: Sequence[SimRequest] = ()) -> SimRequest:
    """`request` as a what-if on this instance takes it: its prefix hashes replaced by the
    prompt tokens the instance's cache will hold for it (`num_cached_tokens`).

    Unchanged without hashes; without prefix caching the hashes are dropped.
    """
    if not request.prefix_hashes:
        return request
    return _with_match(request, _cached_after(snapshot, assigned), snapshot.config)


def _cached_after(snapshot: InstanceSnapshot,
                  assigned: Sequence[SimRequest]) -> set[int] | frozenset[int]:
    if not any(r.prefix_hashes for r in assigned):
        return snapshot.cached_prefixes  # NOTE: no copy (a live state publishes 2,048 keys)
    cached = set(snapshot.cached_prefixes)
    for r in assigned:
        cached.update(prefix_keys(r, snapshot.config))
    return cached


def _with_match(request: SimRequest, cached: set[int] | frozenset[int],
                config: InstanceConfig) -> SimRequest:
    match = matched_prefix_tokens(request, cached, config)
    return dataclasses.replace(request, prefix_hashes=(),
                               num_cached_tokens=max(match, request.num_cached_tokens))


def _credited(snapshot: InstanceSnapshot, assigned: Sequence[SimRequest]) -> list[SimRequest]:
    """The routed requests, each with the prefix cached before it credited."""
    cached = set(snapshot.cached_prefixes)
    credited = []
    for r in assigned:
        if r.prefix_hashes:
            credited.append(_with_match(r, cached, snapshot.config))
            cached.update(prefix_keys(r, snapshot.config))
        else:
            credited.append(r)
    return credited

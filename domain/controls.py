"""Operator controls: holds on instances (drained, paused, scaling_down) and the routing-policy
override.

PostgreSQL keeps them; Redis holds the copy that routers read on every decision. A change is
written to both (database first), and the health sweep writes the database's state to Redis on
every run, so a Redis restart, which empties it, no longer lets a drained instance take traffic.
"""

from __future__ import annotations

from sqlalchemy import delete, select

from domain.db import Database
from domain.live_fleet import Fleet
from domain.models import OperatorControl

__all__ = ["SCALING_DOWN", "OperatorControls"]

#: The hold the local stack's autoscaler puts on an instance it drains for a scale-down. It
#: routes like an operator's "drained", but is the autoscaler's own: one started after its
#: predecessor died mid-drain releases it (`held`), and leaves an operator's holds alone.
SCALING_DOWN = "scaling_down"

_POLICY = "routing:policy"
_INSTANCE_PREFIX = "instance:"


class OperatorControls:
    def __init__(self, db: Database, fleet: Fleet) -> None:
        self.db = db
        self.fleet = fleet

    def hold(self, instance_id: str, control: str | None) -> None:
        """Drain or pause an instance (`control`), or release it (None)."""
        self._store(_INSTANCE_PREFIX + instance_id, control)
        self.fleet.hold(instance_id, control)

    def held(self) -> dict[str, str]:
        """Every instance's stored hold: instance id -> control."""
        with self.db.session() as session:
            stored = session.execute(select(OperatorControl.name, OperatorControl.value)
                                     .where(OperatorControl.name.startswith(_INSTANCE_PREFIX)))
            return {name.removeprefix(_INSTANCE_PREFIX): value
                    for name, value in stored.tuples().all()}

    def set_policy_override(self, policy: str | None) -> None:
        self._store(_POLICY, policy)
        self.fleet.set_policy_override(policy)

    def restore(self) -> None:
        """Make the copy in Redis what the database says (after a Redis restart, or a write
        to Redis that failed after the database's)."""
        statuses = self.fleet.statuses()  # NOTE: before the database, so a change made in
        # between is in the database already and is not undone below.
        with self.db.session() as session:
            policy = session.scalar(select(OperatorControl.value)
                                    .where(OperatorControl.name == _POLICY))
        self.fleet.set_policy_override(policy)
        held = self.held()
        for status in statuses:
            if status.control != held.get(status.instance_id):
                self.fleet.hold(status.instance_id, held.get(status.instance_id))
        for instance_id, control in held.items():
            self.fleet.hold(instance_id, control)

    def _store(self, name: str, value: str | None) -> None:
        with self.db.session() as session:
            session.execute(delete(OperatorControl).where(OperatorControl.name == name))
            if value is not None:
                session.add(OperatorControl(name=name, value=value))

"""Session affinity: a conversation's next turn goes to the instance that served its previous
turn (that instance holds the conversation's prefix in its cache) while that instance has room.

Pure (no I/O): the route stage reads the session's last instance from Redis, asks `prefer`,
and remembers the instance it routed to (workers/route/stage.py). "Room" is judged by the
what-ifs the policy simulated: the previous instance is preferred when its what-if end-to-end
latency is within `margin` (a share) of the chosen instance's, and meets the request's latency
targets if it has any, so affinity never sends a request into a saturated instance. A policy
that does not simulate has no what-if to judge room by: sessions are ignored under it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from workers.route.policies import Decision, RequestView

__all__ = ["AffinityOutcome", "Affinity", "prefer"]


class AffinityOutcome(enum.StrEnum):
    """What became of a session's preference at one routing decision."""

    NONE = "none"  # no previous turn remembered (a new session, or it expired)
    KEPT = "kept"  # the policy chose the previous instance anyway
    APPLIED = "applied"  # moved to the previous instance, within the margin
    DECLINED = "declined"  # the previous instance is too slow, or misses the targets
    UNAVAILABLE = "unavailable"  # the previous instance is not a candidate (gone, drained,
    # not probed) or was not simulated (a policy without what-ifs)


@dataclass(frozen=True, slots=True)
class Affinity:
    instance_id: str  # where the request goes
    preferred: str | None  # the session's previous instance
    outcome: AffinityOutcome

    def record(self) -> dict[str, str | None]:
        """What the request's routing record keeps of it."""
        return {"preferred": self.preferred, "outcome": str(self.outcome)}


def prefer(decision: Decision, what_ifs: Mapping[str, tuple[float, float]],
           request: RequestView, preferred: str | None, *, margin: float) -> Affinity:
    """Where the request goes given its session's previous instance `preferred`.

    `what_ifs`: (TTFT, end-to-end) seconds of the request on each candidate the policy
    simulated (the planner's). A decision that meets no latency target (`meets_target` False:
    the instance closest to them) stands.
    """
    chosen = decision.instance_id
    if preferred is None:
        return Affinity(chosen, None, AffinityOutcome.NONE)
    if preferred == chosen:
        return Affinity(chosen, preferred, AffinityOutcome.KEPT)
    if preferred not in what_ifs or chosen not in what_ifs:
        return Affinity(chosen, preferred, AffinityOutcome.UNAVAILABLE)
    ttft_s, e2e_s = what_ifs[preferred]
    within = e2e_s <= what_ifs[chosen][1] * (1.0 + margin)
    meets = decision.meets_target is not False and (
        (request.ttft_target_s is None or ttft_s <= request.ttft_target_s)
        and (request.e2e_target_s is None or e2e_s <= request.e2e_target_s))
    if within and meets:
        return Affinity(preferred, preferred, AffinityOutcome.APPLIED)
    return Affinity(chosen, preferred, AffinityOutcome.DECLINED)

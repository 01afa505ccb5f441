"""Handing a request just predicted to routing: the predict task and the API (routing its own
held completions, `inline.py`) both route it here, writing the prediction with the decision.
No Celery here: the API imports this module, never a task module."""

from __future__ import annotations

from collections.abc import Sequence

from domain.models import RequestStatus
from workers import runtime
from workers.predict import stage
from workers.predict.stage import LengthAnswer
from workers.route import stage as route_stage
from workers.route.policies import RequestView
from workers.route.routing import Routing, route_request

__all__ = ["route_predicted"]


def route_predicted(rt: runtime.Runtime, request_id: str, started: stage.Started,
                    answer: LengthAnswer, timing: dict[str, float], *, status: RequestStatus,
                    retire: Sequence[int] = ()) -> Routing:
    """Route a request just predicted, from `status`, writing its prediction with the
    decision (`routing.route_request`; `retire`: deferred outbox entries that transaction
    deletes). Falsy when no instance is routable: nothing was written."""
    query = started.query
    request = route_stage.RouteInput(
        view=RequestView(request_id=request_id, num_prompt_tokens=started.num_prompt_tokens,
                         predicted_output_tokens=answer.tokens, max_tokens=query.max_tokens,
                         prompt_token_ids=route_stage.prompt_token_ids(
                             rt, started.prompt, started.prompt_token_ids),
                         priority_class=query.priority),
        priority=query.priority, status=status, instance_id=None, attempt=started.attempt,
        targets=started.targets, session_key=started.session_key, model=query.model or None)
    return route_request(rt, request, timing, timing["predicted_at"], allowed_from={status},
                         columns=stage.prediction_columns(answer), retire=retire)

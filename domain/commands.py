"""What the native requests API does, apart from HTTP: submit and cancel requests."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from domain import dispatch, logs, request_store, served_models
from domain.dispatch import Message
from domain.errors import Conflict, InvalidRequest, Unprocessable
from domain.models import InferenceRequest, Priority, RequestStatus, utcnow
from domain.prompts import PromptCodec
from domain.sampling import check_token_ids, sampling_column
from domain.schemas import CreateRequest, parse_body
from domain.services import Services
from domain.sessions import session_key
from domain.settings import Settings
from domain.slo import SloMissAction
from domain.streams import close_stream
from domain.webhook_targets import check_submitted_url

__all__ = ["submit_request", "submit_together", "cancel_request", "request_fields", "PromptContext"]

logger = logging.getLogger(__name__)

MAX_IDEMPOTENCY_KEY_LEN = 200


def submit_request(
    services: Services, body: Any, *, idempotency_key: str | None, team_id: str | None,
    stream: bool = False, slo_miss_action: str | None = None, session_id: str | None = None,
) -> tuple[InferenceRequest, bool]:
    """Validate, persist, then enqueue for prediction. Returns (request, created).

    Idempotency keys are per team: two teams may use the same key for different requests.
    `stream`: the engine worker publishes the output text as it is generated.
    `slo_miss_action`: the team's, kept with a request that has latency targets.
    `session_id`: the x-session-id header's, when the body names no session_id.
    """
    _check_idempotency_key(idempotency_key)
    parsed = parse_body(CreateRequest, body)
    fields = request_fields(services, parsed)
    # 404 for a model never served; an accepted request waits out an outage of its instances.
    served_models.check(services.fleet, services.db, services.settings, fields["model"],
                        held=False)
    fields.update(body_sha256=request_store.body_digest(body), team_id=team_id, stream=stream,
                  session_key=session_key(team_id, parsed.session_id or session_id))
    _with_miss_action(fields, slo_miss_action)
    scoped_key = None if idempotency_key is None else f"{team_id}:{idempotency_key}"
    with services.outbox.transaction() as tx:
        request, created = request_store.create_request(tx.session, fields,
                                                        idempotency_key=scoped_key)
        if created:
            tx.post(dispatch.predict(request.id, priority=Priority(request.priority).rank))
    logs.bind_request_id(request.id)
    if created:
        # NOTE: debug: a line a request on its path costs the API CPU at every rate, and the
        # access log already records the call with its request id (app/api/access_log.py).
        logger.debug("request created", extra={"priority": request.priority,
                                               "prompt_tokens": request.prompt_tokens,
                                               "max_tokens": request.max_tokens})
    return request, created


def submit_together(services: Services, bodies: list[dict[str, Any]], *, team_id: str | None,
                    stream: bool = False, slo_miss_action: str | None = None,
                    session_id: str | None = None, defer_predict: bool = False,
                    idempotency_key: str | None = None
                    ) -> tuple[list[InferenceRequest], list[tuple[int, Message]], bool]:
    """Several requests of one OpenAI call (its prompts, each n times), in order: all are
    validated before any is stored (one bad prompt refuses the call), then stored and enqueued
    in one transaction. `session_id`: the conversation they belong to (domain/sessions.py).

    `defer_predict`: their predict messages are staged but not sent (routing in the API,
    `Settings.route_in_api`): the requests and their deferred outbox entries, in order, which
    the caller retires by routing each request itself or sends.

    `idempotency_key` (per team, as `submit_request`'s): the call joins the requests an earlier
    call made under it with the same body (running or finished; nothing is stored or sent),
    and the last value returned is False; another body under it is a 409."""
    _check_idempotency_key(idempotency_key)
    columns = []
    for body in bodies:
        parsed = parse_body(CreateRequest, body)
        fields = request_fields(services, parsed)
        fields.update(body_sha256=request_store.body_digest(body), team_id=team_id, stream=stream,
                      session_key=session_key(team_id, parsed.session_id or session_id))
        _with_miss_action(fields, slo_miss_action)
        columns.append(fields)
    with services.outbox.transaction() as tx:
        if idempotency_key is None:
            requests, created = request_store.create_requests(tx.session, columns), True
        else:
            requests, created = request_store.create_requests_once(
                tx.session, columns, _choice_keys(team_id, idempotency_key, len(columns)))
        for request in requests if created else ():
            tx.post(dispatch.predict(request.id, priority=Priority(request.priority).rank),
                    defer=defer_predict)
    logs.bind_request_id(requests[0].id)
    if not created:
        logger.info("call joined its earlier requests (Idempotency-Key)")
        return requests, [], False
    # NOTE: debug: every call's access line carries its (bound) request id, and its routing
    # its own line; a third line per request was a measurable share of the API's CPU.
    logger.debug("requests created", extra={"count": len(requests),
                                           "prompt_tokens": requests[0].prompt_tokens,
                                           "max_tokens": requests[0].max_tokens})
    return requests, tx.deferred, True


def _choice_keys(team_id: str | None, idempotency_key: str, count: int) -> list[str]:
    """The stored keys of an OpenAI call's choices: per team, apart from the native API's keys
    (`submit_request`: `<team>:<key>`), one per choice."""
    return [f"{team_id}:openai:{idempotency_key}:{index}" for index in range(count)]


def _check_idempotency_key(idempotency_key: str | None) -> None:
    if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_IDEMPOTENCY_KEY_LEN:
        raise InvalidRequest(
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} characters.",
            param="Idempotency-Key",
        )


def _with_miss_action(fields: dict[str, Any], slo_miss_action: str | None) -> None:
    """A request with latency targets keeps its team's action on a miss as it is now."""
    if fields.get("slo_ttft_ms") is not None or fields.get("slo_e2e_ms") is not None:
        fields["slo_miss_action"] = slo_miss_action or SloMissAction.ROUTE


class PromptContext(Protocol):
    """What `request_fields` needs: the API's Services, or a worker's runtime (batch lines)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def prompts(self) -> PromptCodec: ...


def request_fields(services: PromptContext, parsed: CreateRequest) -> dict[str, Any]:
    """The columns of a new request: the prompt rendered and counted, max_tokens checked
    against the context (422 when it does not fit)."""
    settings = services.settings
    messages = [m.model_dump() for m in parsed.messages] if parsed.messages else None
    prompt_ids = parsed.prompt if isinstance(parsed.prompt, list) else None
    if prompt_ids is not None:  # token ids go to the engine as they are; the text is for show
        _check_prompt_ids(prompt_ids, services.prompts.vocab_size)
        prompt: str | None = services.prompts.decode(prompt_ids)
        num_prompt_tokens = len(prompt_ids)
    else:
        prompt = services.prompts.render(messages) if messages else parsed.prompt
        assert isinstance(prompt, str)
        num_prompt_tokens = services.prompts.count(prompt)
    param = "messages" if messages else "prompt"
    room = settings.max_model_len - num_prompt_tokens
    if room < 1:
        raise Unprocessable(
            f"The prompt is {num_prompt_tokens} tokens; the model's context is "
            f"{settings.max_model_len} tokens, leaving no room for output.",
            param=param,
            code="context_length_exceeded",
        )
    # max_tokens 0 (OpenAI's echo that scores the prompt): the engine generates one token,
    # which the answer leaves out.
    prompt_only = parsed.max_tokens == 0
    max_tokens = 1 if prompt_only else parsed.max_tokens or min(settings.default_max_tokens, room)
    if max_tokens > room:
        raise Unprocessable(
            f"max_tokens is {max_tokens} but the {num_prompt_tokens}-token prompt leaves "
            f"{room} tokens of the {settings.max_model_len}-token context.",
            param="max_tokens",
            code="context_length_exceeded",
        )
    check_token_ids(parsed, services.prompts.vocab_size, max_tokens=max_tokens)
    targets = ({"slo_ttft_ms": parsed.slo.ttft_ms, "slo_e2e_ms": parsed.slo.e2e_ms}
               if parsed.slo is not None else {})
    return {
        "model": parsed.model or settings.default_model,
        "priority": parsed.priority,
        "prompt": prompt,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": parsed.temperature,
        "top_p": parsed.top_p,
        "seed": parsed.seed,
        "stop": parsed.stop,
        "sampling": sampling_column(parsed, logprobs=parsed.logprobs, echo=parsed.echo,
                                    prompt_only=prompt_only),
        "prompt_token_ids": prompt_ids,
        "webhook_url": check_submitted_url(parsed.webhook_url and str(parsed.webhook_url),
                                           settings.webhook_allowed_networks),
        "request_metadata": parsed.metadata,
        "prompt_tokens": num_prompt_tokens,
        **targets,
    }


def _check_prompt_ids(prompt_ids: list[int], vocab_size: int) -> None:
    unknown = next((token for token in prompt_ids if token >= vocab_size), None)
    if unknown is not None:
        raise InvalidRequest(f"Invalid value for 'prompt': token id {unknown} is not in the "
                             f"model's vocabulary (ids 0 to {vocab_size - 1}).", param="prompt",
                             code="invalid_value")


def cancel_request(services: Services, request_id: str, *, team_id: str | None) -> None:
    """Cancel an unfinished request. Cancelling a cancelled request again is a no-op."""
    with services.outbox.transaction() as tx:
        session = tx.session
        request = request_store.get_request(session, request_id, team_id=team_id)
        changed = request_store.transition(
            session,
            request_id,
            RequestStatus.CANCELLED,
            allowed_from=request_store.ACTIVE_STATUSES,
            detail="cancelled by client",
            finished_at=utcnow(),
        )
        session.refresh(request)
        if request.status != RequestStatus.CANCELLED:
            raise Conflict(
                f"Request '{request_id}' already finished with status '{request.status}'.",
                param="id",
                code="request_already_finished",
            )
        if changed and request.webhook_url:
            tx.post(dispatch.webhook(request_id, "request.cancelled"))
    if changed:
        _abort_on_engine(services, request_id, request.attempt)


def _abort_on_engine(services: Services, request_id: str, attempt: int) -> None:
    """Tell the engine to stop generating it, and whoever waits for its end that it ended.
    Best effort: the cancel is committed, so an engine that misses the flag finds it in the
    database at its ownership check, and its write of the result is refused; a waiter that
    misses the stream's final entry finds the row at its next look."""
    try:
        services.fleet.request_cancel(request_id)
        close_stream(services.fleet.redis, request_id, attempt, "the request was cancelled")
    except Exception:  # noqa: BLE001 - Redis down: the engine's ownership check aborts it
        logger.warning("could not flag %s as cancelled for its engine", request_id)

"""OpenAI-compatible endpoints: `/v1/models`, `/v1/completions`, `/v1/chat/completions`.

Each completion is an ordinary request (same predict -> route -> engine path, same records);
the endpoint waits for its end, or with `stream: true` relays the text the engine worker
publishes as server-sent events while it is generated.

With an `Idempotency-Key` header (per team, as on POST /v1/requests), a call joins the requests
an earlier call made under the key with the same body: a running one is waited for, a finished
one answered at once, and a stream relays its text from the first token (a replay, then the
rest as it comes). A cancelled one lets go of its key: the retry starts again. Another body
under the key is a 409.

A client that leaves has its requests cancelled, which aborts them in their engines, unless
another call still waits for them (the same key): each held connection counts as a waiter of
its requests in Redis (app/api/held_connections.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Generator, Iterator
from functools import cached_property
from typing import Any

import redis
from flask import Blueprint, Response, jsonify, request, stream_with_context
from flask.typing import ResponseReturnValue

from app.api import routing
from app.api.auth import current_principal
from app.api.held_connections import ClientGone, Hold, held_connections
from app.api.json_body import json_body
from app.api.services import services
from domain import openai_format as fmt
from domain import request_store, served_models
from domain.commands import cancel_request, submit_together
from domain.db import TRANSIENT_ERRORS
from domain.errors import BlockqError
from domain.models import InferenceRequest, RequestStatus
from domain.openai_schemas import (
    ChatCompletionBody,
    CompletionBody,
    OpenAIBody,
    native_bodies,
)
from domain.schemas import parse_body
from domain.services import Services
from domain.sessions import session_from_headers
from domain.slo import SloMissAction, SloUnmeetable, merge_header_targets
from domain.stream_hub import Subscription
from domain.streams import StreamEvent

logger = logging.getLogger(__name__)

#: How long a waiting completion lets its stream be quiet before it checks its deadline and its
#: client.
QUIET_CHECK_MS = 1000
#: How often a sync completion polls its row while Redis is unreachable.
ROW_POLL_S = 0.5
#: While its stream is quiet, a waiting sync completion reads its row first after this long,
#: then at doubling intervals up to ROW_CHECK_MAX_S: the stream's end entry is what ends the
#: wait; the row is read for what no entry announces (a cancel by another call, a stream that
#: Redis lost), not once a second for the whole wait.
ROW_CHECK_FIRST_S = 2.0
ROW_CHECK_MAX_S = 8.0
#: A stream with latency targets of a team that refuses unmeetable ones waits this long at
#: most for its routing, polling its row this often, before its first byte.
ROUTING_WAIT_S = 2.0
ROUTING_POLL_S = 0.01
#: How often a call held for a cold start reads its requests' rows.
COLD_START_POLL_S = 0.25

#: The blockq request ids of a completion (one per choice), sent before any event: a stream
#: cut before its first chunk still tells its client which request to look up.
REQUEST_ID_HEADER = "X-Request-Id"

bp = Blueprint("openai", __name__, url_prefix="/v1")


class GatewayTimeout(BlockqError):
    status = 504
    type = "server_error"


class GenerationFailed(BlockqError):
    status = 500
    type = "server_error"


@bp.get("/models")
def list_models() -> ResponseReturnValue:
    """Each model a live instance serves."""
    svc = services()
    return jsonify(object="list", data=served_models.listed(svc.fleet, svc.db, svc.settings))


@bp.get("/models/<path:model_id>")
def show_model(model_id: str) -> ResponseReturnValue:
    svc = services()
    for model in served_models.listed(svc.fleet, svc.db, svc.settings):
        if model["id"] == model_id:
            return jsonify(model)
    raise served_models.not_found(model_id)


@bp.post("/completions")
def completions() -> ResponseReturnValue:
    return _complete(CompletionBody, fmt.KIND_COMPLETION)


@bp.post("/chat/completions")
def chat_completions() -> ResponseReturnValue:
    return _complete(ChatCompletionBody, fmt.KIND_CHAT)


def _complete(body_model: type[OpenAIBody], kind: str) -> ResponseReturnValue:
    body = json_body()
    parsed = parse_body(body_model, body)  # type: ignore[arg-type]
    targets = merge_header_targets(parsed.slo, request.headers)
    if targets is not parsed.slo:
        parsed = parsed.model_copy(update={"slo": targets})
    # The conversation: the x-session-id header, else OpenAI's `user` (domain/sessions.py).
    session_id = session_from_headers(request.headers) or parsed.user or None
    svc = services()
    principal = current_principal()
    team_id = principal.team_id
    held = held_connections()
    with held.setup(team_id):  # one team's burst sets up a share of the Redis pool at a time
        # 404 for a model never served; 503 while every instance of it is down (a held call),
        # unless the autoscaler can start one: then the call waits for it (`cold`).
        cold = served_models.check(svc.fleet, svc.db, svc.settings, parsed.model, held=True)
        # NOTE: the connection is held (a thread, a team slot) from here until the answer is
        # sent: a stream hands its hold to the response, which releases it when the server
        # closes it.
        hold = held.hold(team_id, principal.team_name, request.environ)
        try:
            submitted, created = _submit(svc, parsed, hold, session_id)
        except BaseException:
            hold.release()
            raise
    handed_over = False
    try:
        if cold:
            _await_cold_start(svc, submitted, parsed.model, hold)
        if parsed.stream:
            if parsed.slo is not None and principal.slo_miss_action == SloMissAction.REFUSE:
                _await_routing(svc, submitted[0].id, hold)
            relay = _Relay(svc, submitted[0], kind, team_id, parsed.include_usage_in_stream,
                           hold)
            response = Response(stream_with_context(relay.events()),
                                mimetype="text/event-stream",
                                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                         REQUEST_ID_HEADER: submitted[0].id})
            response.call_on_close(hold.release)
            handed_over = True
            return response
        finished = _wait_for_all(svc, submitted, hold, joined=not created)
    finally:
        if not handed_over:
            hold.release()
    render = fmt.chat_completion_object if kind == fmt.KIND_CHAT else fmt.completion_object
    return (jsonify(render(finished, parsed.model, n=parsed.n)),
            {REQUEST_ID_HEADER: ", ".join(choice.id for choice in finished)})


def _submit(svc: Services, parsed: OpenAIBody, hold: Hold, session_id: str | None
            ) -> tuple[list[InferenceRequest], bool]:
    """Store the call's requests (one per choice; a stream has one: the body's validation saw
    to it), or join an earlier call's under its Idempotency-Key, and route them (in the API);
    the requests, and whether they are new."""
    principal = current_principal()
    in_api = routing.enabled()
    submitted, deferred, created = submit_together(
        svc, native_bodies(parsed), team_id=principal.team_id, stream=parsed.stream,
        slo_miss_action=principal.slo_miss_action, session_id=session_id,
        defer_predict=in_api, idempotency_key=request.headers.get("Idempotency-Key"))
    hold.wait_for([choice.id for choice in submitted])
    if in_api and created:
        routing.route(submitted, deferred)
    return submitted, created


def _wait_for_all(svc: Services, submitted: list[InferenceRequest], hold: Hold, *,
                  joined: bool = False) -> list[InferenceRequest]:
    """The finished rows of a call's choices, in order. One that fails ends the call and the
    others are cancelled (unless another call waits for them); after a timeout (504) all go on,
    as a single request does. One deadline covers the whole call, however many choices it has.
    `joined`: the requests of an earlier call (Idempotency-Key), which may have ended."""
    deadline = time.monotonic() + svc.settings.sync_timeout_s
    finished: list[InferenceRequest] = []
    try:
        for index, choice in enumerate(submitted):
            # NOTE: the first choice was stored a moment ago: it cannot have finished yet, so
            # its row is read once, at its end; a later one may have finished meanwhile.
            finished.append(_wait_until_finished(svc, choice.id, hold, deadline,
                                                 may_be_finished=joined or index > 0))
    except GatewayTimeout:
        raise
    except BaseException:
        for choice in submitted[len(finished) + 1:]:
            abandon(svc, choice.id, hold)
        raise
    return finished


def _wait_until_finished(svc: Services, request_id: str, hold: Hold, deadline: float, *,
                         may_be_finished: bool = True) -> InferenceRequest:
    """Block until the request is terminal (its stream's last entry, or its row), then return
    the row; an unfinished request after `sync_timeout_s` answers 504 and keeps running. While
    Redis is unreachable the row is polled instead: the request was accepted, so the client must
    get its answer, not an error that would make it submit again. A client that leaves meanwhile
    has its request cancelled (nobody would read the answer). `may_be_finished`: read the row
    first (a choice that finished while an earlier one was waited for)."""
    if may_be_finished and (row := _terminal_row(svc, request_id)) is not None:
        return _succeeded_or_raise(row)
    try:
        with svc.streams.subscribe(request_id) as subscription:
            return _await_end(svc, subscription, request_id, hold, deadline)
    except redis.RedisError as exc:
        logger.warning("stream of %s unreadable (%s): polling its row", request_id,
                       type(exc).__name__)
    while (row := _terminal_row(svc, request_id)) is None:
        _check_deadline(svc, request_id, deadline)
        _check_client(svc, request_id, hold)
        time.sleep(ROW_POLL_S)
    return _succeeded_or_raise(row)


def _await_end(svc: Services, subscription: Subscription, request_id: str, hold: Hold,
               deadline: float) -> InferenceRequest:
    """Wait on the request's stream for its end; read its row at the end entry, and now and
    then while the stream is quiet (see ROW_CHECK_FIRST_S)."""
    check_in_s = ROW_CHECK_FIRST_S
    next_check = time.monotonic() + check_in_s
    for event in subscription.events(block_ms=_quiet_ms(deadline)):
        row = None
        if event is not None and event.kind != "text":
            row = _terminal_row(svc, request_id)
        elif event is None and time.monotonic() >= next_check:
            check_in_s = min(check_in_s * 2, ROW_CHECK_MAX_S)
            next_check = time.monotonic() + check_in_s
            row = _terminal_row(svc, request_id)
        if row is not None:
            return _succeeded_or_raise(row)
        _check_deadline(svc, request_id, deadline)
        _check_client(svc, request_id, hold)
    raise AssertionError("unreachable: a subscription's events never end")


def _quiet_ms(deadline: float) -> int:
    """How long a wait lets its stream be quiet before it looks at its row, deadline and client:
    a second, or less when the deadline comes sooner (a short `sync_timeout_s` ends on time)."""
    return max(10, min(QUIET_CHECK_MS, int((deadline - time.monotonic()) * 1000)))


def _check_client(svc: Services, request_id: str, hold: Hold) -> None:
    """Renew the hold's lease; cancel the request of a client that has left."""
    if not hold.alive():
        logger.info("client of %s left", request_id)
        abandon(svc, request_id, hold)
        raise ClientGone(f"The client closed its connection; request {request_id} was "
                         "cancelled.", code="client_closed_request")


def _check_deadline(svc: Services, request_id: str, deadline: float) -> None:
    if time.monotonic() > deadline:
        raise GatewayTimeout(
            f"Request {request_id} did not finish within {svc.settings.sync_timeout_s:g} s; "
            f"it goes on: GET /v1/requests/{request_id}.", code="timeout")


def _terminal_row(svc: Services, request_id: str) -> InferenceRequest | None:
    """The request's row once it is terminal; None before, and while the database cannot be
    reached (the request was accepted: its client waits out the outage, to the deadline)."""
    try:
        # NOTE: one SELECT, outside a transaction (Database.autocommit) and without a session:
        # every held completion passes here at its end.
        with svc.db.autocommit() as connection:
            row = request_store.read_request(connection, request_id)
            return row if RequestStatus(row.status).is_terminal else None
    except TRANSIENT_ERRORS as exc:
        logger.warning("row of %s unreadable (%s): waiting", request_id, type(exc).__name__)
        return None


def _succeeded_or_raise(row: InferenceRequest) -> InferenceRequest:
    if row.status == RequestStatus.SUCCEEDED:
        return row
    if row.status == RequestStatus.REJECTED:
        raise _refusal(row)
    if row.status == RequestStatus.CANCELLED:
        raise GenerationFailed(f"Request {row.id} was cancelled.", code="cancelled")
    message = (row.error or {}).get("message", "generation failed")
    raise GenerationFailed(f"Request {row.id} failed: {message}", code="generation_failed")


def _refusal(row: InferenceRequest) -> SloUnmeetable:
    """The 429 of a request refused at routing: its latency targets were out of reach."""
    error = row.error or {}
    return SloUnmeetable(f"Request {row.id} was rejected: {error.get('message', '')}".strip(),
                         retry_after_s=int(error.get("retry_after_s", 1)))


def _await_cold_start(svc: Services, submitted: list[InferenceRequest], model: str,
                      hold: Hold) -> None:
    """Hold the call, its connection open and nothing sent, while its model has no instance up
    and the autoscaler starts one: until every choice is routed (or ended), or, past
    autoscale_max_wait_s, cancel them and answer 503 with Retry-After. The requests wait in the
    durable queue meanwhile, not here: a restarted API loses the connection, not the request.

    NOTE: nothing is sent before the routing, so that a stream can still get its 503."""
    waited_s = svc.settings.autoscale_max_wait_s
    deadline = time.monotonic() + waited_s
    waiting = {choice.id for choice in submitted}
    try:
        while waiting:
            try:
                with svc.db.autocommit() as connection:
                    waiting = {request_id for request_id in waiting
                               if request_store.read_request(connection, request_id).status
                               in (RequestStatus.QUEUED, RequestStatus.PREDICTING)}
            except TRANSIENT_ERRORS:
                pass  # an outage: wait on, to the deadline
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise served_models.cold_start_timeout(model, waited_s)
            _check_client(svc, next(iter(waiting)), hold)
            time.sleep(COLD_START_POLL_S)
    except BaseException:
        for choice in submitted:
            abandon(svc, choice.id, hold)
        raise


def _await_routing(svc: Services, request_id: str, hold: Hold) -> None:
    """Wait until the request is routed or refused (a few milliseconds, the predict and route
    stages): a stream's status is sent with its first byte, so a stream whose team refuses
    requests with unmeetable targets answers 429 only if it waits for the routing first.
    After `ROUTING_WAIT_S` the stream starts anyway (a refusal then ends it with an error)."""
    deadline = time.monotonic() + ROUTING_WAIT_S
    while time.monotonic() < deadline:
        try:
            with svc.db.session() as session:
                row = request_store.get_request(session, request_id)
                if row.status == RequestStatus.REJECTED:
                    raise _refusal(row)
                if row.status not in (RequestStatus.QUEUED, RequestStatus.PREDICTING):
                    return
        except TRANSIENT_ERRORS:
            return  # the stream's own waiting copes with the outage
        _check_client(svc, request_id, hold)
        time.sleep(ROUTING_POLL_S)


class _Relay:
    """Server-sent events of one streamed completion, from its Redis stream."""

    def __init__(self, svc: Services, submitted: InferenceRequest, kind: str, team_id: str,
                 include_usage: bool, hold: Hold) -> None:
        self.svc, self.request, self.kind = svc, submitted, kind
        self.team_id, self.include_usage = team_id, include_usage
        self.hold = hold
        self.model = submitted.model or svc.settings.default_model
        self.finished = False
        self.sent_at = time.monotonic()
        self.attempt: int | None = None  # the routing attempt whose text the stream relays

    def events(self) -> Iterator[str]:
        try:
            for event in self._events():
                self.sent_at = time.monotonic()
                yield event
        except GeneratorExit:
            if not self.finished:  # the client went away: stop generating for nobody
                abandon(self.svc, self.request.id, self.hold)
            raise

    def _events(self) -> Iterator[str]:
        if self.kind == fmt.KIND_CHAT:
            yield self._chunk({"role": "assistant", "content": ""}, None)
        deadline = time.monotonic() + self.svc.settings.sync_timeout_s
        sent: list[str] = []
        try:
            with self.svc.streams.subscribe(self.request.id) as subscription:
                yield from self._relay(subscription, deadline, sent)
                return
        except redis.RedisError as exc:
            logger.warning("stream of %s unreadable (%s): polling its row", self.request.id,
                           type(exc).__name__)
        while (row := _terminal_row(self.svc, self.request.id)) is None:
            if (yield from self._quiet_tick(deadline)):
                return
            time.sleep(ROW_POLL_S)
        yield from self._finish(row, "".join(sent))

    def _relay(self, subscription: Subscription, deadline: float, sent: list[str]
               ) -> Iterator[str]:
        """The events of the request's stream, until its end; the text relayed is kept in
        `sent`. What one read of the hub brought goes out in one write. Raises RedisError when
        the stream cannot be read (the caller polls the row)."""
        for batch in subscription.batches(block_ms=_quiet_ms(deadline)):
            written, ended = _gathered(self._batch(batch, deadline, sent))
            if written:
                yield written
            if ended:
                return

    def _batch(self, batch: list[StreamEvent] | None, deadline: float, sent: list[str]
               ) -> Generator[str, None, bool]:
        """The events of one read of the hub (None: a quiet spell); whether the stream ended.
        Text deltas that came together go out as one chunk: OpenAI's clients take the text in
        any split."""
        pending: list[str] = []
        for event in batch or (None,):
            if event is not None and event.kind == "text":
                if self.attempt is not None and event.attempt != self.attempt:
                    yield from self._text(pending, sent)
                    yield from self._error("The request was restarted on another instance; "
                                           "the stream cannot continue.", "stream_interrupted")
                    return True
                self.attempt = event.attempt
                pending.append(event.value)
                continue
            yield from self._text(pending, sent)
            row = _terminal_row(self.svc, self.request.id)
            if row is not None:
                yield from self._finish(row, "".join(sent))
                return True
            if (yield from self._quiet_tick(deadline)):
                return True
        yield from self._text(pending, sent)
        return False

    def _text(self, pending: list[str], sent: list[str]) -> Iterator[str]:
        """One chunk of the text deltas in `pending` (emptied), kept in `sent`."""
        if pending:
            text = "".join(pending)
            pending.clear()
            sent.append(text)
            yield self._text_chunk(text)

    def _quiet_tick(self, deadline: float) -> Generator[str, None, bool]:
        """While nothing comes: the deadline, the client, a keep-alive comment when due;
        whether the stream ends here."""
        if time.monotonic() > deadline:
            yield from self._error("The request did not finish in time.", "timeout")
            return True
        if self._client_left():
            return True
        yield from self._keep_alive()
        return False

    def _client_left(self) -> bool:
        """Renew the hold's lease; cancel the request if its client has gone (seen on its
        socket, before any write would fail)."""
        if self.hold.alive():
            return False
        logger.info("client of stream %s left", self.request.id)
        self.finished = True
        abandon(self.svc, self.request.id, self.hold)
        return True

    def _keep_alive(self) -> Iterator[str]:
        """An SSE comment when nothing was sent for `sse_keepalive_s` (when set): proxies keep
        the stream open."""
        period = self.svc.settings.sse_keepalive_s
        if period is not None and time.monotonic() - self.sent_at >= period:
            yield ": keep-alive\n\n"

    def _delta(self, text: str) -> dict[str, Any] | str:
        return {"content": text} if self.kind == fmt.KIND_CHAT else text

    def _finish(self, row: InferenceRequest, sent: str) -> Iterator[str]:
        """End the stream as the row says. The stored output is the truth: text the stream
        lost (Redis restarted empty, or failed mid-way) is sent now; a stream that does not
        lead to it says it broke."""
        output = row.output_text or ""
        if row.status == RequestStatus.SUCCEEDED and not output.startswith(sent):
            yield from self._error("The request was restarted on another instance; the stream "
                                   "cannot continue.", "stream_interrupted")
            return
        self.finished = True
        if row.status == RequestStatus.REJECTED:
            refusal = _refusal(row)
            yield _sse(refusal.to_dict())
            return
        if row.status != RequestStatus.SUCCEEDED:
            yield from self._error(f"Request {row.id} ended with status {row.status}.",
                                   "generation_failed")
            return
        if len(output) > len(sent):
            yield self._text_chunk(output[len(sent):])
        empty: dict[str, Any] | str = {} if self.kind == fmt.KIND_CHAT else ""
        yield self._chunk(empty, fmt.finish_reason_of(row))
        if self.include_usage:
            final = self._base(empty, None)
            final.update(choices=[], usage=fmt.usage_of(row))
            yield _sse(final)
        yield "data: [DONE]\n\n"

    def _error(self, message: str, code: str) -> Iterator[str]:
        self.finished = True
        yield _sse({"error": {"message": message, "type": "server_error", "param": None,
                              "code": code}})

    def _base(self, delta: dict[str, Any] | str, finish_reason: str | None) -> dict[str, Any]:
        build: Callable[..., dict[str, Any]] = (
            fmt.chat_chunk if self.kind == fmt.KIND_CHAT else fmt.completion_chunk)
        chunk = build(self.request, self.model, delta, finish_reason)
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def _chunk(self, delta: dict[str, Any] | str, finish_reason: str | None) -> str:
        return _sse(self._base(delta, finish_reason))

    def _text_chunk(self, text: str) -> str:
        """`_chunk` of a text delta: the same event, from the frame built once per stream."""
        head, tail = self._text_frame
        return head + json.dumps(text) + tail

    @cached_property
    def _text_frame(self) -> tuple[str, str]:
        """A text delta's event before and after its JSON-encoded text. The text is the last
        string of the event that a client could choose (the model's name comes before it)."""
        head, found, tail = self._chunk(self._delta(_TEXT_MARKER), None).rpartition(
            json.dumps(_TEXT_MARKER))
        assert found, "the delta's text is not in its event"
        return head, tail


#: Stands for a delta's text while the frame of its event is built (`_Relay._text_frame`).
_TEXT_MARKER = "\x00text\x00"


def _gathered(events: Generator[str, None, bool]) -> tuple[str, bool]:
    """What `events` yields, joined, and what it returns."""
    pieces: list[str] = []
    while True:
        try:
            pieces.append(next(events))
        except StopIteration as stop:
            return "".join(pieces), stop.value


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def abandon(svc: Services, request_id: str, hold: Hold) -> None:
    """The call held by `hold` stops waiting for `request_id` (its client left, or the call
    ended early): cancel the request, which aborts it in its engine, unless another call still
    waits for it (the same Idempotency-Key)."""
    others = hold.others_waiting(request_id)
    if others:
        logger.info("%s left to the %d other call(s) waiting for it", request_id, others)
        return
    logger.info("cancelling %s: nobody waits for it", request_id)
    cancel_quietly(svc, request_id, hold.team_id)


def cancel_quietly(svc: Services, request_id: str, team_id: str) -> None:
    try:
        cancel_request(svc, request_id, team_id=team_id)
    except BlockqError:
        pass  # it finished meanwhile

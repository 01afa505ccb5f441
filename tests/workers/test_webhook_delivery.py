"""One webhook delivery attempt on the real PostgreSQL: attempts are numbered by the POSTs made
for the event (database outages do not count), and an event already delivered, whose message
came twice from the outbox, is not posted again."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import update

from domain.models import InferenceRequest, RequestStatus
from tests.stack.webhook_receiver import WebhookReceiver
from workers.runtime import Runtime
from workers.webhooks.delivery import attempt_delivery


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    server = WebhookReceiver()
    yield server
    server.close()


def test_attempts_are_counted_per_event_and_a_delivered_event_is_not_posted_again(
    rt: Runtime, routed_request: Callable[..., str], receiver: WebhookReceiver
) -> None:
    request_id = routed_request("gpu.0", 1, RequestStatus.SUCCEEDED)
    with rt.db.session() as session:
        session.execute(update(InferenceRequest).where(InferenceRequest.id == request_id)
                        .values(webhook_url=f"{receiver.url}/flaky"))

    outcomes = [attempt_delivery(rt.db, rt.settings, request_id, "request.succeeded")
                for _ in range(4)]

    assert [(o.number, o.succeeded) for o in outcomes if o] == [
        (1, False), (2, False), (3, True), (3, True)]
    assert len(receiver.deliveries) == 3  # the fourth message found it delivered
    assert len({headers["webhook-id"] for _, headers, _ in receiver.deliveries}) == 1

"""The transactional outbox on the real PostgreSQL and Redis: a committed message is sent and
forgotten; one the broker refused, or whose sender died right after the commit, waits in the
outbox until the relay sends it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import create_engine, event, func, select, text

from domain import dispatch, faults
from domain import outbox as outbox_module
from domain.celery_app import create_celery
from domain.db import Database
from domain.models import OutboxEntry
from domain.outbox import Outbox
from domain.queues import request_ids_in_broker
from domain.settings import Settings
from tests.environment import free_port

pytestmark = pytest.mark.services


@pytest.fixture
def db(fresh_services: Settings) -> Iterator[Database]:
    database = Database(fresh_services.resolved_database_url)
    yield database
    database.dispose()


def outbox_of(settings: Settings, db: Database) -> Outbox:
    return Outbox(db, create_celery(settings, set_as_current=False))


def in_predict_queue(settings: Settings) -> set[str]:
    return request_ids_in_broker(redis.Redis.from_url(settings.redis_url), ["predict"],
                                 fresh_s=60)


def staged(db: Database) -> int:
    with db.session() as session:
        return session.scalar(select(func.count()).select_from(OutboxEntry)) or 0


def new_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def test_a_committed_message_is_sent_then_forgotten(fresh_services: Settings,
                                                    db: Database) -> None:
    request_id = new_id()
    outbox = outbox_of(fresh_services, db)
    with outbox.transaction() as tx:
        tx.post(dispatch.predict(request_id, priority=0))
    assert in_predict_queue(fresh_services) == {request_id}  # sent at once
    assert outbox.flush()  # the delete runs on the outbox's own thread
    assert staged(db) == 0


def test_senders_do_not_wait_for_deletes_which_go_together(
    fresh_services: Settings, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delete that stalls holds no sender back; what they sent meanwhile goes in the next
    delete, all together."""
    # The first delete starts with the first entry (no gathering), so that it is the one
    # that stalls while the other senders go on.
    monkeypatch.setattr(outbox_module, "FORGET_LINGER_S", 0.0)
    outbox = outbox_of(fresh_services, db)
    forgetter = outbox._forgetter
    release, batches = threading.Event(), []
    delete_now = forgetter._delete

    def stalled_delete(entry_ids: list[int]) -> None:
        batches.append(len(entry_ids))
        if len(batches) == 1:
            assert release.wait(30)
        delete_now(entry_ids)

    forgetter._delete = stalled_delete  # type: ignore[method-assign]
    request_ids = [new_id() for _ in range(20)]
    for request_id in request_ids:
        with outbox.transaction() as tx:
            tx.post(dispatch.predict(request_id, priority=0))
    assert in_predict_queue(fresh_services) == set(request_ids)  # all sent, the delete stalled
    assert staged(db) > 0
    release.set()
    assert outbox.flush()
    assert staged(db) == 0
    assert len(batches) == 2 and sum(batches) == 20


def test_sent_entries_go_in_one_statement_whose_wal_setting_does_not_linger(
    fresh_services: Settings, db: Database
) -> None:
    """The delete of sent entries is one statement outside a transaction; its asynchronous
    commit is its own: the pooled connection it ran on commits the next transactions (an
    accepted request's, say) synchronously again."""
    db.engine.dispose()
    db.engine = create_engine(db.url, pool_size=1, max_overflow=0)  # one pooled connection
    statements: list[str] = []

    def seen(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(statement)

    outbox = outbox_of(fresh_services, db)
    with outbox.transaction() as tx:
        tx.post(dispatch.predict(new_id(), priority=0))
    event.listen(db.engine, "before_cursor_execute", seen)
    assert outbox.flush()
    event.remove(db.engine, "before_cursor_execute", seen)
    assert len(statements) == 1 and "DELETE FROM outbox" in statements[0]
    assert staged(db) == 0
    with db.engine.connect() as connection:
        assert connection.execute(text("SHOW synchronous_commit")).scalar_one() == "on"


def test_a_rolled_back_transaction_sends_nothing(fresh_services: Settings, db: Database) -> None:
    with pytest.raises(RuntimeError), outbox_of(fresh_services, db).transaction() as tx:
        tx.post(dispatch.predict(new_id(), priority=0))
        raise RuntimeError("the state change failed")
    assert staged(db) == 0
    assert in_predict_queue(fresh_services) == set()


def test_a_message_the_broker_refused_waits_for_the_relay(fresh_services: Settings,
                                                          db: Database) -> None:
    down = fresh_services.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})
    request_id = new_id()
    with outbox_of(down, db).transaction() as tx:  # commits although the broker is down
        tx.post(dispatch.predict(request_id, priority=0))
    assert staged(db) == 1

    assert outbox_of(down, db).relay(older_than_s=0) == 0  # still down: kept
    assert staged(db) == 1
    assert outbox_of(fresh_services, db).relay(older_than_s=0) == 1  # back
    assert staged(db) == 0
    assert in_predict_queue(fresh_services) == {request_id}


def test_the_relay_leaves_entries_their_sender_is_still_sending(fresh_services: Settings,
                                                                db: Database) -> None:
    with db.session() as session:
        session.add(OutboxEntry(task=dispatch.TASK_PREDICT, queue="predict", args=[new_id()],
                                kwargs={}, priority=0))
    assert outbox_of(fresh_services, db).relay(older_than_s=60) == 0
    assert staged(db) == 1


_SENDER = """
import sys
from domain import dispatch
from domain.celery_app import create_celery
from domain.db import Database
from domain.outbox import Outbox
from domain.settings import Settings

settings = Settings.load()
outbox = Outbox(Database(settings.resolved_database_url), create_celery(settings))
with outbox.transaction() as tx:
    tx.post(dispatch.predict(sys.argv[1], priority=0))
print("sent")
"""


def test_a_sender_that_dies_right_after_its_commit_loses_nothing(fresh_services: Settings,
                                                                 db: Database) -> None:
    request_id = new_id()
    env = {**os.environ, **fresh_services.as_env(), faults.CRASH_AFTER_COMMIT_ENV: "1"}
    died = subprocess.run([sys.executable, "-c", _SENDER, request_id], env=env,
                          capture_output=True, text=True, timeout=60)
    assert died.returncode == faults.CRASH_EXIT_CODE, died.stderr
    assert "sent" not in died.stdout
    assert staged(db) == 1 and in_predict_queue(fresh_services) == set()

    assert outbox_of(fresh_services, db).relay(older_than_s=0) == 1
    assert in_predict_queue(fresh_services) == {request_id}

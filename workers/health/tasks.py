"""Periodic tasks of the health worker (run by celery beat): the stranded-request sweep
(`sweep.py`) and the rebalance toward returned instances (`rebalance.py`), the outbox relay
(`domain/outbox.py`) and the retention purge (`domain/retention.py`)."""

from __future__ import annotations

import dataclasses
import logging

from celery import shared_task

from domain import dispatch, retention
from domain.controls import OperatorControls
from workers import runtime
from workers.health.ghosts import fail_unserved, forget_ghosts
from workers.health.rebalance import Rebalance
from workers.health.sweep import Sweep
from workers.health.undelivered import WebhookPolicy
from workers.locks import held
from workers.route.stage import exec_models

logger = logging.getLogger(__name__)

#: One scheduled purge stops after this long (the next goes on), so it holds one of the health
#: worker's threads for at most that; the lock outlives it, so purges never run side by side.
PURGE_MAX_RUN_S = 600.0
PURGE_LOCK_TTL_S = 2 * PURGE_MAX_RUN_S


@shared_task(name=dispatch.TASK_REQUEUE_ORPHANS)
def requeue_orphans() -> dict[str, int]:
    """Restore the operator's holds and policy override in Redis from the database; re-route
    work that no engine holds; send again the messages of requests no message concerns.

    Batch lines the releaser holds back are not requests yet (they wait in `batch_lines`), so
    this sweep never starts them; it only recovers batch requests already released.
    """
    rt = runtime.get()
    settings = rt.settings
    OperatorControls(rt.db, rt.fleet).restore()
    webhooks = WebhookPolicy(backoff_s=settings.webhook_backoff_s,
                             max_attempts=settings.webhook_max_attempts,
                             grace_s=settings.stranded_after_s + settings.webhook_timeout_s)
    report = Sweep(rt.outbox, rt.fleet, rt.redis, webhooks,
                   stranded_after_s=settings.stranded_after_s,
                   unacked_fresh_s=settings.unacked_fresh_s,
                   memory_s=settings.orphan_check_interval_s * 5,
                   hold_limit_s=(settings.routing_hold_max_s + settings.stranded_after_s
                                 if settings.routing_hold else 0.0)).run()
    if report.rerouted or report.resent or report.webhooks_resent:
        logger.warning("stranded-request sweep: rerouted %d, sent on again %d, webhooks sent "
                       "again %d", report.rerouted, report.resent, report.webhooks_resent)
    statuses = rt.fleet.statuses()
    forgotten = forget_ghosts(rt.fleet, statuses, settings.instance_expiry_s)
    unserved = fail_unserved(rt.outbox, rt.fleet, settings,
                             timeout_s=settings.unserved_model_timeout_s)
    # A returning instance takes work at once (after a crash, the survivors hold the backlog).
    rebalanced = Rebalance(rt.outbox, rt.redis, fleet=rt.fleet,
                           exec_models=exec_models(rt).for_candidates).run(
        [status for status in statuses if status.instance_id not in forgotten])
    if rebalanced:
        logger.warning("rebalance: %d waiting request(s) back to routing for returned "
                       "instances", rebalanced)
    return {**dataclasses.asdict(report), "rebalanced": rebalanced,
            "instances_forgotten": len(forgotten), "unserved_failed": len(unserved)}


@shared_task(name=dispatch.TASK_RELAY_OUTBOX)
def relay_outbox() -> int:
    """Send what the outbox still holds (its sender crashed or met a broker outage)."""
    rt = runtime.get()
    sent = rt.outbox.relay(older_than_s=rt.settings.outbox_relay_after_s)
    if sent:
        logger.warning("outbox relay sent %d message(s) their sender had not", sent)
    return sent


@shared_task(name=dispatch.TASK_PURGE)
def purge() -> dict[str, int]:
    """Delete what is older than its retention (domain.retention), for at most PURGE_MAX_RUN_S.
    Two runs would be safe side by side (rows are taken with SKIP LOCKED); the lock keeps a
    second one from taking the health worker's other thread, which the sweep and relay need."""
    rt = runtime.get()
    with held(rt.redis, "blockq:lock:retention-purge", ttl_s=PURGE_LOCK_TTL_S) as mine:
        return retention.purge(rt.settings, rt.db, max_run_s=PURGE_MAX_RUN_S) if mine else {}

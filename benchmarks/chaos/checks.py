"""The delivery guarantees, checked after the run from PostgreSQL, the webhook receiver, the
clients' records and Redis: one Finding per invariant."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx
from sqlalchemy import select

from benchmarks.chaos.leftovers import lasting_entries
from benchmarks.chaos.receiver import Delivery, WebhookReceiver
from benchmarks.chaos.services import OwnServices
from benchmarks.chaos.terminal import TERMINAL, TERMINAL_BATCH
from benchmarks.chaos.workload import Outcome
from domain.db import Database
from domain.models import Batch, BatchLine, InferenceRequest, RequestEvent, Team
from domain.settings import Settings
from workers.webhooks.events import event_id


@dataclass
class Finding:
    """One invariant: how many violate it, and a few stories (ids and what happened)."""

    name: str
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, story: str) -> None:
        self.count += 1
        if len(self.examples) < 8:
            self.examples.append(story)


def _story(row: Any, events: list[tuple[str, Any, str | None]]) -> str:
    trail = " > ".join(f"{status}@{at:%H:%M:%S.%f}"[:-3] + (f"({detail[:60]})" if detail else "")
                       for status, at, detail in events[-8:])
    return (f"{row.id} status={row.status} instance={row.instance_id} attempt={row.attempt} "
            f"created={row.created_at:%H:%M:%S} events: {trail}")


class Checker:
    """The guarantees, checked after the run from PostgreSQL, the receiver, clients and Redis."""

    def __init__(self, db: Database, services: OwnServices, settings: Settings,
                 receiver: WebhookReceiver, outcomes: list[Outcome],
                 team_keys: dict[str, str], api_url: str) -> None:
        """`team_keys`: team id -> an API key of the team."""
        self.db, self.services, self.settings = db, services, settings
        self.receiver, self.outcomes = receiver, outcomes
        self.team_keys, self.api_url = team_keys, api_url
        self.findings: dict[str, Finding] = {}
        #: Queued generate messages of an earlier attempt of a finished request (fenced).
        self.stale_messages: list[str] = []

    def finding(self, name: str) -> Finding:
        return self.findings.setdefault(name, Finding(name))

    def run(self) -> dict[str, Finding]:
        for name in ("accepted but no row", "lost (not terminal)", "completed twice",
                     "terminal without terminal event", "output over max_tokens",
                     "webhooks missing", "webhook bad signature", "webhook-id mismatch",
                     "webhook conflicting events", "batch inconsistencies",
                     "batch webhooks missing", "stream mismatches", "answer mismatches",
                     "completion retries not joined",
                     "leftover assignments", "leftover queue messages"):
            self.finding(name)
        with self.db.session() as session:
            rows = {r.id: r for r in session.scalars(select(InferenceRequest))}
            events: dict[str, list[tuple[str, Any, str | None]]] = defaultdict(list)
            for request_id, status, at, detail in session.execute(
                    select(RequestEvent.request_id, RequestEvent.status, RequestEvent.at,
                           RequestEvent.detail).order_by(RequestEvent.id)):
                events[request_id].append((status, at, detail))
            self._requests(rows, events)
            self._webhooks(rows, events)
            self._answers(rows, events)
            self._joined(rows)
            self._batches(session, rows)
        self._leftovers(rows)
        return self.findings

    def _requests(self, rows: dict[str, Any], events: dict[str, list[Any]]) -> None:
        for outcome in self.outcomes:
            if outcome.accepted and outcome.kind != "batch" and outcome.request_id not in rows:
                self.finding("accepted but no row").add(f"{outcome.kind} {outcome.request_id}")
        for row in rows.values():
            terminal_events = [e for e in events[row.id] if e[0] in TERMINAL]
            if row.status not in TERMINAL:
                self.finding("lost (not terminal)").add(_story(row, events[row.id]))
            elif not terminal_events:
                self.finding("terminal without terminal event").add(_story(row, events[row.id]))
            if len(terminal_events) > 1:
                self.finding("completed twice").add(_story(row, events[row.id]))
            if row.status == "succeeded" and (row.output_tokens is None
                                              or row.output_tokens > row.max_tokens):
                self.finding("output over max_tokens").add(
                    f"{row.id} output_tokens={row.output_tokens} max_tokens={row.max_tokens}")

    def _webhooks(self, rows: dict[str, Any], events: dict[str, list[Any]]) -> None:
        by_request: dict[str, list[Delivery]] = defaultdict(list)
        for delivery in self.receiver.snapshot():
            if not delivery.signature_ok:
                self.finding("webhook bad signature").add(
                    f"{delivery.webhook_id} {delivery.path}")
            payload = delivery.payload or {}
            subject = (payload.get("data") or {}).get("id", "?")
            expected = event_id(subject, payload.get("type", "?"))
            if delivery.webhook_id != expected or payload.get("id") != expected:
                self.finding("webhook-id mismatch").add(
                    f"{subject} {payload.get('type')} header={delivery.webhook_id} "
                    f"payload={payload.get('id')} expected={expected}")
            if delivery.path == "/requests":
                by_request[subject].append(delivery)
        for row in rows.values():
            if not row.webhook_url or row.status not in TERMINAL:
                continue
            deliveries = by_request.get(row.id, [])
            types = {(d.payload or {}).get("type") for d in deliveries}
            if len(types) > 1:
                self.finding("webhook conflicting events").add(
                    f"{row.id} final={row.status} events={sorted(map(str, types))}")
            wanted = f"request.{row.status}"
            if not any(d.answered < 300 and d.signature_ok
                       and (d.payload or {}).get("type") == wanted for d in deliveries):
                seen = [f"{(d.payload or {}).get('type')}->{d.answered}" for d in deliveries]
                self.finding("webhooks missing").add(
                    f"{_story(row, events[row.id])} deliveries={seen}")

    def _joined(self, rows: dict[str, Any]) -> None:
        """Every try of a completion sent its key: the request its client got is the one the key
        names, and no other request holds the key's choices (a cancelled one let go of it)."""
        by_key = {row.idempotency_key.split(":openai:", 1)[1]: row for row in rows.values()
                  if row.idempotency_key and ":openai:" in row.idempotency_key}
        for outcome in self.outcomes:
            if outcome.key is None or not outcome.accepted or outcome.request_id is None:
                continue
            row = by_key.get(f"{outcome.key}:0")
            if row is None or row.id != outcome.request_id:
                self.finding("completion retries not joined").add(
                    f"key {outcome.key}: client got {outcome.request_id}, the key names "
                    f"{row.id if row is not None else 'no request'} after {outcome.tries} tries")

    def _answers(self, rows: dict[str, Any], events: dict[str, list[Any]]) -> None:
        for outcome in self.outcomes:
            if not outcome.accepted or outcome.text is None or outcome.request_id not in rows:
                continue
            row = rows[outcome.request_id]
            if row.status != "succeeded" or outcome.interrupted:
                continue
            if outcome.text != (row.output_text or ""):
                name = "stream mismatches" if outcome.kind.endswith("_stream") else \
                    "answer mismatches"
                self.finding(name).add(
                    f"{row.id} client got {len(outcome.text)} chars, stored "
                    f"{len(row.output_text or '')}: {_story(row, events[row.id])}")

    def _batches(self, session: Any, rows: dict[str, Any]) -> None:
        accepted = {o.request_id: o for o in self.outcomes if o.kind == "batch" and o.accepted}
        deliveries = [d for d in self.receiver.snapshot() if d.path == "/batches"]
        teams = {t.id: t for t in session.scalars(select(Team))}
        for batch in session.scalars(select(Batch)):
            issues = self._batch_issues(session, batch, accepted.get(batch.id), rows)
            for issue in issues:
                self.finding("batch inconsistencies").add(f"{batch.id} {issue}")
            team = teams.get(batch.team_id)
            if batch.status in TERMINAL_BATCH and team is not None and team.webhook_url:
                wanted = event_id(batch.id, f"batch.{batch.status}")
                if not any(d.webhook_id == wanted and d.answered < 300 and d.signature_ok
                           for d in deliveries):
                    self.finding("batch webhooks missing").add(f"{batch.id} batch.{batch.status}")

    def _batch_issues(self, session: Any, batch: Batch, outcome: Outcome | None,
                      rows: dict[str, Any]) -> list[str]:
        if batch.status not in TERMINAL_BATCH:
            return [f"not terminal: status={batch.status}"]
        if batch.status != "completed":
            return [f"ended {batch.status}: errors={batch.errors}"]
        issues = []
        line_ids = [c for (c,) in session.execute(
            select(BatchLine.custom_id).where(BatchLine.batch_id == batch.id))]
        if outcome is not None and batch.num_lines != outcome.lines:
            issues.append(f"num_lines={batch.num_lines}, uploaded {outcome.lines}")
        counts, output, errors = self._batch_files(batch)
        total = counts.get("total", 0)
        if counts.get("completed", 0) + counts.get("failed", 0) != total:
            issues.append(f"request_counts {counts}: completed+failed != total")
        if len(output) + len(errors) != len(line_ids):
            issues.append(f"output {len(output)} + error {len(errors)} lines != "
                          f"{len(line_ids)} input lines")
        custom_ids = [line.get("custom_id") for line in output + errors]
        duplicated = [c for c, n in Counter(custom_ids).items() if n > 1]
        if duplicated:
            issues.append(f"custom_ids more than once: {duplicated[:5]}")
        if set(custom_ids) != set(line_ids):
            issues.append(f"custom_ids missing {sorted(set(line_ids) - set(custom_ids))[:5]}, "
                          f"unknown {sorted(set(custom_ids) - set(line_ids))[:5]}")
        return issues

    def _batch_files(self, batch: Batch
                     ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        """The batch's request_counts, output lines and error lines, as its team sees them."""
        key = self.team_keys[batch.team_id]
        with httpx.Client(base_url=self.api_url, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as client:
            counts = client.get(f"/v1/batches/{batch.id}").json().get("request_counts", {})
            output = _file_lines(client, batch.output_file_id)
            errors = _file_lines(client, batch.error_file_id)
        return counts, output, errors

    def _leftovers(self, rows: dict[str, Any]) -> None:
        for entry in lasting_entries(self.services.redis_url, self.settings.instance_ids):
            kind, _, what = entry.partition(" ")
            if kind == "queued" and _only_a_fenced_generate(what, rows):
                # NOTE: a scaled-down instance's queue may keep the message of a request its
                # drain sent back to routing: that request ran elsewhere under a later attempt,
                # and an engine that ever consumes the message discards it (attempt fencing).
                # Nothing is lost or done twice; docs/chaos.md counts these apart.
                self.stale_messages.append(what)
                continue
            name = "leftover assignments" if kind == "assigned" else "leftover queue messages"
            self.finding(name).add(what)


_GENERATE = re.compile(
    r": 1 waiting, oldest serve\.generate\[[^\]]*\] argsrepr=\['(req_\w+)', (\d+)\]$")


def _only_a_fenced_generate(what: str, rows: dict[str, Any]) -> bool:
    """Whether a queue's leftover is one generate message of an attempt its request has since
    passed, the request finished (what an engine consuming it would discard)."""
    match = _GENERATE.search(what)
    if match is None:
        return False
    row = rows.get(match.group(1))
    return (row is not None and int(match.group(2)) < row.attempt
            and row.status in TERMINAL)


def _file_lines(client: httpx.Client, file_id: str | None) -> list[dict[str, Any]]:
    if not file_id:
        return []
    response = client.get(f"/v1/files/{file_id}/content")
    response.raise_for_status()
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]

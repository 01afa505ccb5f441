"""The registry's active model of one (kind, scope), reloaded in a running worker when a
promotion or rollback changes it: no restart needed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from domain import model_registry as registry
from domain.db import Database
from domain.models import ModelVersion

__all__ = ["ActiveModel"]

logger = logging.getLogger(__name__)

Model = TypeVar("Model")


class ActiveModel(Generic[Model]):
    """`get()` returns the active version's model, checking the registry at most every
    `interval_s`; with no active version, the `default` (packaged or configured) model."""

    def __init__(self, db: Database, kind: str, scope: str, *, load: Callable[[bytes], Model],
                 default: Callable[[], Model], interval_s: float) -> None:
        self.db, self.kind, self.scope = db, kind, scope
        self._load, self._default = load, default
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._model: Model | None = None
        self.version_id: int | None = None
        self._next_check = 0.0

    def get(self) -> Model:
        if time.monotonic() >= self._next_check or self._model is None:
            with self._lock:
                if time.monotonic() >= self._next_check or self._model is None:
                    self._refresh()
        assert self._model is not None
        return self._model

    def _refresh(self) -> None:
        self._next_check = time.monotonic() + self.interval_s
        try:
            with self.db.session() as session:
                version_id = registry.active_id(session, self.kind, self.scope)
                if self._model is not None and version_id == self.version_id:
                    return
                row = session.get(ModelVersion, version_id) if version_id is not None else None
                artifact = row.artifact if row is not None else None
        except Exception:  # noqa: BLE001 - keep serving with the model already loaded
            if self._model is None:
                raise
            logger.exception("could not check the active %s model of %s", self.kind, self.scope)
            return
        try:
            self._model = self._load(artifact) if artifact is not None else self._default()
        except Exception:  # noqa: BLE001 - a bad artifact must not stop a serving worker
            if self._model is None:
                raise
            logger.exception("could not load %s model row %s; keeping row %s", self.kind,
                             version_id, self.version_id)
            return
        if version_id != self.version_id:
            logger.info("active %s model of %s: version row %s", self.kind, self.scope,
                        version_id)
        self.version_id = version_id

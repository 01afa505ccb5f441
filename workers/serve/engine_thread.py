"""The threaded harness both engines share: one engine thread fed by many submitting threads.

`ThreadedEngine` owns what does not depend on the engine: starting and stopping the engine
thread, the inbox of submitted requests and aborts, deduplication by request id (a redelivered
id gets the future it already has, in flight or recently finished), futures and their results,
and listener calls. A subclass supplies the engine itself through hooks that all run on the
engine thread, except `_track` and `_prepare` (the submitting thread):

- `_open()` builds the engine (start() returns once it did, or raises what it raised),
  `_close()` releases it after the loop ended;
- `_prepare(request)` does slow per-request work outside the lock (tokenizing), `_track(...)`
  makes the bookkeeping of a request (or raises `RequestRejected`);
- `_admit(requests)` hands new requests to the engine, `_abort(request_ids)` takes requests out
  and resolves them with "abort";
- `_has_work()` says whether a step is due, `_step()` runs one;
- `snapshot()` reads the state the subclass keeps.

Threading rule: everything under the comment "guarded by _cond" is read and written only with
`_cond` held; futures are resolved and listeners called outside it (done-callbacks and listener
hooks run right there, and must not run under our lock).
"""

from __future__ import annotations

import collections
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import ClassVar, Generic, TypeVar

from workers.serve.engine import (
    EngineListener,
    EngineStopped,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    RequestRejected,
    TokenLogprob,
)

__all__ = ["NUM_RECENT_RESULTS", "ThreadedEngine", "TrackedRequest"]

#: Finished requests remembered so that a redelivered submit gets the finished future back.
NUM_RECENT_RESULTS = 1024


@dataclass(slots=True, eq=False)
class TrackedRequest:
    """The engine's bookkeeping for one submitted request (written under the lock)."""

    request: GenerationRequest
    future: Future[GenerationResult]
    admitted_at: float  # time.time() when submitted
    num_prompt_tokens: int = 0  # 0 until the engine has tokenized the prompt
    num_output_tokens: int = 0
    first_token_at: float | None = None
    text_parts: list[str] = field(default_factory=list)
    # When the request asks for logprobs: one per output token, and the prompt's (echo).
    output_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def result(self, finish_reason: FinishReason, finished_at: float) -> GenerationResult:
        return GenerationResult(
            request_id=self.request.request_id,
            output_text="".join(self.text_parts),
            num_prompt_tokens=self.num_prompt_tokens,
            num_output_tokens=self.num_output_tokens,
            finish_reason=finish_reason,
            admitted_at=self.admitted_at,
            first_token_at=self.first_token_at,
            finished_at=finished_at,
            logprobs=self._logprobs(),
        )

    def _logprobs(self) -> dict[str, list[TokenLogprob]] | None:
        sampling = self.request.sampling
        if sampling.logprobs is None:
            return None
        logprobs = {"output": list(self.output_logprobs)}
        if sampling.echo:
            logprobs["prompt"] = list(self.prompt_logprobs or ())
        return logprobs


TrackedT = TypeVar("TrackedT", bound=TrackedRequest)


class ThreadedEngine(Generic[TrackedT]):
    """`Engine` harness: lifecycle, inbox, dedup, futures, listener; see the module docstring."""

    #: engine_kind in snapshots ("vllm", "emulated").
    kind: ClassVar[str]
    #: How log lines and errors name the engine ("vLLM engine", "emulated engine").
    display_name: ClassVar[str]
    #: Name of the engine thread.
    thread_name: ClassVar[str]

    def __init__(self, listener: EngineListener | None = None) -> None:
        self.listener = listener if listener is not None else EngineListener()
        # Log lines keep the name of the module that defines the engine.
        self._logger = logging.getLogger(type(self).__module__)
        self._cond = threading.Condition(threading.Lock())
        # --- guarded by _cond ---
        self._inflight: dict[str, TrackedT] = {}
        self._recent: collections.OrderedDict[str, Future[GenerationResult]] = (
            collections.OrderedDict()
        )
        self._inbox: list[TrackedT] = []
        self._abort_ids: list[str] = []
        self._stopping = False
        # --- written once by the engine thread before _ready is set ---
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Build the engine on the engine thread; block until it is ready, or raise."""
        if self._thread is not None:
            raise RuntimeError(f"{type(self).__name__}.start() called twice")
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            self._thread.join()
            raise self._startup_error

    def stop(self) -> None:
        """End the engine loop, release the engine; pending futures fail with EngineStopped."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def alive(self) -> bool:
        """True while the engine loop runs and accepts requests."""
        return (
            self._thread is not None
            and self._thread.is_alive()
            and self._ready.is_set()
            and self._startup_error is None
            and not self._stopping
        )

    # ---------------------------------------------------------------- requests

    def submit(self, request: GenerationRequest) -> Future[GenerationResult]:
        """Queue a request for the next step; a request id in flight (or recently finished)
        returns its existing future instead of starting a second generation.

        A caller may `cancel()` the future until the engine thread admits the request (usually
        well under one step); after that, use `abort()`. A request the engine refuses gets a
        future failed with `RequestRejected`.
        """
        if request.max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {request.max_tokens}")
        with self._cond:
            known = self._known_future(request.request_id)
            if known is not None:
                return known
        prepared = self._prepare(request)  # outside the lock: may be slow
        with self._cond:
            known = self._known_future(request.request_id)
            if known is not None:
                return known
            if self._stopping or not self.alive:
                raise EngineStopped(
                    f"{self.display_name} is not running; cannot take {request.request_id}"
                )
            future: Future[GenerationResult] = Future()
            try:
                tracked = self._track(request, future, prepared)
            except RequestRejected as rejected:
                future.set_exception(rejected)
                return future
            self._inflight[request.request_id] = tracked
            self._inbox.append(tracked)
            self._cond.notify_all()
            return future

    def abort(self, request_id: str) -> None:
        """Stop a request; its future resolves with finish_reason "abort". Unknown ids: no-op."""
        with self._cond:
            if request_id in self._inflight:
                self._abort_ids.append(request_id)
                self._cond.notify_all()

    def _known_future(self, request_id: str) -> Future[GenerationResult] | None:
        """The future of a request in flight or recently finished. Called under the lock."""
        tracked = self._inflight.get(request_id)
        return tracked.future if tracked is not None else self._recent.get(request_id)

    # ---------------------------------------------------------------- hooks

    def _prepare(self, request: GenerationRequest) -> object:
        """Per-request work done before taking the lock; handed to `_track`."""
        return None

    def _track(
        self, request: GenerationRequest, future: Future[GenerationResult], prepared: object
    ) -> TrackedT:
        """Bookkeeping for a new request, or `RequestRejected`. Called under the lock."""
        raise NotImplementedError

    def _open(self) -> None:
        """Build the engine. Runs on the engine thread before the loop."""

    def _close(self) -> None:
        """Release the engine. Runs on the engine thread after the loop."""

    def _has_work(self) -> bool:
        """Whether the engine holds requests to step. Engine thread (lock held or not)."""
        raise NotImplementedError

    def _admit(self, admitted: list[TrackedT]) -> None:
        """Hand newly submitted requests to the engine."""
        raise NotImplementedError

    def _abort(self, request_ids: list[str]) -> None:
        """Take these requests out of the engine and resolve them with "abort"."""
        raise NotImplementedError

    def _step(self) -> None:
        """One engine step: run it, record its output, notify, resolve finished requests."""
        raise NotImplementedError

    # ---------------------------------------------------------------- engine thread

    def _run(self) -> None:
        try:
            self._open()
        except BaseException as err:  # noqa: BLE001 - handed to start()'s caller
            self._startup_error = err
            self._ready.set()
            return
        self._ready.set()
        error: BaseException | None = None
        try:
            self._loop()
        except BaseException as err:  # noqa: BLE001 - the loop died: fail every request
            self._logger.exception("%s loop died", self.display_name)
            error = err
        finally:
            self._fail_pending(error)
            self._close()

    def _loop(self) -> None:
        """Admit what was submitted, apply aborts, step; sleep while there is nothing to do."""
        while True:
            with self._cond:
                while not (self._stopping or self._inbox or self._abort_ids or self._has_work()):
                    self._cond.wait()
                if self._stopping:
                    return
                admitted, self._inbox = self._inbox, []
                abort_ids, self._abort_ids = self._abort_ids, []
            aborted = set(abort_ids)
            self._admit([t for t in admitted if t.request_id not in aborted])
            if abort_ids:
                self._abort(abort_ids)
            if self._has_work():
                self._step()

    def _fail_pending(self, error: BaseException | None) -> None:
        """The loop ended: every request still in flight fails with EngineStopped."""
        with self._cond:
            self._stopping = True
            pending = list(self._inflight.values())
            self._inflight.clear()
            self._inbox.clear()
        name = self.display_name
        reason = f"{name} stopped" if error is None else f"{name} died: {error!r}"
        for tracked in pending:
            if not tracked.future.done():
                exc = EngineStopped(f"{reason}; request {tracked.request_id} lost")
                exc.__cause__ = error
                tracked.future.set_exception(exc)

    def _resolve(self, tracked: TrackedT, reason: FinishReason, now: float) -> None:
        """Complete a request's future (outside the lock: done-callbacks run right here)."""
        if tracked.future.done():  # cancelled by its caller before admission
            return
        tracked.future.set_result(tracked.result(reason, now))

    def _remember(self, request_id: str, future: Future[GenerationResult]) -> None:
        """Keep a completed request's future for deduplication. Called under the lock.

        NOTE: aborted and failed requests are not remembered: they may legitimately come back
        (re-routed after a drain, retried after an error) and must then run again.
        """
        self._recent[request_id] = future
        while len(self._recent) > NUM_RECENT_RESULTS:
            self._recent.popitem(last=False)

    def _notify(self, hook: str, *args: object) -> None:
        # NOTE: a faulty listener must not take every in-flight request down with the engine;
        # its error is logged with a traceback and the loop goes on.
        try:
            getattr(self.listener, hook)(*args)
        except Exception:  # noqa: BLE001
            self._logger.exception("%s: listener %s failed", self.display_name, hook)

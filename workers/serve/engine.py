"""What an engine worker needs from an inference engine, whatever the engine (vLLM or emulated).

Plain data crosses this boundary: a `GenerationRequest` goes in, a `Future` of a
`GenerationResult` comes out, and `snapshot()` tells the router what the engine holds right now
(a `workers.sim.engine_state.EngineState`, the published state's one form).
An engine owns its own thread; every method here may be called from any thread, and callbacks on
an `EngineListener` run on the engine's thread, so they must be quick and must not block.

Nothing here imports vLLM: the emulated engine, the router and tests use these types without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from workers.sim.engine_state import EngineState

__all__ = [
    "FinishReason",
    "SamplingOptions",
    "TokenLogprob",
    "GenerationRequest",
    "GenerationResult",
    "StepSample",
    "EngineListener",
    "Engine",
    "EngineStopped",
    "RequestRejected",
    "GenerationFailed",
]

#: "stop": EOS or a stop string; "length": hit max_tokens (or max_model_len);
#: "abort": aborted through `Engine.abort`.
FinishReason = Literal["stop", "length", "abort"]


class EngineStopped(Exception):
    """The engine was stopped (or never started): the request cannot run on it.

    Raised by `Engine.submit` after `Engine.stop`, and set on the futures of requests that
    were still pending when the engine stopped. A task that sees it should let the request be
    routed again rather than fail it.
    """


class RequestRejected(ValueError):
    """The engine refused the request as invalid (e.g. its prompt exceeds max_model_len).

    Set on the request's future; running it again, anywhere, fails the same way.
    """


class GenerationFailed(Exception):
    """The engine failed one request internally; the engine itself goes on.

    Set on the request's future; running it again may succeed.
    """


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """Sampling parameters beyond the common ones (domain.sampling), each at its neutral default
    unless the client set it; and what logprobs to return."""

    top_k: int = 0  # 0 or -1: no top-k
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias)
    logprobs: int | None = None  # alternatives per output token; None: no logprobs
    echo: bool = False  # with logprobs: the prompt tokens' logprobs too

    @classmethod
    def from_column(cls, column: Mapping[str, Any] | None) -> SamplingOptions:
        """From a request's `sampling` column (JSON: logit_bias keys are strings)."""
        column = dict(column or {})
        column.pop("prompt_only", None)  # a rendering matter
        bias = column.pop("logit_bias", None) or {}
        stop_ids = column.pop("stop_token_ids", None) or ()
        return cls(**column, stop_token_ids=tuple(stop_ids),
                   logit_bias=tuple((int(token), float(b)) for token, b in bias.items()))

    @property
    def prompt_logprobs(self) -> int | None:
        """Alternatives per prompt token (echo with logprobs), else None."""
        return self.logprobs if self.echo else None


#: One token's logprob as stored and rendered (domain.openai_format): {"id", "token", "logprob",
#: "top": [{"id", "token", "logprob", "rank"}, ...]}; the first prompt token's logprob is None.
TokenLogprob = dict[str, Any]


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One generation to run; the engine's unit of work."""

    request_id: str  # unique per request across the platform; the engine's dedup key
    prompt: str  # already rendered text (the chat template is applied upstream)
    max_tokens: int  # upper bound on output tokens
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None  # per-request sampling seed, for reproducible outputs
    stop: tuple[str, ...] = ()  # stop strings; not included in the output text
    priority: int = 0  # lower runs first (0 interactive, 1 batch); honoured inside the engine
    predicted_output_tokens: int | None = None  # the length predictor's guess, for snapshots
    sampling: SamplingOptions = SamplingOptions()
    # A prompt given as token ids: the engine takes these, not `prompt` (their text).
    prompt_token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """A finished (or aborted) generation."""

    request_id: str
    output_text: str  # everything generated (for "abort": what was generated until then)
    num_prompt_tokens: int  # as the engine's tokenizer counts them (special tokens included)
    num_output_tokens: int
    finish_reason: FinishReason  # "stop" | "length" | "abort"
    admitted_at: float  # time.time() when handed to the engine (`Engine.submit`)
    first_token_at: float | None  # time.time() of the first output token; None if none came
    finished_at: float  # time.time() when the result was made
    # When asked for (SamplingOptions.logprobs): {"output": [TokenLogprob, ...]} and, with echo,
    # "prompt": [...]; None otherwise.
    logprobs: dict[str, list[TokenLogprob]] | None = None


@dataclass(frozen=True, slots=True)
class StepSample:
    """One engine step, for fitting the execution-time model.

    The token counts and context features follow `workers.sim.exec_model.BatchStats`, so that
    a model fitted on samples prices the simulator's steps with the same features: a decode is
    a one-token chunk at the end of its sequence, every other chunk is prefill (a preempted
    request's recomputation included). The context features are 0 where an engine does not
    know them (fitting gives a feature no sample carries coefficient 0).
    """

    at: float  # time.time() when the step ended
    duration_ms: float  # wall time of the step
    num_seqs: int  # requests that computed tokens in this step
    num_prefill_tokens: int  # tokens of prefill chunks (prompts, recomputation)
    num_decode_tokens: int  # decode tokens computed (one per decoding request)
    num_running: int  # running requests after the step
    num_waiting: int  # waiting requests after the step
    kv_cache_usage: float  # fraction of KV-cache blocks in use after the step, 0..1
    decode_context_tokens: int = 0  # sum over decodes of their sequence's tokens
    prefill_chunk_x_context: int = 0  # sum over prefill chunks of new tokens x computed before
    prefill_chunk_sq: int = 0  # sum over prefill chunks of new tokens squared


class EngineListener:
    """Hooks an engine calls on its own thread; override the ones you need.

    NOTE: they run inside the engine loop, between two steps: anything slow here (network,
    database) stalls every request in the batch. Hand the data to another thread instead.
    An exception raised here is logged by the engine and does not stop it.
    """

    def on_first_token(self, request_id: str, at: float) -> None:
        """The request produced its first output token at `at` (time.time())."""

    def on_tokens(self, request_id: str, delta_text: str) -> None:
        """New output text of a request, in order; for streaming."""

    def on_step(self, sample: StepSample) -> None:
        """One engine step ran."""


@runtime_checkable
class Engine(Protocol):
    """An inference engine hosted in the worker process, batching every request it holds."""

    def start(self) -> None:
        """Build the engine and start its thread; return once it is ready, or raise."""
        ...

    def stop(self) -> None:
        """Stop the thread and release the engine; pending futures fail with `EngineStopped`."""
        ...

    @property
    def alive(self) -> bool:
        """True while the engine loop runs and takes requests (False once it died or stopped)."""
        ...

    def submit(self, request: GenerationRequest) -> Future[GenerationResult]:
        """Hand a request to the engine and return at once.

        A request whose id is already in flight is not started again: the same future is
        returned (a redelivered task must not start a second generation).
        """
        ...

    def abort(self, request_id: str) -> None:
        """Stop a request; its future resolves with finish_reason "abort". Unknown ids: no-op."""
        ...

    def snapshot(self) -> EngineState:
        """The engine's current state (what its host publishes); cheap and thread-safe."""
        ...

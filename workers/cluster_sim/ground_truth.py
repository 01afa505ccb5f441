"""The cluster's ground truth: vLLM instances that run `workers.sim.Scheduler` in simulated time.

Each instance schedules with the simulator's scheduler model, on the requests' TRUE output
lengths, and prices every step with an execution-time model times seeded multiplicative
noise. What the router may see of it is `GroundTruthInstance.snapshot`: the lengths there are
the predicted ones, as an engine publishes them. With prefix caching on (the config's), requests
carrying prefix hashes share cached prefix units (`workers.sim.block_pool`), and a snapshot
publishes the units the cache holds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from workers.sim import (
    ExecModel,
    InstanceConfig,
    InstanceSnapshot,
    Scheduler,
    SeqState,
    SimRequest,
    StepResult,
    request_priority,
)
from workers.sim.snapshot import prefix_keys

__all__ = ["GroundTruthInstance", "SimulatedRequest"]

#: Noise factors drawn at a time (one per step): the draw order fixes the results.
NOISE_BATCH = 4096


class SimulatedRequest:
    """One request's ground truth and outcome (its scheduling state is the scheduler's)."""

    __slots__ = ("request_id", "arrival_s", "num_prompt_tokens", "max_output_tokens",
                 "predicted_output_tokens", "first_token_s", "finish_s", "instance_id",
                 "what_if_e2e_s", "prefix_hashes", "num_cached_tokens")

    def __init__(self, request_id: str, arrival_s: float, num_prompt_tokens: int,
                 max_output_tokens: int, predicted_output_tokens: int,
                 prefix_hashes: tuple[int, ...] = ()) -> None:
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.num_prompt_tokens = num_prompt_tokens
        #: The true output length: the request finishes when it has this many tokens.
        self.max_output_tokens = max_output_tokens
        #: What the router planned with (published with the request, as engines do).
        self.predicted_output_tokens = predicted_output_tokens
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.instance_id: str | None = None
        #: The chosen instance's simulated end-to-end latency, when the policy simulated.
        self.what_if_e2e_s: float | None = None
        #: The prompt's prefix hashes (`SimRequest.prefix_hashes`); empty: none known.
        self.prefix_hashes = prefix_hashes
        #: Prompt tokens its instance's prefix cache served at its (first) admission.
        self.num_cached_tokens: int | None = None


class GroundTruthInstance:
    """One vLLM instance: FCFS or priority scheduling (its config's), chunked prefill,
    recompute preemption, noisy step times.

    An instance runs whole steps: `run_until` executes every step that starts before the
    given moment, so the instance's clock may end up one step past it.
    """

    def __init__(self, instance_id: str, config: InstanceConfig, exec_model: ExecModel,
                 noise_sigma: float = 0.0, seed: int | Sequence[int] = 0) -> None:
        self.instance_id = instance_id
        self.config = config
        self.exec_model = exec_model
        self.scheduler = Scheduler(config)
        self.now_s = 0.0
        self.num_steps = 0
        #: Unfinished requests by id: outcomes and predicted lengths beside the scheduler's state.
        self._requests: dict[str, SimulatedRequest] = {}
        self._noise_sigma = noise_sigma
        self._noise_rng = np.random.default_rng(seed)
        self._noise: list[float] = []
        self._noise_index = 0

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_unfinished_requests

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    @property
    def num_free_blocks(self) -> int:
        return self.scheduler.block_pool.num_free

    def add(self, request: SimulatedRequest, at_s: float) -> None:
        """Queue `request` arriving at `at_s` (not before the instance's present)."""
        self.run_until(at_s)
        if not self.has_work:
            self.now_s = max(self.now_s, at_s)
        request.instance_id = self.instance_id
        self._requests[request.request_id] = request
        keys = prefix_keys(SimRequest(request.request_id, request.num_prompt_tokens,
                                      prefix_hashes=request.prefix_hashes), self.config)
        self.scheduler.add_request(SeqState(request.request_id, request.num_prompt_tokens,
                                            request.max_output_tokens,
                                            priority=self.priority_of(request),
                                            arrival_s=request.arrival_s, prefix_keys=keys))

    def priority_of(self, request: SimulatedRequest) -> int:
        """The vLLM priority an engine gives `request` (used under the "priority" policy):
        predicted-shortest-first with aging, from its arrival and predicted length."""
        return request_priority(request.arrival_s, request.predicted_output_tokens,
                                self.config.priority_ms_per_token)

    def run_until(self, until_s: float) -> None:
        """Run every step that starts before `until_s`."""
        while self.now_s < until_s and self.has_work:
            self.step()

    def run_to_end(self) -> None:
        while self.has_work:
            self.step()

    def snapshot(self) -> InstanceSnapshot:
        """What the engine publishes now (lengths as predicted, not the true ones)."""
        scheduler = self.scheduler
        requests = [self._published(seq, True) for seq in scheduler.running]
        requests += [self._published(seq, False) for seq in scheduler.waiting]
        cached = scheduler.block_pool.cached_keys() if self.config.enable_prefix_caching else (
            frozenset())
        return InstanceSnapshot(self.config, self.num_free_blocks, tuple(requests), cached)

    def step(self) -> StepResult:
        """One engine step of the scheduler model, priced; records first tokens and finishes."""
        result = self.scheduler.step()
        # NOTE: under the priority policy a step can preempt its first running request
        # (the lowest priority) and schedule nothing; it takes no time.
        assert result.output.num_scheduled_tokens or result.output.preempted_ids, (
            f"{self.instance_id}: a step with work scheduled nothing")
        duration_ms = self.exec_model.step_ms(result.output.stats)
        self.now_s += duration_ms * self._next_noise() / 1000.0
        self.num_steps += 1
        now_s = self.now_s
        requests = self._requests
        if self.config.enable_prefix_caching:
            self._record_hits(result)
        for request_id in result.sampled_ids:
            request = requests[request_id]
            if request.first_token_s is None:
                request.first_token_s = now_s
        for request_id in result.finished_ids:
            requests.pop(request_id).finish_s = now_s
        return result

    def _record_hits(self, result: StepResult) -> None:
        """Note the cache hit of each request admitted for the first time in this step."""
        requests = self._requests
        seqs = self.scheduler.requests
        for request_id, num_new in result.output.num_scheduled_tokens.items():
            request = requests[request_id]
            if request.num_cached_tokens is None and request_id in seqs:
                request.num_cached_tokens = seqs[request_id].num_computed_tokens - num_new
            elif request.num_cached_tokens is None:  # finished in this very step
                request.num_cached_tokens = request.num_prompt_tokens - num_new

    def _published(self, seq: SeqState, is_running: bool) -> SimRequest:
        """A request as the engine publishes it, with no hashes (the cache is published) but
        the prefix the cache holds for it: a waiting one's hit if admitted now, a running
        one's computed units (shared: not its own blocks to free)."""
        predicted = self._requests[seq.request_id].predicted_output_tokens
        cached = 0
        if seq.prefix_keys:
            unit = self.config.prefix_unit_tokens
            max_units = seq.num_computed_tokens // unit if is_running else len(seq.prefix_keys)
            num_units, _ = self.scheduler.block_pool.match_prefix(seq.prefix_keys, max_units)
            cached = num_units * unit
        return SimRequest(seq.request_id, seq.num_prompt_tokens, seq.num_computed_tokens,
                          seq.num_output_tokens, predicted, is_running, cached,
                          priority=seq.priority)

    def _next_noise(self) -> float:
        if not self._noise_sigma:
            return 1.0
        if self._noise_index >= len(self._noise):
            sigma = self._noise_sigma
            self._noise = self._noise_rng.lognormal(-sigma * sigma / 2, sigma,
                                                    NOISE_BATCH).tolist()
            self._noise_index = 0
        self._noise_index += 1
        return self._noise[self._noise_index - 1]

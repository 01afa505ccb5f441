"""The independent ground truth: instances driven by the installed vLLM's own scheduler."""

from __future__ import annotations

import dataclasses
import random
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

from tests.workers.cluster_sim.instance_configs import random_config
from workers.cluster_sim import ClusterSetup, GroundTruthInstance, SimulatedRequest
from workers.cluster_sim.predictors import OraclePredictor
from workers.cluster_sim.simulation import ground_truth_class, simulate
from workers.cluster_sim.workload import Workload, poisson_unit_arrivals
from workers.sim import BatchStats, ExecModel, InstanceConfig, bundled_model

if TYPE_CHECKING:
    from workers.cluster_sim.vllm_ground_truth import VllmGroundTruthInstance

#: vLLM's own scheduler (and its seconds of imports): in the full suite, not in `make test-fast`.
pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def vg() -> ModuleType:
    """workers.cluster_sim.vllm_ground_truth, imported when a test here runs: vLLM (and torch)
    take seconds to import, which every test process would pay at collection otherwise."""
    pytest.importorskip("vllm")
    from workers.cluster_sim import vllm_ground_truth

    return vllm_ground_truth


#: The Block paper's vLLM settings for Qwen2-7B on an A30.
PAPER_QWEN = InstanceConfig(7289, 16, 48, 512, 4096)



def test_the_scheduler_gets_the_instance_settings_without_a_model(vg: ModuleType) -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    make_vllm_scheduler = vg.make_vllm_scheduler
    for blocks in (1052, 7289):
        config = InstanceConfig(blocks, 16, 48, 512, 4096, watermark=0.01)
        scheduler = make_vllm_scheduler(config)
        assert scheduler.max_num_running_reqs == 48
        assert scheduler.max_num_scheduled_tokens == 512
        assert scheduler.max_model_len == 4096 and scheduler.block_size == 16
        assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == blocks - 1
        assert scheduler.kv_cache_manager.watermark_blocks == config.num_watermark_blocks
        assert not scheduler.cache_config.enable_prefix_caching
    cached = make_vllm_scheduler(InstanceConfig(1052, 16, 48, 512, 4096,
                                                enable_prefix_caching=True))
    assert cached.kv_cache_manager.enable_caching
    assert ground_truth_class("vllm") is vg.VllmGroundTruthInstance
    assert ground_truth_class("ours") is GroundTruthInstance
    assert ground_truth_class("vllm-async") is vg.VllmAsyncGroundTruthInstance
    assert isinstance(make_vllm_scheduler(PAPER_QWEN, async_scheduling=True), AsyncScheduler)


@pytest.mark.parametrize("instance_class", ["VllmGroundTruthInstance",
                                            "VllmAsyncGroundTruthInstance"])
def test_every_request_finishes_at_its_true_length_with_consistent_latencies(
        vg: ModuleType, instance_class: str) -> None:
    # A burst on a small KV cache: vLLM preempts (recompute) and still finishes each
    # request with exactly its true number of output tokens. (All arrive at once: `add`
    # runs the steps before an arrival itself, out of this test's sight.)
    config = InstanceConfig(num_total_blocks=300, block_size=16, max_num_seqs=48,
                            max_num_batched_tokens=512, max_model_len=4096)
    rng = random.Random(3)
    instance = getattr(vg, instance_class)("v", config, bundled_model("qwen2-7b-a30"),
                                           noise_sigma=0.1, seed=5)
    requests = []
    for i in range(60):
        prompt = rng.randint(1, 1500)
        request = SimulatedRequest(f"r{i}", 0.0, prompt, rng.randint(1, 600), 100)
        requests.append(request)
        instance.add(request, 0.0)
    sampled: dict[str, int] = {}
    finished: list[str] = []
    while instance.has_work:
        before = instance.now_s
        step = instance.step()
        assert instance.now_s > before
        assert sum(step.output.num_scheduled_tokens.values()) <= config.max_num_batched_tokens
        for request_id in step.sampled_ids:
            sampled[request_id] = sampled.get(request_id, 0) + 1
        finished += step.finished_ids
    assert instance.num_preemptions > 0
    assert sorted(finished) == sorted(r.request_id for r in requests)
    for request in requests:
        # A recomputed request resamples nothing: its tokens are its true length.
        assert sampled[request.request_id] == request.max_output_tokens, request.request_id
        assert request.arrival_s < request.first_token_s <= request.finish_s
        assert (request.first_token_s == request.finish_s) == (request.max_output_tokens == 1)
    assert instance.num_free_blocks == config.num_usable_blocks
    assert not instance.snapshot().requests


def _step_alike(ours: GroundTruthInstance, theirs: VllmGroundTruthInstance,
                where: tuple[int, int]) -> list[str]:
    """One step of each: the same tokens, preemptions, outputs, clock and published snapshot;
    the ids preempted."""
    expected, got = ours.step(), theirs.step()
    assert got.output.num_scheduled_tokens == expected.output.num_scheduled_tokens, where
    assert got.output.stats == expected.output.stats, where
    assert set(got.output.preempted_ids) == set(expected.output.preempted_ids), where
    assert (got.sampled_ids, got.finished_ids) == (expected.sampled_ids,
                                                   expected.finished_ids), where
    assert theirs.now_s == ours.now_s, where
    assert theirs.snapshot() == ours.snapshot(), where
    return list(expected.output.preempted_ids)


def _ended_alike(ours: GroundTruthInstance, theirs: VllmGroundTruthInstance,
                 pairs: list[tuple[SimulatedRequest, SimulatedRequest]]) -> int:
    """Both drained, with the same preemptions and every request's times; the preemptions."""
    assert not theirs.has_work and theirs.num_preemptions == ours.num_preemptions
    for mine, vllm in pairs:
        assert (vllm.first_token_s, vllm.finish_s) == (mine.first_token_s, mine.finish_s)
    return ours.num_preemptions


def test_steps_snapshots_and_times_agree_with_our_scheduler(toy_model: ExecModel,
                                                            vg: ModuleType) -> None:
    num_preemptions = 0
    for case in range(30):
        rng = random.Random(case)
        config = random_config(rng)
        ours = GroundTruthInstance("g", config, toy_model, noise_sigma=0.1, seed=case)
        theirs = vg.VllmGroundTruthInstance("g", config, toy_model, noise_sigma=0.1, seed=case)
        arrivals: dict[int, list[tuple[str, int, int]]] = {}
        for i in range(rng.randint(1, 16)):
            prompt = rng.randint(1, config.max_model_len - 1)
            arrivals.setdefault(rng.randint(0, 30), []).append(
                (f"r{i}", prompt, rng.randint(1, config.max_model_len - prompt)))
        pairs = []
        for step in range(5000):
            for request_id, prompt, output in arrivals.pop(step, []):
                pair = (SimulatedRequest(request_id, 0.0, prompt, output, output // 2 + 1),
                        SimulatedRequest(request_id, 0.0, prompt, output, output // 2 + 1))
                ours.add(pair[0], 0.0)
                theirs.add(pair[1], 0.0)
                pairs.append(pair)
            assert ours.has_work == theirs.has_work, (case, step)
            if not ours.has_work:
                if not arrivals:
                    break
                continue
            _step_alike(ours, theirs, (case, step))
        num_preemptions += _ended_alike(ours, theirs, pairs)
    assert num_preemptions > 50  # the cases exercise recompute preemption


def test_prompt_tokens_collide_exactly_where_prefix_hashes_do(vg: ModuleType) -> None:
    prompt_token_ids = vg.prompt_token_ids
    config = InstanceConfig(257, 16, 8, 128, 1024, enable_prefix_caching=True,
                            prefix_block_size=64)
    a = prompt_token_ids(SimulatedRequest("a", 0.0, 200, 1, 1, (1, 2, 3, 4)), config)
    b = prompt_token_ids(SimulatedRequest("b", 0.0, 200, 1, 1, (1, 2, 9, 4)), config)
    assert len(a) == len(b) == 200
    assert a[:128] == b[:128] and a[128:192] != b[128:192] and a[192:] != b[192:]
    assert prompt_token_ids(SimulatedRequest("c", 0.0, 5, 1, 1, (1,)), config) != a[:5]
    plain = dataclasses.replace(config, enable_prefix_caching=False)
    assert set(prompt_token_ids(SimulatedRequest("a", 0.0, 200, 1, 1, (1,)), plain)) == {1}


@pytest.mark.xfail(strict=False, reason=(
    "cases 0-4 agree step by step; in case 5 the published caches differ from step 30 on "
    "(scheduling still agrees there), not yet diagnosed. A known difference: a request that "
    "computes a unit another request cached meanwhile stops adding its later units to our "
    "cache and frees its copy uncached, while vLLM keeps caching them and keeps both copies"))
def test_prefix_caching_agrees_with_vllms_block_by_block(toy_model: ExecModel,
                                                         vg: ModuleType) -> None:
    # One prefix hash per vLLM block: our prefix cache (reference-counted units, LRU free
    # queue, hits stopping one token short) against vLLM's own, step by step.
    hits = num_preemptions = 0
    for case in range(30):
        rng = random.Random(500 + case)
        config = random_config(rng)
        config = dataclasses.replace(config, enable_prefix_caching=True,
                                     prefix_block_size=config.block_size)
        ours = GroundTruthInstance("g", config, toy_model, noise_sigma=0.1, seed=case)
        theirs = vg.VllmGroundTruthInstance("g", config, toy_model, noise_sigma=0.1, seed=case)
        arrivals: dict[int, list[tuple[str, int, int, tuple[int, ...]]]] = {}
        for i in range(rng.randint(1, 16)):
            prompt = rng.randint(1, config.max_model_len - 1)
            family, split = rng.randrange(3), rng.randrange(1, 300)
            hashes = tuple(family * 1000 + u if u < split else rng.randrange(10**9)
                           for u in range(prompt // config.block_size + 1))
            arrivals.setdefault(rng.randint(0, 30), []).append(
                (f"r{i}", prompt, rng.randint(1, config.max_model_len - prompt), hashes))
        pairs = []
        for step in range(5000):
            for request_id, prompt, output, hashes in arrivals.pop(step, []):
                pair = tuple(SimulatedRequest(request_id, 0.0, prompt, output, output // 2 + 1,
                                              hashes) for _ in range(2))
                ours.add(pair[0], 0.0)
                theirs.add(pair[1], 0.0)
                pairs.append(pair)
            if not ours.has_work:
                assert not theirs.has_work
                if not arrivals:
                    break
                continue
            _step_alike(ours, theirs, (case, step))
        num_preemptions += _ended_alike(ours, theirs, pairs)
        for mine, vllm in pairs:
            assert mine.num_cached_tokens == vllm.num_cached_tokens, (case, mine.request_id)
            hits += bool(mine.num_cached_tokens)
    assert hits > 30 and num_preemptions > 10


def test_priority_scheduling_agrees_with_vllms_step_by_step(toy_model: ExecModel,
                                                            vg: ModuleType) -> None:
    # vLLM's priority policy: waiting requests by (priority, arrival), the running request
    # with the largest (priority, arrival) preempted first, even one scheduled this step.
    # Priorities are predicted-shortest-first's (arrival ms + ms/token x predicted length).
    num_preemptions = num_not_last = 0
    for case in range(60):
        rng = random.Random(100 + case)
        config = dataclasses.replace(random_config(rng), scheduling_policy="priority",
                                     priority_ms_per_token=rng.choice([0.0, 5.0, 50.0]))
        ours = GroundTruthInstance("g", config, toy_model, noise_sigma=0.1, seed=case)
        theirs = vg.VllmGroundTruthInstance("g", config, toy_model, noise_sigma=0.1, seed=case)
        arrivals: dict[int, list[tuple[str, int, int, int]]] = {}
        for i in range(rng.randint(1, 16)):
            prompt = rng.randint(1, config.max_model_len - 1)
            output = rng.randint(1, config.max_model_len - prompt)
            arrivals.setdefault(rng.randint(0, 30), []).append(
                (f"r{i}", prompt, output, rng.randint(1, 1000)))
        pairs = []
        for step in range(5000):
            for request_id, prompt, output, predicted in arrivals.pop(step, []):
                arrival_s = step * 0.01 + len(pairs) * 0.0003  # distinct, some ms ties
                pair = (SimulatedRequest(request_id, arrival_s, prompt, output, predicted),
                        SimulatedRequest(request_id, arrival_s, prompt, output, predicted))
                ours.add(pair[0], 0.0)
                theirs.add(pair[1], 0.0)
                pairs.append(pair)
            if not ours.has_work:
                assert not theirs.has_work
                if not arrivals:
                    break
                continue
            last_running = ours.scheduler.running[-1:]
            preempted = _step_alike(ours, theirs, (case, step))
            num_not_last += any(last_running and r != last_running[0].request_id
                                for r in preempted)
        num_preemptions += _ended_alike(ours, theirs, pairs)
    assert num_preemptions > 50
    assert num_not_last > 5, num_not_last  # FCFS would have preempted the last running request


def test_a_routed_cluster_run_is_the_same_on_either_ground_truth(vg: ModuleType) -> None:
    rng = random.Random(7)
    n = 300
    workload = Workload("toy", tuple(poisson_unit_arrivals(n, 7)),
                        tuple(rng.randint(1, 1200) for _ in range(n)),
                        tuple(rng.randint(1, 400) for _ in range(n)))
    config = InstanceConfig(num_total_blocks=600, block_size=16, max_num_seqs=48,
                            max_num_batched_tokens=512, max_model_len=4096)
    results = {}
    for ground_truth in ("ours", "vllm"):
        setup = ClusterSetup(3, config, bundled_model("qwen2-7b-a30"),
                             ground_truth=ground_truth)
        results[ground_truth] = simulate(workload, 6.0, setup, "least_requests",
                                         OraclePredictor(), seed=1, keep_samples=True)
    ours, vllm = results["ours"], results["vllm"]
    assert vllm.num_preemptions == ours.num_preemptions > 0
    assert vllm.ttft_s == ours.ttft_s and vllm.e2e_s == ours.e2e_s
    with pytest.raises(ValueError, match="ground_truth"):
        ClusterSetup(3, config, bundled_model("qwen2-7b-a30"), ground_truth="other")


def test_async_scheduling_admits_an_arrival_one_step_later(toy_model: ExecModel,
                                                           vg: ModuleType) -> None:
    # With async scheduling the step after the running one is chosen when the running one
    # starts: a request arriving mid-step misses the next step and joins the one after.
    # A request alone runs the same steps at the same times either way.
    timelines = {}
    for name, instance_class in (("sync", vg.VllmGroundTruthInstance),
                                 ("async", vg.VllmAsyncGroundTruthInstance)):
        instance = instance_class("v", PAPER_QWEN, toy_model)
        first = SimulatedRequest("a", 0.0, 40, 20, 20)
        instance.add(first, 0.0)
        instance.run_until(1e-9)
        ends = [instance.now_s] if instance.num_steps else []  # sync: the prefill ran
        step_s = toy_model.step_ms(BatchStats.of_chunk(40, 0, 40)) / 1000.0
        second = SimulatedRequest("b", step_s / 2, 40, 1, 1)
        instance.add(second, second.arrival_s)
        while instance.has_work:
            instance.step()
            ends.append(instance.now_s)
        timelines[name] = (first.first_token_s, second.first_token_s,
                           ends.index(second.first_token_s), instance.num_steps)
    sync, asynchronous = timelines["sync"], timelines["async"]
    assert sync[0] == asynchronous[0] == pytest.approx(step_s)  # one prefill step
    assert (sync[2], asynchronous[2]) == (1, 2)  # the second step, or the third
    assert asynchronous[1] > sync[1]
    assert sync[3] == asynchronous[3] == 20  # no extra step past a request's last token

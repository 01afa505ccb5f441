"""Prefix caching in the cluster simulation: shared prefixes served from the instances' caches,
published caches, the Mooncake loader, and routers that see (or not) the cache."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

from workers.cluster_sim import (
    ClusterSetup,
    GroundTruthInstance,
    OraclePredictor,
    SimulatedRequest,
    Workload,
    load_mooncake_trace,
    multi_turn_workload,
    poisson_unit_arrivals,
    shared_prompt_workload,
    simulate,
)
from workers.sim import ExecModel, InstanceConfig, prepare
from workers.sim.block_pool import chain_prefix_hashes

CONFIG = InstanceConfig(num_total_blocks=257, block_size=16, max_num_seqs=8,
                        max_num_batched_tokens=128, max_model_len=1024,
                        enable_prefix_caching=True, prefix_block_size=64)


def _run(instance: GroundTruthInstance, *requests: SimulatedRequest) -> None:
    for request in requests:
        instance.add(request, instance.now_s)
        instance.run_to_end()


def test_a_repeated_prefix_is_served_from_the_cache(toy_model: ExecModel) -> None:
    instance = GroundTruthInstance("g", CONFIG, toy_model)
    first = SimulatedRequest("a", 0.0, 300, 5, 5, (1, 2, 3, 4))
    second = SimulatedRequest("b", 0.0, 300, 5, 5, (1, 2, 3, 9))
    _run(instance, first, second)
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 192  # three 64-token units in common
    cached = instance.snapshot().cached_prefixes
    assert set(chain_prefix_hashes((1, 2, 3, 4))) <= cached
    assert chain_prefix_hashes((1, 2, 3, 9))[3] in cached
    # Without hashes the same requests share nothing.
    plain = GroundTruthInstance("p", CONFIG, toy_model)
    again = SimulatedRequest("b", 0.0, 300, 5, 5)
    _run(plain, SimulatedRequest("a", 0.0, 300, 5, 5), again)
    assert again.num_cached_tokens == 0 and not plain.snapshot().cached_prefixes
    assert second.first_token_s - second.arrival_s < again.first_token_s - again.arrival_s


def test_a_waiting_request_is_published_with_the_prefix_the_cache_holds(
        toy_model: ExecModel) -> None:
    config = dataclasses.replace(CONFIG, max_num_seqs=1)
    instance = GroundTruthInstance("g", config, toy_model)
    _run(instance, SimulatedRequest("a", 0.0, 200, 2, 2, (1, 2, 3)))
    instance.add(SimulatedRequest("b", 0.0, 100, 50, 50), instance.now_s)
    instance.add(SimulatedRequest("c", 0.0, 200, 2, 2, (1, 2, 7)), instance.now_s)
    instance.step()
    waiting = {r.request_id: r for r in instance.snapshot().requests if not r.is_running}
    assert waiting["c"].num_cached_tokens == 128 and not waiting["c"].prefix_hashes


def _shared_workload(n: int, seed: int = 0) -> Workload:
    """Prompts of 8 conversations; each turn extends its conversation's previous prompt."""
    rng = random.Random(seed)
    turns = [0] * 8
    prompts, outputs, hashes = [], [], []
    for _ in range(n):
        chat = rng.randrange(8)
        turns[chat] += 1
        units = min(2 + 2 * turns[chat], 14)
        prompts.append(units * 64 + rng.randrange(64))
        outputs.append(rng.randint(4, 40))
        hashes.append(tuple(chat * 100 + u for u in range(units + 1)))
    return Workload("shared", poisson_unit_arrivals(n, seed), tuple(prompts), tuple(outputs),
                    prefix_hashes=tuple(hashes), prefix_block_size=64)


def test_a_router_that_sees_the_cache_gets_more_hits(toy_model: ExecModel) -> None:
    workload = _shared_workload(240)
    setup = ClusterSetup(4, CONFIG, toy_model, exec_noise_sigma=0.0)
    seen = simulate(workload, 6.0, setup, "block", OraclePredictor())
    blind = simulate(workload, 6.0, setup, "block", OraclePredictor(),
                     router_sees_prefixes=False)
    affinity = simulate(workload, 6.0, setup, "prefix_affinity", OraclePredictor())
    assert not (seen.aborted or blind.aborted or affinity.aborted)
    assert 0.0 < blind.prefix_hit_rate < seen.prefix_hit_rate
    assert affinity.prefix_hit_rate > blind.prefix_hit_rate
    assert seen.ttft_p50_s < blind.ttft_p50_s


def test_the_mooncake_loader_keeps_arrivals_lengths_and_hashes(tmp_path: Path) -> None:
    rows = [{"timestamp": 0, "input_length": 700, "output_length": 9, "hash_ids": [0, 1]},
            {"timestamp": 3000, "input_length": 5000, "output_length": 9, "hash_ids": [0]},
            {"timestamp": 1000, "input_length": 900, "output_length": 2000, "hash_ids": [0, 1, 2]}]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    workload = load_mooncake_trace(path, max_model_len=2048)
    assert workload.num_prompt_tokens == (700, 900)  # the 5000-token prompt does not fit
    assert workload.num_output_tokens == (9, 2048 - 900)
    assert workload.prefix_hashes == ((0, 1), (0, 1, 2)) and workload.prefix_block_size == 512
    assert workload.unit_arrival_s == (0.0, 1.0)
    assert workload.head(1).prefix_hashes == ((0, 1),)


def _base(n: int) -> Workload:
    rng = random.Random(n)
    return Workload("base", poisson_unit_arrivals(n, 1),
                    tuple(rng.randint(10, 600) for _ in range(n)),
                    tuple(rng.randint(1, 300) for _ in range(n)))


def test_system_prompt_requests_share_exactly_their_system_prompt() -> None:
    base = _base(300)
    workload = shared_prompt_workload(base, num_prompts=4, prompt_tokens=512, block_tokens=128,
                                      max_model_len=1024)
    assert workload.unit_arrival_s == base.unit_arrival_s
    by_prompt: dict[tuple[int, ...], int] = {}
    for prompt, hashes, own in zip(workload.num_prompt_tokens, workload.prefix_hashes,
                                   base.num_prompt_tokens, strict=True):
        assert prompt == min(512 + own, 1023) and len(hashes) == -(-prompt // 128)
        by_prompt[hashes[:4]] = by_prompt.get(hashes[:4], 0) + 1
    assert len(by_prompt) == 4 and max(by_prompt.values()) > 300 / 4  # Zipf: one is popular
    others = [h[4:] for h in workload.prefix_hashes]
    assert len({u for h in others for u in h}) == sum(len(h) for h in others)  # all own


def test_a_chat_turn_extends_the_previous_turns_prompt_and_answer() -> None:
    workload = multi_turn_workload(_base(400), mean_turns=4.0, mean_gap_requests=20.0,
                                   block_tokens=64, max_model_len=4096)
    assert len(workload) > 300
    assert list(workload.unit_arrival_s) == sorted(workload.unit_arrival_s)
    chats: dict[int, list[tuple[int, int, tuple[int, ...]]]] = {}
    for prompt, output, hashes in zip(workload.num_prompt_tokens, workload.num_output_tokens,
                                      workload.prefix_hashes, strict=True):
        chats.setdefault(hashes[0], []).append((prompt, output, hashes))
    assert 40 < len(chats) < len(workload)
    for turns in chats.values():
        for (prompt, output, hashes), (later, _, later_hashes) in zip(turns, turns[1:],
                                                                      strict=False):
            assert later > prompt + output  # the previous prompt, its answer, a new message
            assert later_hashes[:len(hashes)] == hashes


def test_snapshots_count_shared_units_once(toy_model: ExecModel) -> None:
    """Running requests sharing units publish them as cached: the snapshot's blocks add up."""
    config = dataclasses.replace(CONFIG, num_total_blocks=100)
    instance = GroundTruthInstance("g", config, toy_model)
    for i in range(8):  # one whole prompt of shared units, held by every request
        instance.add(SimulatedRequest(f"r{i}", 0.0, 384, 200, 200, (1, 2, 3, 4, 5, 6)), 0.0)
    while instance.has_work:
        instance.step()
        snapshot = instance.snapshot()
        prepared = prepare(snapshot)  # raises if the running requests hold too many blocks
        held = sum(s.num_owned_blocks for s in prepared.running)
        assert held + snapshot.num_free_blocks <= config.num_usable_blocks

"""The published engine state: its JSON form and its conversion to the simulator's snapshot."""

from __future__ import annotations

import dataclasses
import json

import pytest

from workers.sim import ExecModel, SimRequest, predict_what_if
from workers.sim.engine_state import (
    Declared,
    EngineState,
    RequestState,
    pack_prefix_keys,
    unpack_prefix_keys,
)

#: As an engine publishes it: the Block paper's A30 / Qwen2-7B instance, one request running
#: (vLLM's KV estimate may count every token), one waiting, one not tokenized yet.
PUBLISHED = {
    "engine_kind": "emulated", "model": "qwen2-7b", "num_running": 1, "num_waiting": 2,
    "num_total_blocks": 7288, "num_free_blocks": 7000, "block_size": 16, "max_num_seqs": 48,
    "max_num_batched_tokens": 512, "max_model_len": 4096,
    "requests": [
        {"request_id": "a", "num_prompt_tokens": 300, "num_computed_tokens": 310,
         "num_output_tokens": 11, "predicted_output_tokens": 200, "is_running": True,
         "priority": 0},
        {"request_id": "b", "num_prompt_tokens": 50, "num_computed_tokens": 0,
         "num_output_tokens": 0, "predicted_output_tokens": None, "is_running": False,
         "priority": 0},
        {"request_id": "fresh", "num_prompt_tokens": 0, "num_computed_tokens": 0,
         "num_output_tokens": 0, "predicted_output_tokens": 40, "is_running": False,
         "priority": 0},
    ],
    "taken_at": 1700000000.5, "instance_id": "gpu.0", "accepting": False,
    "published_at": 1700000000.75, "scheduling_policy": "fcfs", "priority_ms_per_token": 2.0,
    "prefix_unit_tokens": 0, "cached_prefixes": "", "num_interactive_seats": 0,
    "batch_prefill_last": False, "model_path": "/models/qwen2-7b", "hardware": "emulated",
    "exec_model": "qwen2-7b-a30",
    "capacity_rps": None,
}


def test_the_json_form_round_trips_key_for_key() -> None:
    state = EngineState.from_json(PUBLISHED)
    assert state.requests[0] == RequestState("a", 300, 310, 11, 200, True)
    assert (state.instance_id, state.accepting, state.published_at) == ("gpu.0", False,
                                                                        1700000000.75)
    assert json.dumps(state.to_json()) == json.dumps(PUBLISHED)  # same keys, same order


def test_an_engine_snapshot_is_published_with_its_instance() -> None:
    snapshot = dataclasses.replace(EngineState.from_json(PUBLISHED), instance_id=None,
                                   accepting=True, published_at=None)
    published = snapshot.published("gpu.3", "served-model", accepting=False)
    assert (published.instance_id, published.model, published.accepting) == (
        "gpu.3", "served-model", False)
    assert published.requests == snapshot.requests and snapshot.instance_id is None


def test_an_instance_declares_its_model_path_and_hardware_with_every_state() -> None:
    declared = Declared("tiny-qwen", "/models/tiny-qwen", "emulated", "llama-2-7b-a100", 8.99)
    published = EngineState.from_json(PUBLISHED).published("gpu.1", declared, accepting=True)
    read_back = EngineState.from_json(json.loads(json.dumps(published.to_json())))
    assert read_back.declared == declared and read_back.model == "tiny-qwen"
    older = {k: v for k, v in PUBLISHED.items()
             if k not in ("model_path", "hardware", "exec_model", "capacity_rps")}
    assert EngineState.from_json(older).declared == Declared("qwen2-7b")


def test_states_published_before_the_host_set_them_read_as_accepting() -> None:
    older = {k: v for k, v in PUBLISHED.items()
             if k not in ("instance_id", "accepting", "published_at")}
    state = EngineState.from_json(older)
    assert state.accepting and state.instance_id is None and state.published_at is None


def test_states_without_a_scheduling_policy_read_as_fcfs_and_priorities_reach_the_simulator(
) -> None:
    older = {k: v for k, v in PUBLISHED.items()
             if k not in ("scheduling_policy", "priority_ms_per_token")}
    older["requests"] = [{k: v for k, v in r.items() if k != "priority"}
                         for r in PUBLISHED["requests"]]
    state = EngineState.from_json(older)
    assert state.to_instance_snapshot().config.scheduling_policy == "fcfs"
    assert all(r.priority == 0 for r in state.requests)
    newer = dict(PUBLISHED, scheduling_policy="priority", priority_ms_per_token=5.0)
    newer["requests"] = [dict(r, priority=100 + i) for i, r in enumerate(PUBLISHED["requests"])]
    snapshot = EngineState.from_json(newer).to_instance_snapshot()
    assert (snapshot.config.scheduling_policy, snapshot.config.priority_ms_per_token) == (
        "priority", 5.0)
    assert [r.priority for r in snapshot.requests] == [100, 101]  # "fresh" is left out


def test_the_simulator_counts_the_null_block_and_skips_untokenized_requests(
    toy_model: ExecModel,
) -> None:
    state = EngineState.from_json(PUBLISHED)
    snapshot = state.to_instance_snapshot(enable_prefix_caching=True)
    config = snapshot.config
    assert (config.num_total_blocks, config.num_usable_blocks) == (7289, 7288)
    assert config.enable_prefix_caching and config.watermark == 0.0
    assert snapshot.num_free_blocks == 7000
    assert [r.request_id for r in snapshot.running] == ["a"]
    assert [r.request_id for r in snapshot.waiting] == ["b"]
    assert snapshot.waiting[0].predicted_output_tokens is None
    assert snapshot.running[0] == SimRequest("a", 300, 310, 11, 200, True)
    result = predict_what_if(snapshot, SimRequest("new", 20, predicted_output_tokens=5),
                             toy_model)
    assert 0 < result.ttft_s < result.e2e_s


def test_a_state_missing_a_field_is_refused() -> None:
    with pytest.raises(KeyError, match="num_free_blocks"):
        EngineState.from_json({k: v for k, v in PUBLISHED.items() if k != "num_free_blocks"})


def test_prefix_caching_state_round_trips_and_reaches_the_simulator() -> None:
    keys = (2**63 - 1, -(2**63), 0, 12345)
    assert unpack_prefix_keys(pack_prefix_keys(keys)) == keys
    assert len(pack_prefix_keys(range(300))) == 4 * 300 * 8 // 3  # 32 characters per 3 keys
    data = dict(PUBLISHED, prefix_unit_tokens=64, cached_prefixes=pack_prefix_keys(keys))
    data["requests"] = [dict(PUBLISHED["requests"][0], num_cached_tokens=128),
                        *PUBLISHED["requests"][1:]]
    state = EngineState.from_json(data)
    assert state.cached_prefixes == keys and state.requests[0].num_cached_tokens == 128
    assert json.dumps(state.to_json()) == json.dumps(data)
    snapshot = state.to_instance_snapshot()
    assert snapshot.config.enable_prefix_caching and snapshot.config.prefix_block_size == 64
    assert snapshot.cached_prefixes == frozenset(keys)
    assert snapshot.running[0].num_cached_tokens == 128
    # The caller may still turn the cache off (the simulator then ignores it).
    off = state.to_instance_snapshot(enable_prefix_caching=False)
    assert not off.config.enable_prefix_caching and off.cached_prefixes == frozenset()
    # States from engines that publish no prefix information read as prefix caching off.
    older = {k: v for k, v in PUBLISHED.items()
             if k not in ("prefix_unit_tokens", "cached_prefixes")}
    assert not EngineState.from_json(older).to_instance_snapshot().config.enable_prefix_caching

"""The cluster's ground truth: the scheduler model in simulated time, outcomes, snapshots."""

from __future__ import annotations

import random

import pytest

from tests.workers.cluster_sim.instance_configs import random_config
from workers.cluster_sim import GroundTruthInstance, SimulatedRequest
from workers.sim import ExecModel, Scheduler, SeqState


def test_each_step_is_the_scheduler_models_step_priced_by_the_exec_model(
        toy_model: ExecModel) -> None:
    num_preemptions = 0
    for case in range(40):
        rng = random.Random(case)
        config = random_config(rng)
        reference, instance = Scheduler(config), GroundTruthInstance("g", config, toy_model)
        arrivals: dict[int, list[tuple[str, int, int]]] = {}
        for i in range(rng.randint(1, 16)):
            prompt = rng.randint(1, config.max_model_len - 1)
            arrivals.setdefault(rng.randint(0, 30), []).append(
                (f"r{i}", prompt, rng.randint(1, config.max_model_len - prompt)))
        requests: dict[str, SimulatedRequest] = {}
        first_token_s: dict[str, float] = {}
        finish_s: dict[str, float] = {}
        now_s = 0.0
        for step in range(5000):
            for request_id, prompt, output in arrivals.pop(step, []):
                reference.add_request(SeqState(request_id, prompt, output))
                requests[request_id] = SimulatedRequest(request_id, 0.0, prompt, output, output)
                instance.add(requests[request_id], 0.0)
            if not reference.has_unfinished_requests:
                if not arrivals:
                    break
                continue
            expected = reference.step()
            now_s += toy_model.step_ms(expected.output.stats) / 1000.0
            for request_id in expected.sampled_ids:
                first_token_s.setdefault(request_id, now_s)
            finish_s.update(dict.fromkeys(expected.finished_ids, now_s))
            got = instance.step()
            assert got.output.num_scheduled_tokens == expected.output.num_scheduled_tokens, (
                case, step)
            assert instance.now_s == now_s
        assert not instance.has_work and instance.num_free_blocks == config.num_usable_blocks
        assert instance.num_preemptions == reference.num_preemptions
        assert {r: q.first_token_s for r, q in requests.items()} == first_token_s
        assert {r: q.finish_s for r, q in requests.items()} == finish_s
        num_preemptions += reference.num_preemptions
    assert num_preemptions > 20  # the cases do exercise preemption


def test_ground_truth_records_first_token_and_finish_times(toy_model, small_config) -> None:  # type: ignore[no-untyped-def]
    instance = GroundTruthInstance("g", small_config, toy_model)
    request = SimulatedRequest("r", 1.0, 100, 3, 3)
    instance.add(request, 1.0)
    instance.run_to_end()
    assert instance.num_steps == 3  # one prefill (it fits the 128-token budget), two decodes
    assert 1.0 < request.first_token_s < request.finish_s == instance.now_s
    assert request.instance_id == "g"
    assert instance.num_free_blocks == small_config.num_usable_blocks


def test_snapshot_shows_predicted_lengths_not_true_ones(toy_model, small_config) -> None:  # type: ignore[no-untyped-def]
    instance = GroundTruthInstance("g", small_config, toy_model)
    instance.add(SimulatedRequest("r", 0.0, 40, 30, 12), 0.0)
    instance.add(SimulatedRequest("s", 0.0, 500, 5, 7), 0.0)
    instance.step()
    snapshot = instance.snapshot()
    running, waiting = snapshot.running, snapshot.waiting
    assert [r.request_id for r in running] == ["r", "s"] and not waiting
    assert running[0].predicted_output_tokens == 12
    assert (running[0].num_output_tokens, running[0].num_computed_tokens) == (1, 40)
    assert running[1].num_computed_tokens == 88  # 128-token budget minus r's 40
    assert snapshot.num_free_blocks == small_config.num_usable_blocks - 3 - 6


def test_step_noise_is_seeded_and_averages_to_one(toy_model, small_config) -> None:  # type: ignore[no-untyped-def]
    def run(seed: int, sigma: float) -> float:
        instance = GroundTruthInstance("g", small_config, toy_model, sigma, seed)
        instance.add(SimulatedRequest("r", 0.0, 10, 400, 400), 0.0)
        instance.run_to_end()
        return instance.now_s

    exact = run(0, 0.0)
    assert run(1, 0.2) == run(1, 0.2) != run(2, 0.2)
    assert run(1, 0.2) == pytest.approx(exact, rel=0.05)

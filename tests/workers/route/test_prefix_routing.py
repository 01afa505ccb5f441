"""Prefix-cache-aware routing: the prefix_affinity baseline, and what-ifs crediting the prefix
an instance's cache holds for the request being routed."""

from __future__ import annotations

import random

from workers.route.policies import (
    FleetLedger,
    InstanceView,
    RequestView,
    RoutingContext,
    credit_prefix,
    decide,
    prepare_published,
)
from workers.sim import ExecModel, InstanceConfig, InstanceSnapshot, SimRequest
from workers.sim.block_pool import chain_prefix_hashes

REQUEST = RequestView("req_1", num_prompt_tokens=1000, predicted_output_tokens=20,
                      max_tokens=64)
CONFIG = InstanceConfig(num_total_blocks=201, block_size=16, max_num_seqs=8,
                        max_num_batched_tokens=256, max_model_len=2048,
                        enable_prefix_caching=True, prefix_block_size=64)


def _inst(instance_id: str, match: int = 0, running: int = 0, waiting: int = 0,
          assigned: int = 0, free: int = 100) -> InstanceView:
    return InstanceView(instance_id, running, waiting, assigned, num_free_blocks=free,
                        num_total_blocks=100, prefix_match_tokens=match)


def _pick(*fleet: InstanceView) -> str:
    return decide("prefix_affinity", REQUEST, fleet, RoutingContext(0, random.Random(0))
                  ).instance_id


# -- the baseline ---------------------------------------------------------------------------

def test_prefix_affinity_takes_the_longest_match_even_when_busier() -> None:
    assert _pick(_inst("a", match=128, running=6), _inst("b", match=512, running=7),
                 _inst("c", running=0)) == "b"


def test_prefix_affinity_breaks_match_ties_by_load() -> None:
    assert _pick(_inst("a", match=512, running=4), _inst("b", match=512, running=2)) == "b"


def test_a_saturated_instance_loses_its_match() -> None:
    queued = _inst("a", match=512, running=3, waiting=4, assigned=2)  # 6 queued > 5
    full = _inst("b", match=512, free=10)  # 90 % of its KV in use > 80 %
    assert _pick(queued, full, _inst("c", match=64, running=5), _inst("d", running=1)) == "c"


def test_without_any_usable_match_prefix_affinity_is_least_requests() -> None:
    assert _pick(_inst("a", running=3), _inst("b", running=1, assigned=1),
                 _inst("c", match=512, waiting=6)) == "b"


# -- what-if crediting --------------------------------------------------------------------------

def _snapshot(cached: tuple[int, ...] = ()) -> InstanceSnapshot:
    return InstanceSnapshot(CONFIG, CONFIG.num_usable_blocks, (),
                            frozenset(chain_prefix_hashes(cached)))


def test_credit_prefix_counts_the_leading_units_cached_or_routed_before() -> None:
    new = SimRequest("n", 300, predicted_output_tokens=5, prefix_hashes=(1, 2, 3, 4, 5))
    assert credit_prefix(new, _snapshot((1, 2))).num_cached_tokens == 128
    assert credit_prefix(new, _snapshot((1, 9, 3))).num_cached_tokens == 64  # chained
    routed = SimRequest("r", 200, predicted_output_tokens=5, prefix_hashes=(1, 2, 3))
    credited = credit_prefix(new, _snapshot((1,)), [routed])
    assert credited.num_cached_tokens == 192 and credited.prefix_hashes == ()
    # Without prefix caching the hashes mean nothing.
    plain = InstanceSnapshot(InstanceConfig(201, 16, 8, 256, 2048), 200)
    assert credit_prefix(new, plain).num_cached_tokens == 0
    # The routed requests are credited too, each with what was cached before it.
    prepared = prepare_published(_snapshot((1,)), [routed, new])
    assert [s.num_cached_tokens for s in prepared.waiting] == [64, 192]


def test_the_ledger_credits_each_instance_its_own_match(toy_model: ExecModel) -> None:
    ledger = FleetLedger()
    ledger.publish("gpu.0", _snapshot(), 0.0)
    ledger.publish("gpu.1", _snapshot((7, 8, 9, 10)), 0.0)
    new = SimRequest("n", 600, predicted_output_tokens=10, prefix_hashes=(7, 8, 9, 10, 11))
    views = {v.instance_id: v for v in ledger.views(new, toy_model)}
    assert views["gpu.0"].prefix_match_tokens == 0
    assert views["gpu.1"].prefix_match_tokens == 256
    assert views["gpu.1"].what_if_ttft_s < views["gpu.0"].what_if_ttft_s
    assert decide("block", REQUEST, list(views.values()),
                  RoutingContext(0, random.Random(0))).instance_id == "gpu.1"
    # A request routed to gpu.0 since its snapshot will have cached the prefix there.
    ledger.assign("gpu.0", SimRequest("r", 600, predicted_output_tokens=1,
                                      prefix_hashes=(7, 8, 9, 10, 11, 12)), 0.01)
    views = {v.instance_id: v for v in ledger.views(new, toy_model)}
    assert views["gpu.0"].prefix_match_tokens == 320
    blind = ledger.views(SimRequest("n", 600, predicted_output_tokens=10), toy_model)
    assert all(v.prefix_match_tokens == 0 for v in blind)

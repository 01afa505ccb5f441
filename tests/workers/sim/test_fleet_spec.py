"""The fleet JSON (`BLOCKQ_FLEET`, `bench_cluster --fleet`): counts expanded, bad entries named."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.sim.fleet_declaration import (
    FleetError,
    InstanceSpec,
    fleet_slots,
    parse_fleet,
    parse_fleet_entries,
)


def test_counts_expand_in_declaration_order_with_defaults() -> None:
    fleet = parse_fleet('[{"model": "a", "count": 2, "engine": "emulated", '
                        '"exec_model": "llama-2-7b-a30"}, {"model": "b", "model_path": "/m/b"}]')
    assert [(s.model, s.count, s.engine) for s in fleet] == [
        ("a", 1, "emulated"), ("a", 1, "emulated"), ("b", 1, None)]
    assert fleet[2] == InstanceSpec(model="b", model_path=Path("/m/b"))
    assert fleet[0].exec_model == "llama-2-7b-a30" and fleet[2].exec_model is None


@pytest.mark.parametrize(("text", "names"), [
    ("not json", "not valid JSON"),
    ("[]", "non-empty JSON list"),
    ('{"model": "a"}', "non-empty JSON list"),
    ('[{"model": "a"}, 3]', "fleet entry 1: expected an object"),
    ('[{"count": 2}]', "fleet entry 0: model:"),
    ('[{"model": "a"}, {"model": "b", "count": 0}]', "fleet entry 1: count:"),
    ('[{"model": "a", "engine": "tpu"}]', "fleet entry 0: engine:"),
    ('[{"model": "a", "exec_model": "gpt-9-z80"}]', "fleet entry 0: exec_model: unknown"),
    ('[{"model": "a", "gpus": 2}]', "fleet entry 0: gpus:"),
])
def test_a_bad_fleet_names_its_entry_and_field(text: str, names: str) -> None:
    with pytest.raises(FleetError, match=names.replace("(", r"\(")):
        parse_fleet(text)


def test_autoscaled_entries_keep_a_slot_per_max_count_and_start_with_count() -> None:
    entries = parse_fleet_entries(
        '[{"model": "a", "count": 1, "min_count": 0, "max_count": 3, "start_s": 20},'
        ' {"model": "b", "count": 0, "max_count": 2, "gpu_kind": "h100-80gb"},'
        ' {"model": "c"}]')
    slots = fleet_slots(entries)
    assert [(s.instance_id, s.entry_index, s.starts_running) for s in slots] == [
        ("gpu.0", 0, True), ("gpu.1", 0, False), ("gpu.2", 0, False),
        ("gpu.3", 1, False), ("gpu.4", 1, False), ("gpu.5", 2, True)]
    assert all(slot.spec.count == 1 for slot in slots)
    assert slots[3].spec.gpu_kind == "h100-80gb" and slots[0].spec.start_s == 20
    assert (entries[0].lowest_count, entries[0].highest_count) == (0, 3)
    assert (entries[2].lowest_count, entries[2].highest_count) == (1, 1)
    # parse_fleet: what runs at start (a fixed fleet reads the same as before).
    assert [s.model for s in parse_fleet(
        '[{"model": "a", "count": 1, "min_count": 0, "max_count": 3}, {"model": "c"}]')] == [
        "a", "c"]


@pytest.mark.parametrize(("entry", "names"), [
    ('{"model": "a", "min_count": 3, "max_count": 2}', "min_count (3) is above max_count (2)"),
    ('{"model": "a", "count": 3, "max_count": 2}', "count (3) must lie within"),
    ('{"model": "a", "count": 1, "min_count": 2, "max_count": 4}', "count (1) must lie within"),
    ('{"model": "a", "count": -1, "max_count": 2}', "count: Input should be greater"),
    ('{"model": "a", "count": 0, "max_count": 0}', "would never serve"),
    ('{"model": "a", "start_s": -1}', "start_s: Input should be greater"),
])
def test_bounds_that_cannot_hold_name_their_entry(entry: str, names: str) -> None:
    pattern = names.replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(FleetError, match=rf"fleet entry 1: .*{pattern}"):
        parse_fleet_entries(f'[{{"model": "z"}}, {entry}]')

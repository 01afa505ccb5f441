"""The fleet JSON (`BLOCKQ_FLEET`, `bench_cluster --fleet`): counts expanded, bad entries named."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.sim.fleet_spec import FleetError, InstanceSpec, parse_fleet


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

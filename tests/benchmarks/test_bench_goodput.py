"""bench_goodput's configuration labels."""

from __future__ import annotations

from benchmarks.goodput import parse_config, refusing


def test_configuration_labels_name_the_policy_targets_and_refusal_margin() -> None:
    assert parse_config("llumnix") == ("llumnix", False, None)
    assert parse_config("block+targets") == ("block", True, None)
    assert parse_config(refusing(0.0)) == ("block", True, 0.0)
    assert refusing(0.25) == "block+targets+refuse>0.25"
    assert parse_config(refusing(0.25)) == ("block", True, 0.25)

"""Settings that cannot work are refused, and the CLI names what is wrong instead of a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from app.cli import main
from app.cli.stack import process_commands
from domain.settings import Settings, describe_invalid


def test_the_defaults_leave_interactive_requests_an_engine_thread_beside_a_full_batch() -> None:
    settings = Settings()
    assert settings.engine_concurrency >= settings.max_batch_in_flight + settings.max_num_seqs


@pytest.mark.parametrize(("concurrency", "in_flight", "seqs", "valid"), [
    (304, 256, 48, True), (303, 256, 48, False), (96, 8, 48, True), (96, 64, 48, False)])
def test_an_engine_pool_narrower_than_the_batch_plus_a_batch_of_seats_is_refused(
        concurrency: int, in_flight: int, seqs: int, valid: bool) -> None:
    values = {"engine_concurrency": concurrency, "max_batch_in_flight": in_flight,
              "max_num_seqs": seqs}
    if valid:
        assert Settings(**values).engine_concurrency == concurrency
        return
    with pytest.raises(ValidationError) as refused:
        Settings(**values)
    message = describe_invalid(refused.value)
    assert f"BLOCKQ_ENGINE_CONCURRENCY ({concurrency})" in message
    assert f"({in_flight + seqs})" in message


def test_the_cli_names_the_variable_of_an_invalid_setting(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path) -> None:
    monkeypatch.setenv("BLOCKQ_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("BLOCKQ_MAX_NUM_SEQS", "0")
    result = CliRunner().invoke(main, ["migrate"])
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "BLOCKQ_MAX_NUM_SEQS: Input should be greater than 0 (got '0')" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "blockq.sqlite3").exists()  # nothing ran


def test_the_cli_explains_a_pool_too_narrow_for_the_batch(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path) -> None:
    monkeypatch.setenv("BLOCKQ_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("BLOCKQ_ENGINE_CONCURRENCY", "100")
    result = CliRunner().invoke(main, ["teams", "list"])
    assert result.exit_code == 1
    assert "BLOCKQ_ENGINE_CONCURRENCY (100) must be at least" in result.output
    assert "BLOCKQ_MAX_BATCH_IN_FLIGHT + BLOCKQ_MAX_NUM_SEQS (304)" in result.output


@pytest.mark.parametrize(("field_name", "variable"), [
    ("metrics_token", "BLOCKQ_METRICS_TOKEN"), ("redis_url", "REDIS_URL"),
    ("database_url", "DATABASE_URL")])
def test_an_invalid_secret_or_url_is_named_but_never_shown(field_name: str,
                                                           variable: str) -> None:
    # A list where a string belongs: invalid, and the error's input carries the secret.
    secret = ["redis://:hunter2-password@127.0.0.1:6379/0"]
    with pytest.raises(ValidationError) as refused:
        Settings(**{field_name: secret, "max_num_seqs": 0})
    message = describe_invalid(refused.value)
    assert f"{variable}: " in message
    assert "BLOCKQ_MAX_NUM_SEQS: Input should be greater than 0 (got 0)" in message
    assert "hunter2" not in message


@pytest.mark.parametrize("address", ["0.0.0.0", "10.0.0.5", "::", "flower.example.com"])
def test_flower_binds_to_the_loopback_only(address: str) -> None:
    """Flower's /metrics and /healthcheck answer without its basic auth."""
    with pytest.raises(ValidationError, match="not a loopback address"):
        Settings(flower_host=address)


def test_flower_stays_on_the_loopback_when_the_api_binds_beyond_it() -> None:
    settings = Settings(api_host="0.0.0.0", flower_host="::1")
    assert "--address=::1" in process_commands(settings)["flower"]
    assert Settings(flower_host="localhost").flower_host == "localhost"


def test_a_pool_of_unlike_instances_routes_with_the_mixed_fleet_policy_unless_one_is_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BLOCKQ_ROUTING_POLICY", raising=False)
    default = Settings()
    assert default.routing_policy_for(mixed_hardware=False) == default.routing_policy
    assert default.routing_policy_for(mixed_hardware=True) == "block_slo"
    monkeypatch.setenv("BLOCKQ_ROUTING_POLICY", "llumnix")
    chosen = Settings()
    assert chosen.routing_policy_for(mixed_hardware=True) == "llumnix"
    assert chosen.routing_policy_for(mixed_hardware=False) == "llumnix"
    monkeypatch.delenv("BLOCKQ_ROUTING_POLICY")
    assert Settings(mixed_fleet_routing_policy="capacity_weighted").routing_policy_for(
        mixed_hardware=True) == "capacity_weighted"


def test_the_stack_s_processes_keep_an_unset_routing_policy_unset(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`blockq serve` hands its settings to every process as the environment: a routing policy
    nobody set must stay unset there, or no mixed fleet would ever route with its own policy."""
    monkeypatch.delenv("BLOCKQ_ROUTING_POLICY", raising=False)
    env = Settings().as_env()
    assert "BLOCKQ_ROUTING_POLICY" not in env
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert Settings().routing_policy_for(mixed_hardware=True) == "block_slo"
    assert Settings(routing_policy="llumnix").as_env()["BLOCKQ_ROUTING_POLICY"] == "llumnix"


def test_a_fleet_entry_sizes_its_own_instances() -> None:
    """KV blocks, batch size and declared capacity per entry; the others keep the defaults."""
    settings = Settings(fleet='[{"model": "m", "exec_model": "llama-2-7b-a100", "num_blocks": '
                              '7503, "max_num_seqs": 128, "capacity_rps": 8.99}, {"model": "m"}]',
                        emulated_num_blocks=1052, max_num_seqs=48)
    fast, plain = (settings.for_instance(i) for i in settings.instance_ids)
    assert (fast.emulated_num_blocks, fast.max_num_seqs, fast.instance_capacity_rps) == (
        7503, 128, 8.99)
    assert (plain.emulated_num_blocks, plain.max_num_seqs, plain.instance_capacity_rps) == (
        1052, 48, None)

"""A measurement runs alone and starts on a quiet machine (`benchmarks.quiet`)."""

from __future__ import annotations

import os

import pytest

from benchmarks import quiet, services_lock


def test_a_measurement_holds_the_services_lock_and_raises_the_flag(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quiet, "MEASURING_FLAG", tmp_path / "measuring")
    services = {"BLOCKQ_TEST_DATABASE_URL": f"postgresql://nowhere/{tmp_path.name}"}
    with quiet.measurement(services=services):
        assert (tmp_path / "measuring").read_text() == str(os.getpid())
        with pytest.raises(services_lock.ServicesBusy):  # a test run on them stops at once
            services_lock.hold(services)
    assert not (tmp_path / "measuring").exists()
    with services_lock.hold(services):  # let go at the end
        pass


def test_a_measurement_gives_up_waiting_for_a_busy_service(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quiet, "MEASURING_FLAG", tmp_path / "measuring")
    services = {"BLOCKQ_TEST_REDIS_URL": f"redis://nowhere/{tmp_path.name}"}
    with services_lock.hold(services), pytest.raises(services_lock.ServicesBusy):
        with quiet.measurement(services=services, wait_s=0):
            pass
    assert not (tmp_path / "measuring").exists()


def test_wait_for_quiet_returns_and_prints_the_load_once_it_is_low(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    loads = iter([(3.0, 2.0, 1.0), (3.0, 2.0, 1.0), (0.5, 1.5, 1.0), (0.5, 1.5, 1.0)])
    monkeypatch.setattr(os, "getloadavg", lambda: next(loads))
    assert quiet.wait_for_quiet(1.0, poll_s=0) == (0.5, 1.5, 1.0)
    out = capsys.readouterr().out.splitlines()
    assert out == ["waiting for a quiet machine: load average 3.00",
                   "load average at the start: 0.50 / 1.50 / 1.00"]


def test_alone_waits_for_quiet_and_prints_the_load_at_both_ends(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(quiet, "MEASURING_FLAG", tmp_path / "measuring")
    monkeypatch.setattr(os, "getloadavg", lambda: (0.25, 0.5, 0.75))
    services = {"V": f"redis://nowhere/{tmp_path.name}"}
    with quiet.alone(1.0, services=services) as load:
        assert load == (0.25, 0.5, 0.75) and (tmp_path / "measuring").exists()
        print("measuring")
    assert capsys.readouterr().out.splitlines() == [
        "load average at the start: 0.25 / 0.50 / 0.75", "measuring",
        "load average at the end: 0.25 / 0.50 / 0.75"]

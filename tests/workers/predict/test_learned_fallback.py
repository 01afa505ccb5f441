"""A learned length model that cannot load must not stall the pipeline: the accurate head's
queries go to the fast head, the fast head's to the baseline, labelled as such, and the model is
tried again later."""

from __future__ import annotations

from pathlib import Path

import pytest

from domain.settings import Settings
from workers.predict.baseline import RunningMeanPredictor
from workers.predict.stage import (
    HEAD_ACCURATE,
    HEAD_FAST,
    LearnedLengths,
    LengthQuery,
    learned_lengths,
)
from workers.runtime import Runtime


@pytest.fixture
def broken_model_rt(fresh_services: Settings, tmp_path: Path) -> Runtime:
    artifact = tmp_path / "length.npz"
    artifact.write_bytes(b"not a length model")
    return Runtime(fresh_services.model_copy(update={"length_fast_model_path": artifact}))


def test_a_model_that_cannot_load_is_answered_by_the_baseline(broken_model_rt: Runtime) -> None:
    learned = LearnedLengths(broken_model_rt, HEAD_FAST)

    answer = learned.predict(LengthQuery("Write a haiku about queues.", max_tokens=64))

    assert answer.predictor == RunningMeanPredictor().name
    assert 1 <= answer.tokens <= 64
    assert learned._failed_at is not None  # noqa: SLF001 - the retry clock started


def test_an_accurate_head_that_cannot_load_is_answered_by_the_fast_head(
        fresh_services: Settings, tmp_path: Path) -> None:
    artifact = tmp_path / "length.npz"
    artifact.write_bytes(b"not a length model")
    rt = Runtime(fresh_services.model_copy(update={"length_model_path": artifact}))
    accurate = learned_lengths(rt, HEAD_ACCURATE)

    answer = accurate.predict(LengthQuery("Write a haiku about queues.", max_tokens=64, priority=1))

    assert answer.predictor == learned_lengths(rt, HEAD_FAST).packaged.name
    assert accurate._failed_at is not None  # noqa: SLF001 - the retry clock started


def test_the_model_is_tried_again_after_the_retry_interval(
        broken_model_rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    learned = LearnedLengths(broken_model_rt, HEAD_FAST)
    learned.predict(LengthQuery("first", max_tokens=16))
    calls: list[int] = []
    monkeypatch.setattr(learned, "_predict_learned",
                        lambda queries: calls.append(len(queries)) or [])

    learned.predict(LengthQuery("within the interval", max_tokens=16))
    assert calls == []  # the broken model is not reloaded for every batch

    learned._failed_at -= learned.retry_after_s  # noqa: SLF001 - the interval has passed
    with pytest.raises(RuntimeError):  # the stand-in gives no answers: the batcher says so
        learned.predict(LengthQuery("after the interval", max_tokens=16))
    assert calls == [1]

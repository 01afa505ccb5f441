"""Fixtures of the worker tests: a small instance config and a toy step-time model (routing and
the cluster benchmark; the simulator's tests have their own in tests/workers/sim), a tiny random
encoder and a token counter (length predictor and learning), a worker runtime on the test
services and requests placed on instances."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import update

from domain.models import InferenceRequest, RequestStatus
from domain.settings import Settings
from tests.workers.request_rows import new_request
from workers import runtime
from workers.predict.features import TokenCounter
from workers.runtime import Runtime
from workers.sim import ExecModel, InstanceConfig

if TYPE_CHECKING:
    from workers.predict.encoder import Encoder

#: 10 ms per step plus a little per token: simple enough to reason about, every feature used.
TOY_COEFFICIENTS = {"const": 10.0, "num_tokens": 0.01, "num_decode_seqs": 0.05,
                    "num_prefill_seqs": 0.2, "decode_context_tokens": 0.0001}


@pytest.fixture
def toy_model() -> ExecModel:
    return ExecModel("toy", (), TOY_COEFFICIENTS)


@pytest.fixture
def small_config() -> InstanceConfig:
    return InstanceConfig(num_total_blocks=65, block_size=16, max_num_seqs=8,
                          max_num_batched_tokens=128, max_model_len=512)


# NOTE: torch, transformers and the encoder module are imported inside the fixtures: importing
# them takes seconds, and most tests under tests/workers (simulator, routing, serving) use neither.


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 32-wide random BERT with MiniLM's tokenizer, saved like any local encoder."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from workers.predict.encoder import default_encoder_path

    path = tmp_path_factory.mktemp("tiny-bert")
    tokenizer = AutoTokenizer.from_pretrained(default_encoder_path())
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=128)
    BertModel(config).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_encoder(tiny_encoder_dir: Path) -> Encoder:
    from workers.predict.encoder import Encoder, EncoderConfig

    return Encoder(EncoderConfig(path=str(tiny_encoder_dir), dtype="float32", max_seq_len=64,
                                 layers=(-2, -1), batch_size=8))


@pytest.fixture(scope="session")
def counter() -> TokenCounter:
    return TokenCounter()


@pytest.fixture
def rt(fresh_services: Settings) -> Iterator[Runtime]:
    """A worker process's runtime on the test PostgreSQL and Redis."""
    runtime = Runtime(fresh_services)
    yield runtime
    runtime.db.engine.dispose()


@pytest.fixture
def routed_request(rt: Runtime) -> Callable[..., str]:
    """Makes a request routed to an instance as its n-th routing attempt; returns its id."""

    def make(instance_id: str, attempt: int, status: RequestStatus = RequestStatus.ROUTED) -> str:
        with rt.db.session() as session:
            request_id = new_request(session)
            session.execute(update(InferenceRequest).where(InferenceRequest.id == request_id)
                            .values(status=status, instance_id=instance_id, attempt=attempt))
            return request_id

    return make


@pytest.fixture
def request_status(rt: Runtime) -> Callable[[str], str]:
    """The status a request has in the database now."""

    def status_of(request_id: str) -> str:
        with rt.db.session() as session:
            request = session.get(InferenceRequest, request_id)
            assert request is not None, request_id
            return request.status

    return status_of


@pytest.fixture
def configure_worker(fresh_services: Settings) -> Iterator[Callable[..., Runtime]]:
    """Makes a task's process runtime (what the tasks' `runtime.get()` returns) from the test
    settings with overrides; after the test, disposes them and restores the test settings."""
    made: list[Runtime] = []

    def make(**overrides: Any) -> Runtime:
        rt = runtime.configure(fresh_services.model_copy(update=overrides))
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.db.engine.dispose()
    runtime.configure(fresh_services)

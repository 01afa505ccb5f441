"""Sampling parameters, prompt forms, n and logprobs as real clients send them (`vllm bench serve`,
the `openai` package, evaluation harnesses), on the native and OpenAI endpoints, on PostgreSQL
(no workers: what is checked is what the API accepts, refuses and stores)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select

from domain import openai_format as fmt
from domain.errors import InvalidRequest
from domain.models import InferenceRequest
from domain.openai_schemas import CompletionBody, native_body
from domain.schemas import parse_body
from domain.settings import Settings
from tests.app.flask_client import api_client, error_body, services_of

pytestmark = pytest.mark.services

#: What `vllm bench serve` sends to /v1/completions (vllm/benchmarks/lib/endpoint_request_func.py)
#: with --ignore-eos, plus every other extra parameter a vLLM client may set.
VLLM_EXTRAS = {"repetition_penalty": 1.0, "ignore_eos": True, "top_k": 5, "min_p": 0.05,
               "min_tokens": 2, "stop_token_ids": [2, 7], "frequency_penalty": 0.5,
               "presence_penalty": -0.5, "logit_bias": {"42": 100, "7": -100}}


def test_native_requests_store_the_extra_parameters_and_token_id_prompts(
    fresh_services: Settings,
) -> None:
    client = api_client(fresh_services)
    created = client.post("/v1/requests", json={"prompt": "Hello there", "max_tokens": 8,
                                                "logprobs": 3, **VLLM_EXTRAS})
    assert created.status_code == 202, created.get_json()
    shown = client.get(f"/v1/requests/{created.get_json()['id']}").get_json()
    assert shown["sampling"] == {**VLLM_EXTRAS, "logit_bias": {"42": 100.0, "7": -100.0},
                                 "logprobs": 3}

    plain = client.post("/v1/requests", json={"prompt": "Hello", "max_tokens": 4,
                                              "repetition_penalty": None})
    assert client.get(f"/v1/requests/{plain.get_json()['id']}").get_json()["sampling"] is None

    ids = client.post("/v1/requests", json={"prompt": [1, 46, 1614, 85, 645], "max_tokens": 4})
    assert ids.status_code == 202, ids.get_json()
    with services_of(client).db.session() as session:
        row = session.get(InferenceRequest, ids.get_json()["id"])
        assert row is not None
        assert row.prompt_token_ids == [1, 46, 1614, 85, 645] and row.prompt_tokens == 5
        assert "Hello there" in row.prompt  # the ids' text, for show and for the predictor


#: (endpoint, body, the param the 400 names, a word its message must contain)
_REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    ("/v1/requests", {"prompt": "x", "top_k": -2}, "top_k", "greater than or equal to -1"),
    ("/v1/requests", {"prompt": "x", "min_p": 1.5}, "min_p", "less than or equal to 1"),
    ("/v1/requests", {"prompt": "x", "repetition_penalty": 0}, "repetition_penalty",
     "greater than 0"),
    ("/v1/requests", {"prompt": "x", "frequency_penalty": 2.5}, "frequency_penalty", "2"),
    ("/v1/requests", {"prompt": "x", "presence_penalty": -3}, "presence_penalty", "-2"),
    ("/v1/requests", {"prompt": "x", "ignore_eos": "yes"}, "ignore_eos", "boolean"),
    ("/v1/requests", {"prompt": "x", "min_tokens": -1}, "min_tokens", "greater than"),
    ("/v1/requests", {"prompt": "x", "max_tokens": 4, "min_tokens": 5}, "min_tokens",
     "max_tokens"),
    ("/v1/requests", {"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids.0", "greater"),
    ("/v1/requests", {"prompt": "x", "stop_token_ids": [4000]}, "stop_token_ids",
     "vocabulary"),
    ("/v1/requests", {"prompt": "x", "logit_bias": {"12": 101}}, "logit_bias.12", "100"),
    ("/v1/requests", {"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias.abc.[key]",
     "integer"),
    ("/v1/requests", {"prompt": "x", "logit_bias": {"99999": 1}}, "logit_bias", "vocabulary"),
    ("/v1/requests", {"prompt": "x", "logit_bias": {str(i): 1 for i in range(301)}},
     "logit_bias", "300"),
    ("/v1/requests", {"prompt": "x", "stop_token_ids": list(range(65))}, "stop_token_ids",
     "64"),
    ("/v1/requests", {"prompt": "x", "logprobs": 21}, "logprobs", "20"),
    ("/v1/requests", {"prompt": [1, 99999]}, "prompt", "vocabulary"),
    ("/v1/requests", {"prompt": [1, -3]}, "prompt", "token ids"),
    ("/v1/requests", {"prompt": [True]}, "prompt", "token ids"),
    ("/v1/requests", {"prompt": "x", "max_tokens": 0}, "max_tokens", "echo"),
    ("/v1/requests", {"prompt": "x", "best_of": 2}, "best_of", "Extra inputs"),
    ("/v1/completions", {"prompt": "x", "top_k": 1.5}, "top_k", "integer"),
    ("/v1/completions", {"prompt": "x", "repetition_penalty": 9}, "repetition_penalty", "2"),
    ("/v1/completions", {"prompt": "x", "ignore_eos": True, "beam_width": 2}, "beam_width",
     "Extra inputs"),
    ("/v1/completions", {"prompt": [], "max_tokens": 2}, "prompt", "a list of token ids"),
    ("/v1/completions", {"prompt": [[1, 2], "x"]}, "prompt", "a list of strings"),
    ("/v1/completions", {"prompt": ["x", ""]}, "prompt", "empty"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, "messages.0.content",
     "text parts"),
    ("/v1/completions", {"prompt": [[1, 99999]]}, "prompt", "vocabulary"),
    ("/v1/completions", {"prompt": ["a", "b"], "n": 65}, "n", "at most 128"),
    ("/v1/completions", {"prompt": "x", "n": 0}, "n", "greater than or equal to 1"),
    ("/v1/completions", {"prompt": "x", "n": 2, "stream": True}, "n", "stream"),
    ("/v1/completions", {"prompt": ["a", "b"], "stream": True}, "prompt", "stream"),
    ("/v1/completions", {"prompt": "x", "logprobs": 2, "stream": True}, "logprobs", "stream"),
    ("/v1/completions", {"prompt": "x", "echo": True, "stream": True}, "echo", "stream"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs", "20"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens", "echo"),
    ("/v1/completions", {"prompt": "x", "best_of": 3}, "best_of", "n"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs", "logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "20"),
    ("/v1/chat/completions", {"min_tokens": 3, "max_tokens": 2}, "min_tokens", "max_tokens"),
    ("/v1/chat/completions", {"echo": True}, "echo", "Extra inputs"),
]


def test_out_of_range_and_unknown_parameters_are_400_naming_them(
    fresh_services: Settings,
) -> None:
    client = api_client(fresh_services)
    model = fresh_services.model_name
    for endpoint, body, param, word in _REFUSED:
        if endpoint != "/v1/requests":
            body = {"model": model, **body}
            if endpoint == "/v1/chat/completions":
                body.setdefault("messages", [{"role": "user", "content": "Hi"}])
        response = client.post(endpoint, json=body)
        assert response.status_code == 400, (body, response.get_json())
        error = error_body(response, 400)
        assert (error["param"], error["type"]) == (param, "invalid_request_error"), (body, error)
        assert word in error["message"], (body, error)
        if "Extra inputs" in word:
            assert error["code"] == "unknown_parameter"
    with services_of(client).db.session() as session:
        assert session.scalars(select(InferenceRequest)).all() == []  # nothing was stored


#: Fields of each endpoint by JSON type: a string or a boolean for a number, and a number or a
#: string for a boolean, is the wrong type (400, docs/api.md), though pydantic's lax mode (and
#: vLLM's server) would read "5" as 5 and true as 1.
_TYPED_FIELDS: dict[str, dict[str, list[str]]] = {
    "/v1/requests": {
        "integer": ["max_tokens", "seed", "logprobs", "top_k", "min_tokens"],
        "number": ["temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty",
                   "presence_penalty"],
        "boolean": ["echo", "ignore_eos"]},
    "/v1/completions": {
        "integer": ["max_tokens", "n", "seed", "logprobs", "best_of", "top_k"],
        "number": ["temperature", "top_p", "presence_penalty"],
        "boolean": ["stream", "echo", "ignore_eos"]},
    "/v1/chat/completions": {
        "integer": ["max_tokens", "max_completion_tokens", "top_logprobs", "min_tokens"],
        "number": ["temperature", "frequency_penalty"],
        "boolean": ["stream", "logprobs"]},
}
_WRONG = {"integer": ["5", True], "number": ["0.5", True], "boolean": [1, "true"]}


def _body(endpoint: str, model: str, **fields: Any) -> dict[str, Any]:
    if endpoint == "/v1/requests":
        return {"prompt": "x", **fields}
    if endpoint == "/v1/completions":
        return {"model": model, "prompt": "x", **fields}
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], **fields}


def test_numbers_and_booleans_of_the_wrong_json_type_are_400_naming_the_field(
    fresh_services: Settings,
) -> None:
    client = api_client(fresh_services)
    for endpoint, kinds in _TYPED_FIELDS.items():
        for kind, fields in kinds.items():
            for field in fields:
                for wrong in _WRONG[kind]:
                    body = _body(endpoint, fresh_services.model_name, **{field: wrong})
                    error = error_body(client.post(endpoint, json=body), 400)
                    assert error["param"] == field, (endpoint, body, error)
                    word = "boolean" if kind == "boolean" else (
                        "a string" if isinstance(wrong, str) else "a boolean")
                    assert word in error["message"], (endpoint, body, error)
    bias = _body("/v1/requests", "", logit_bias={"7": "5"})
    assert error_body(client.post("/v1/requests", json=bias), 400)["param"] == "logit_bias.7"
    with services_of(client).db.session() as session:
        assert session.scalars(select(InferenceRequest)).all() == []  # nothing was stored


def test_a_whole_number_written_as_a_float_is_an_integer_as_in_json_schema(
    fresh_services: Settings,
) -> None:
    client = api_client(fresh_services)
    created = client.post("/v1/requests", json={"prompt": "x", "max_tokens": 5.0, "seed": 3.0,
                                                "temperature": 1, "top_k": 4.0})
    assert created.status_code == 202, created.get_json()
    shown = client.get(f"/v1/requests/{created.get_json()['id']}").get_json()
    assert shown["max_tokens"] == 5 and shown["sampling"] == {"top_k": 4}
    error = error_body(client.post("/v1/requests", json={"prompt": "x", "max_tokens": 5.5}), 400)
    assert error["param"] == "max_tokens"


def test_openai_calls_make_one_request_per_choice_in_openai_order(
    fresh_services: Settings,
) -> None:
    """No engine runs here: the call times out (504) once its requests are stored, which is
    what this checks."""
    client = api_client(fresh_services.model_copy(update={"sync_timeout_s": 0.2}))
    model = fresh_services.model_name
    body = {"model": model, "prompt": [[1, 46, 1614], [1, 85, 645, 46]], "n": 2, "seed": 11,
            "max_tokens": 3, "echo": True, "logprobs": 1, **VLLM_EXTRAS}
    del body["min_tokens"]
    assert client.post("/v1/completions", json=body).status_code == 504
    client.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "Hi"}], "logprobs": True,
        "top_logprobs": 2, "max_completion_tokens": 5, "top_k": 3})
    client.post("/v1/completions", json={"model": model, "prompt": "Score me", "echo": True,
                                         "logprobs": 1, "max_tokens": 0})
    with services_of(client).db.session() as session:
        rows = session.scalars(select(InferenceRequest)
                               .order_by(InferenceRequest.created_at)).all()
        choices = [(r.prompt_token_ids, r.seed, r.sampling["echo"], r.sampling["logprobs"])
                   for r in rows[:4]]
        assert choices == [([1, 46, 1614], 11, True, 1), ([1, 46, 1614], 12, True, 1),
                           ([1, 85, 645, 46], 11, True, 1), ([1, 85, 645, 46], 12, True, 1)]
        assert all(r.sampling["ignore_eos"] and r.sampling["logit_bias"] == {"42": 100.0,
                                                                             "7": -100.0}
                   for r in rows[:4])
        chat = rows[4]
        assert chat.messages is not None and chat.sampling == {"top_k": 3, "logprobs": 2}
        assert chat.max_tokens == 5
        scored = rows[5]
        assert scored.max_tokens == 1 and scored.sampling == {"logprobs": 1, "echo": True,
                                                              "prompt_only": True}
        assert len(rows) == 6


def test_one_deadline_covers_every_choice_of_a_call(fresh_services: Settings) -> None:
    """A call's choices share one sync_timeout_s: the first three finish 2.5 s after they are
    stored (written here, no engine runs), the last never does; the call answers 504 about 3 s
    after they were stored, not 3 s after the first three finished."""
    client = api_client(fresh_services.model_copy(update={"sync_timeout_s": 3.0}))
    db = services_of(client).db
    stored_at: list[float] = []

    def finish_all_but_the_last() -> None:
        choices: list[InferenceRequest] = []
        while len(choices) < 4:
            with db.session() as session:
                choices = list(session.scalars(select(InferenceRequest)
                                               .order_by(InferenceRequest.created_at)))
        stored_at.append(time.monotonic())
        time.sleep(2.5)
        with db.session() as session:
            for row in choices[:-1]:
                row = session.merge(row)
                row.status, row.output_text, row.output_tokens = "succeeded", " ok", 1
                row.finish_reason = "length"

    finisher = threading.Thread(target=finish_all_but_the_last)
    finisher.start()
    answer = client.post("/v1/completions", json={"model": fresh_services.model_name,
                                                  "prompt": "Hi", "n": 4, "max_tokens": 2})
    answered_after = time.monotonic() - stored_at[0]
    finisher.join()
    assert answer.status_code == 504
    assert answered_after < 4.75  # one deadline: 3-4 s (1 s polls); one per choice: 5.5-6.5 s


def _row(request_id: str, *, prompt: str = "Hi you", output: str = " there", prompt_tokens: int = 3,
         output_tokens: int = 1, sampling: dict[str, Any] | None = None,
         logprobs: dict[str, Any] | None = None) -> InferenceRequest:
    return InferenceRequest(id=request_id, prompt=prompt, output_text=output,
                            prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                            finish_reason="length", sampling=sampling, logprobs=logprobs,
                            created_at=datetime(2026, 12, 1, tzinfo=UTC))


def _entry(token_id: int, token: str, logprob: float | None, *alternatives: tuple[str, float]
           ) -> dict[str, Any]:
    top = [{"id": token_id, "token": token, "logprob": logprob, "rank": 3}] + [
        {"id": 100 + i, "token": t, "logprob": lp, "rank": i + 1}
        for i, (t, lp) in enumerate(alternatives)]
    return {"id": token_id, "token": token, "logprob": logprob,
            "top": [] if logprob is None else top}


#: Logprobs as the vLLM engine stores them for "Hi you" -> " there" with logprobs=1, echo.
_STORED = {
    "prompt": [_entry(1, "<s>", None), _entry(46, "Hi", -4.5, ("A", -1.0)),
               _entry(85, " you", -2.0, ("!", -0.5))],
    "output": [_entry(645, " there", -3.25, ("?", -0.25))],
}


def test_completions_render_choices_usage_echo_and_logprobs_as_openai_does() -> None:
    rows = [_row("req_a", sampling={"echo": True, "logprobs": 1}, logprobs=_STORED),
            _row("req_b", output=" all", output_tokens=2),
            _row("req_c", prompt="Other", output=" x", prompt_tokens=5, output_tokens=4)]
    body = fmt.completion_object(rows, "m", n=2)
    assert body["id"] == "cmpl-a" and [c["index"] for c in body["choices"]] == [0, 1, 2]
    # Usage: each prompt once (the first of its n choices), every choice's output.
    assert body["usage"] == {"prompt_tokens": 8, "completion_tokens": 7, "total_tokens": 15}
    echoed = body["choices"][0]
    assert echoed["text"] == "Hi you there"
    assert echoed["logprobs"] == {
        "tokens": ["<s>", "Hi", " you", " there"],
        "token_logprobs": [None, -4.5, -2.0, -3.25],
        "top_logprobs": [None, {"Hi": -4.5, "A": -1.0}, {" you": -2.0, "!": -0.5},
                         {" there": -3.25, "?": -0.25}],
        "text_offset": [0, 3, 5, 9],
    }
    assert body["choices"][1]["logprobs"] is None and body["choices"][1]["text"] == " all"

    scored = fmt.completion_object(_row("req_d", sampling={"echo": True, "logprobs": 1,
                                                           "prompt_only": True},
                                        logprobs=_STORED), "m")
    choice = scored["choices"][0]
    assert choice["text"] == "Hi you"  # max_tokens 0: the prompt alone
    assert choice["logprobs"]["token_logprobs"] == [None, -4.5, -2.0]


def test_chat_renders_logprobs_with_bytes_and_top_logprobs() -> None:
    row = _row("req_e", sampling={"logprobs": 1}, logprobs={"output": _STORED["output"]})
    row.messages = [{"role": "user", "content": "Hi"}]
    body = fmt.chat_completion_object(row, "m")
    assert body["choices"][0]["logprobs"] == {"content": [{
        "token": " there", "logprob": -3.25, "bytes": list(b" there"),
        "top_logprobs": [{"token": "?", "logprob": -0.25, "bytes": list(b"?")}],
    }], "refusal": None}
    no_top = _row("req_f", sampling={"logprobs": 0}, logprobs={"output": _STORED["output"]})
    assert fmt.chat_completion_object(no_top, "m")["choices"][0]["logprobs"]["content"][0][
        "top_logprobs"] == []
    assert fmt.chat_completion_object(_row("req_g"), "m")["choices"][0]["logprobs"] is None



def test_a_batch_line_runs_one_choice() -> None:
    """A batch line is one request (its output line is one response): several prompts or n > 1
    fail that line with a 400 naming the parameter."""
    for body, param in (({"prompt": "x", "n": 2}, "n"), ({"prompt": ["a", "b"]}, "prompt"),
                        ({"prompt": [[1, 2], [3]]}, "prompt")):
        parsed = parse_body(CompletionBody, {"model": "m", **body})
        with pytest.raises(InvalidRequest) as refused:
            native_body(parsed, priority="batch")
        assert refused.value.param == param and "one choice" in refused.value.message
    assert native_body(parse_body(CompletionBody, {"model": "m", "prompt": [[5, 6]]}),
                       priority="batch")["prompt"] == [5, 6]

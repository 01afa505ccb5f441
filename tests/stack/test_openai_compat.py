"""The OpenAI-compatible endpoints with the official `openai` client against the real stack."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

import httpx
import openai
import pytest
from click.testing import CliRunner

from app.cli import main as cli
from app.cli.stack import Stack


def _client(stack: Stack, api_key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key=api_key or stack.api_key,
                         _strict_response_validation=True, max_retries=0, timeout=60)


def _native(stack: Stack, response_id: str) -> dict:
    request_id = "req_" + response_id.split("-", 1)[1]
    with stack.client() as client:
        return client.get(f"/v1/requests/{request_id}").json()


def test_models_completions_and_errors(emulated_stack: Stack) -> None:
    stack = emulated_stack  # two emulated instances, 20 times faster than real time
    client = _client(stack)
    model = stack.settings.model_name

    assert [m.id for m in client.models.list().data] == [model]
    assert client.models.retrieve(model).owned_by == "blockq"

    completion = client.completions.create(model=model, prompt="Say something.", max_tokens=12)
    assert completion.object == "text_completion" and completion.id.startswith("cmpl-")
    choice = completion.choices[0]
    assert choice.text and choice.finish_reason in {"stop", "length"}
    usage = completion.usage
    assert usage is not None and 1 <= usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    native = _native(stack, completion.id)
    assert native["status"] == "succeeded" and native["output"] == choice.text
    assert native["policy"] is not None and native["predicted_output_tokens"] is not None

    chat = client.chat.completions.create(
        model=model, max_tokens=16,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-")
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.completion_tokens <= 16

    with pytest.raises(openai.NotFoundError) as missing_model:
        client.completions.create(model="gpt-4", prompt="x")
    assert missing_model.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=model, n=129, messages=[{"role": "user",
                                                                      "content": "x"}])
    assert bad.value.body["param"] == "n"  # type: ignore[index]
    with pytest.raises(openai.UnprocessableEntityError):
        client.completions.create(model=model, prompt="word " * 5000, max_tokens=4)
    with pytest.raises(openai.AuthenticationError):
        _client(stack, api_key="bq-wrong").models.list()

    env = {"BLOCKQ_API_URL": f"{stack.api_url}/v1", "BLOCKQ_API_KEY": stack.api_key}
    answered = CliRunner().invoke(cli, ["submit", "Hello", "--max-tokens", "5"], env=env)
    assert answered.exit_code == 0, answered.output
    assert 1 <= len(answered.output.split()) <= 5 and answered.output.startswith("tok")
    refused = CliRunner().invoke(cli, ["submit", "Hello"], env={**env, "BLOCKQ_API_KEY": "x"})
    assert refused.exit_code == 1 and "AuthenticationError" in refused.output


def test_streams_flow_while_generating_and_a_dropped_stream_cancels(
    start_stack: Callable[..., Stack],
) -> None:
    # About 2 s of generation per request: time to see tokens arrive before the end.
    stack = start_stack(1, engine_kind="emulated", emulated_time_scale=1.0,
                        emulated_output_lengths="max_tokens")
    client = _client(stack)
    model = stack.settings.model_name

    stream = client.chat.completions.create(
        model=model, max_tokens=60, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Tell me a long story."}])
    arrivals, pieces, finish, usage = [], [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
                arrivals.append(time.time())
            finish = choice.finish_reason or finish
    native = _native(stack, chunk.id)
    finished_at = datetime.fromisoformat(native["finished_at"]).timestamp()

    assert "".join(pieces) == native["output"] and finish == "length"
    assert usage is not None and usage.completion_tokens == 60
    assert len(pieces) > 3 and arrivals[0] < finished_at - 0.5  # streamed, not at the end

    # NOTE: the client types streamed legacy completions as `Completion`, whose finish_reason
    # may not be null: strict validation rejects every chunk but the last, from OpenAI too.
    lenient = openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key=stack.api_key)
    text = "".join(c.choices[0].text for c in lenient.completions.create(
        model=model, prompt="Count.", max_tokens=20, stream=True) if c.choices)
    assert len(text.split()) == 20

    with httpx.Client(base_url=stack.api_url, timeout=30,
                      headers={"Authorization": f"Bearer {stack.api_key}"}) as raw:
        with raw.stream("POST", "/v1/completions", json={
                "model": model, "prompt": "Go on and on.", "max_tokens": 500,
                "stream": True}) as response:
            first = next(response.iter_lines())
    request_id = "req_" + first.split('"id":"cmpl-', 1)[1].split('"', 1)[0]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with stack.client() as api:
            status = api.get(f"/v1/requests/{request_id}").json()["status"]
        if status == "cancelled":
            break
        time.sleep(0.2)
    assert status == "cancelled"  # the client hung up: nobody generates for it any more


@pytest.mark.vllm
def test_chat_completions_on_vllm_stream_the_real_engines_tokens(vllm_stack: Stack) -> None:
    stack = vllm_stack  # the real vLLM engine with the tiny model
    client = _client(stack)
    messages = [{"role": "user", "content": "Hello, who are you?"}]
    model = stack.settings.model_name

    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=messages, max_tokens=24, seed=7, temperature=0.0, stream=True)
        if c.choices]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                           seed=7, temperature=0.0)

    assert len([p for p in pieces if p]) > 1
    native = _native(stack, whole.id)
    assert native["output"] == whole.choices[0].message.content
    assert "".join(pieces) == whole.choices[0].message.content  # greedy: the same answer
    assert whole.usage is not None and whole.usage.completion_tokens == native["output_tokens"]

"""Real clients, as they are, against the real stack with the vLLM engine and the tiny model:
vLLM's own benchmark client (`vllm bench serve`) and a third party's (guidellm) on both OpenAI
endpoints, an evaluation harness's scoring request (lm-eval's loglikelihood: token-id prompts,
echo, logprobs), and the `openai` package with OpenAI's prompt forms, n and logprobs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import openai
import pytest

from app.cli.stack import Stack
from workers.serve.vllm_cli import vllm_cli

NUM_PROMPTS = 8
OUTPUT_LEN = 6



def _bench(stack: Stack, out_dir: Path, backend: str, endpoint: str) -> dict[str, Any]:
    """`vllm bench serve` on the random dataset with every sampling flag it has; its saved
    result."""
    result = out_dir / f"{backend}.json"
    command = [
        *vllm_cli(), "bench", "serve", "--backend", backend, "--base-url", stack.api_url,
        "--endpoint", endpoint, "--model", stack.settings.model_name,
        "--tokenizer", str(stack.settings.resolved_model_path), "--dataset-name", "random",
        "--random-input-len", "24", "--random-output-len", str(OUTPUT_LEN),
        "--num-prompts", str(NUM_PROMPTS), "--max-concurrency", "4", "--ignore-eos",
        "--temperature", "0.8", "--top-p", "0.95", "--top-k", "20", "--min-p", "0.01",
        "--repetition-penalty", "1.05", "--frequency-penalty", "0.1", "--presence-penalty",
        "0.1", "--seed", "0", "--disable-tqdm", "--save-result", "--result-dir", str(out_dir),
        "--result-filename", result.name,
    ]
    env = {**os.environ, "OPENAI_API_KEY": stack.api_key or ""}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return json.loads(result.read_text())


def _client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key=stack.api_key,
                         _strict_response_validation=True, max_retries=0, timeout=120)


@pytest.mark.vllm
def test_vllm_bench_an_eval_harness_and_the_openai_client_run_unmodified(
    vllm_stack: Stack, tmp_path: Path,
) -> None:
    stack = vllm_stack  # the real vLLM engine with the tiny model
    for backend, endpoint in (("openai", "/v1/completions"),
                              ("openai-chat", "/v1/chat/completions")):
        saved = _bench(stack, tmp_path, backend, endpoint)
        assert (saved["completed"], saved["failed"]) == (NUM_PROMPTS, 0), saved.get("errors")
        # ignore_eos: every answer ran to its length.
        assert saved["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN

    from transformers import AutoTokenizer  # here: seconds to import, at every collection else

    client = _client(stack)
    model = stack.settings.model_name
    tokenizer = AutoTokenizer.from_pretrained(str(stack.settings.resolved_model_path))
    # lm-eval's loglikelihood request, as its OpenAI completions model sends it (plain JSON,
    # tokenized requests): context + continuation as token ids, one token, echo with logprobs.
    # NOTE: not through the openai package: its types say token_logprobs holds floats, but
    # OpenAI's API (and vLLM's) answer null for the first echoed token, as blockq does.
    context = tokenizer("The cat sat on the")["input_ids"]
    continuation = tokenizer(" mat")["input_ids"][1:]
    prompts = [context + continuation, tokenizer("Hello there")["input_ids"]]
    with stack.client() as http:
        answer = http.post("/v1/completions", timeout=120, json={
            "model": model, "prompt": prompts, "temperature": 0, "max_tokens": 1,
            "logprobs": 1, "seed": 1234, "echo": True})
    assert answer.status_code == 200, answer.text
    scored = answer.json()
    choices = sorted(scored["choices"], key=lambda choice: choice["index"])
    assert [c["index"] for c in choices] == [0, 1]
    for prompt, choice in zip(prompts, choices, strict=True):
        logprobs = choice["logprobs"]
        assert len(logprobs["token_logprobs"]) == len(logprobs["tokens"]) == len(prompt) + 1
        assert logprobs["token_logprobs"][0] is None  # nothing precedes the first token
        assert all(lp <= 0 for lp in logprobs["token_logprobs"][1:])
        assert choice["text"].startswith(tokenizer.decode(prompt))
        # What lm-eval reads: the continuation's logprobs and whether each was the greedy one.
        for token, lp, top in zip(logprobs["tokens"][1:], logprobs["token_logprobs"][1:],
                                  logprobs["top_logprobs"][1:], strict=True):
            assert top[token] == lp and max(top.values()) >= lp
    continuation_lps = choices[0]["logprobs"]["token_logprobs"][len(context):-1]
    assert len(continuation_lps) == len(continuation)
    assert scored["usage"] == {"prompt_tokens": sum(len(p) for p in prompts),
                               "completion_tokens": 2,
                               "total_tokens": sum(len(p) for p in prompts) + 2}

    with stack.client() as http:
        prompt_only = http.post("/v1/completions", timeout=120, json={
            "model": model, "prompt": prompts[1], "max_tokens": 0, "echo": True, "logprobs": 0,
            "temperature": 0}).json()["choices"][0]
    assert prompt_only["text"] == tokenizer.decode(prompts[1])
    alone = prompt_only["logprobs"]["token_logprobs"]
    # The same prompt scores the same, whatever else was generated (up to the rounding of
    # another batch's arithmetic).
    assert alone[0] is None and len(alone) == len(prompts[1])
    assert alone[1:] == pytest.approx(choices[1]["logprobs"]["token_logprobs"][1:-1], abs=1e-2)

    several = client.completions.create(model=model, prompt=["Hello", "A queue of"], n=2,
                                        max_tokens=4, temperature=0.0,
                                        extra_body={"ignore_eos": True})
    assert len(several.choices) == 4 and [c.index for c in several.choices] == [0, 1, 2, 3]
    assert several.usage is not None and several.usage.completion_tokens == 16

    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=5, logprobs=True,
        top_logprobs=3, temperature=0.0, extra_body={"ignore_eos": True, "top_k": 5})
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 5
    assert "".join(t.token for t in content) == chat.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 and bytes(t.bytes or []) == t.token.encode()
               for t in content)

    with pytest.raises(openai.BadRequestError) as unknown:
        client.completions.create(model=model, prompt="x", extra_body={"top_q": 0.5})
    assert unknown.value.body["param"] == "top_q"  # type: ignore[index]


#: guidellm, in its own virtualenv (`make setup`; it pins click and datasets apart from blockq).
GUIDELLM = Path(__file__).resolve().parents[2] / ".venv-guidellm" / "bin" / "guidellm"


@pytest.mark.vllm
def test_guidellm_a_third_party_benchmark_client_runs_unmodified(
    vllm_stack: Stack, tmp_path: Path,
) -> None:
    """guidellm (Red Hat's, not ours), as it is installed, on both OpenAI endpoints: it checks
    the server and its models first, streams every request, and counts tokens from the
    stream's usage; each run must complete every request with none failed."""
    stack = vllm_stack
    assert GUIDELLM.exists(), f"{GUIDELLM} missing: run `make setup`"
    key = stack.issue_api_key("guidellm")  # a team's key, as a user would have
    for endpoint in ("/v1/chat/completions", "/v1/completions"):
        report = tmp_path / f"guidellm{endpoint.replace('/', '_')}.json"
        backend = (f"kind=openai_http,target={stack.api_url},model={stack.settings.model_name},"
                   f"request_format={endpoint},api_key={key}")
        command = [
            str(GUIDELLM), "run", "--backend", backend,
            "--profile", "kind=concurrent,streams=4",
            "--constraint", f"kind=max_requests,count={NUM_PROMPTS}",
            "--data", f"kind=synthetic_text,prompt_tokens=24,output_tokens={OUTPUT_LEN}",
            "--tokenizer", f"kind=hf_auto,model={stack.settings.resolved_model_path}",
            "--output", f"kind=json,path={report}", "--disable-console-interactive",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                              check=False, cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        metrics = json.loads(report.read_text())["benchmarks"][0]["metrics"]
        assert metrics["request_totals"] == {"successful": NUM_PROMPTS, "errored": 0,
                                             "incomplete": 0, "total": NUM_PROMPTS}, endpoint
        # It sends vLLM's ignore_eos and stream_options.continuous_usage_stats, and counts the
        # tokens from the stream's usage: every answer ran to its length...
        assert metrics["output_token_count"]["successful"]["total_sum"] == (
            NUM_PROMPTS * OUTPUT_LEN), endpoint
        # ... and its prompts, 24 tokens by its own tokenizer, are 24 in blockq's usage (a chat
        # prompt has the template's tokens besides).
        prompt_tokens = metrics["prompt_token_count"]["successful"]["total_sum"]
        if endpoint == "/v1/completions":
            assert prompt_tokens == NUM_PROMPTS * 24
        else:
            assert prompt_tokens > NUM_PROMPTS * 24
        assert metrics["time_to_first_token_ms"]["successful"]["count"] == NUM_PROMPTS

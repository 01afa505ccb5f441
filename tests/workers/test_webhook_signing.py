"""Standard Webhooks signatures, checked against the official openai client's verifier."""

from __future__ import annotations

import json
import time

import pytest
from openai import OpenAI

from workers.webhooks.signing import new_secret, signed_headers, verify


def test_signature_verifies_with_openai_client_and_rejects_tampering() -> None:
    secret = new_secret()
    body = json.dumps(
        {
            "id": "msg_1",
            "object": "event",
            "type": "request.succeeded",
            "created_at": int(time.time()),
            "data": {"id": "req_1"},
        }
    ).encode()
    headers = signed_headers(secret, "msg_1", int(time.time()), body)
    assert verify(secret, headers, body)
    client = OpenAI(api_key="unused", base_url="http://127.0.0.1:9", webhook_secret=secret)
    client.webhooks.verify_signature(body, headers)  # raises if invalid
    assert not verify(secret, headers, body + b" ")
    with pytest.raises(Exception, match="(?i)signature"):
        client.webhooks.verify_signature(body.replace(b"req_1", b"req_2"), headers)


def test_secret_must_have_prefix() -> None:
    with pytest.raises(ValueError, match="whsec_"):
        signed_headers("plain", "msg_1", 0, b"{}")

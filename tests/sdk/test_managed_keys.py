"""The SDKs through `recovea serve`, signed upstream with the org's managed provider keys.

Every call checks the provider's side too: the managed key in the provider's own header, and no Recovea
secret in any header or body the provider received; and its receipt: exactly one per call, with the mock's
usage figures (crates/testkit: input = 1 + the words of the prompt, output = 5) and the exact cost.
"""

from __future__ import annotations

import pytest

from conftest import (
    ANTHROPIC_MODEL,
    MOCK_OUTPUT_TOKENS,
    OPENAI_MODEL,
    assert_forwarded_with_managed_key,
    assert_receipt,
    assert_request_id,
    mock_input_tokens,
    utcnow,
)

MESSAGES = [{"role": "user", "content": "Say hello in three words."}]
MESSAGES_INPUT_TOKENS = 1 + 5  # the mock's count: 1 + "Say hello in three words."


def check_receipt(ledger, tenant, rid, req, *, input_tokens, output_tokens=MOCK_OUTPUT_TOKENS, **kw):
    """The only receipt of the call since the tenant's setup, `input_tokens` also as the mock counted the
    body it received."""
    assert isinstance(rid, str) and rid.startswith("req_"), f"not a gateway request id: {rid!r}"
    assert mock_input_tokens(req.body_json) == input_tokens, req.body_json
    (receipt,) = ledger.settle_tenant(tenant, [rid]).values()
    assert_receipt(receipt, tenant=tenant, request_id=rid, input_tokens=input_tokens, output_tokens=output_tokens,
                   **kw)
    return receipt


def test_chat_completion(tenant, openai_client, mock_provider, ledger):
    client = openai_client(tenant.secret)
    mark, t0, rev = mock_provider.mark(), utcnow(), ledger.price_revision()
    raw = client.chat.completions.with_raw_response.create(model=OPENAI_MODEL, messages=MESSAGES)
    rid = assert_request_id(raw.headers)
    resp = raw.parse()
    assert resp._request_id == rid, "the SDK's request id is not the gateway's x-request-id"
    assert resp.object == "chat.completion"
    assert resp.choices and resp.choices[0].message.content
    assert resp.usage is not None and resp.usage.total_tokens > 0
    (req,) = assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/chat/completions")
    assert req.method == "POST"
    assert req.body_json["model"] == OPENAI_MODEL
    assert req.body_json["messages"] == MESSAGES
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (MESSAGES_INPUT_TOKENS, MOCK_OUTPUT_TOKENS)
    check_receipt(ledger, tenant, rid, req, input_tokens=MESSAGES_INPUT_TOKENS, provider="openai",
                  model=OPENAI_MODEL, endpoint="/v1/chat/completions", stream=False, price_revision=rev,
                  not_before=t0)


def test_chat_completion_stream(tenant, openai_client, mock_provider, ledger):
    client = openai_client(tenant.secret)
    mark, rev = mock_provider.mark(), ledger.price_revision()
    stream = client.chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES, stream=True)
    rid = assert_request_id(stream.response.headers)
    assert stream.response.headers.get("content-type", "").startswith("text/event-stream")
    text, finish_reasons, n = [], [], 0
    for chunk in stream:
        n += 1
        assert chunk.object == "chat.completion.chunk"
        # the client did not ask for usage: it gets no usage chunk, whatever the gateway asks upstream
        assert chunk.usage is None and chunk.choices, f"unrequested usage chunk: {chunk}"
        for choice in chunk.choices:
            if choice.delta.content:
                text.append(choice.delta.content)
            if choice.finish_reason:
                finish_reasons.append(choice.finish_reason)
    assert n > 1, "expected several chunks"
    assert "".join(text), "no streamed content"
    assert finish_reasons, "the stream never finished a choice"
    (req,) = assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/chat/completions")
    assert req.body_json["stream"] is True
    # no usage reached the client, yet the receipt has the provider's usage (the gateway asked for it)
    check_receipt(ledger, tenant, rid, req, input_tokens=MESSAGES_INPUT_TOKENS, provider="openai",
                  model=OPENAI_MODEL, endpoint="/v1/chat/completions", stream=True, price_revision=rev)


def test_chat_completion_stream_include_usage(tenant, openai_client, mock_provider, ledger):
    client = openai_client(tenant.secret)
    mark = mock_provider.mark()
    stream = client.chat.completions.create(
        model=OPENAI_MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True},
    )
    rid = assert_request_id(stream.response.headers)
    chunks = list(stream)
    text = "".join(c.delta.content or "" for ch in chunks for c in ch.choices)
    assert text, "no streamed content"
    usage_chunks = [ch for ch in chunks if ch.usage is not None]
    assert len(usage_chunks) == 1, f"expected exactly one usage chunk, got {len(usage_chunks)}"
    last = chunks[-1]
    assert last is usage_chunks[0], "the usage chunk is not the last chunk"
    assert last.choices == []
    assert last.usage.prompt_tokens > 0 and last.usage.completion_tokens > 0
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    (req,) = assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/chat/completions")
    assert req.body_json["stream_options"]["include_usage"] is True
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (MESSAGES_INPUT_TOKENS, MOCK_OUTPUT_TOKENS)
    check_receipt(ledger, tenant, rid, req, input_tokens=MESSAGES_INPUT_TOKENS, provider="openai",
                  model=OPENAI_MODEL, endpoint="/v1/chat/completions", stream=True)


def test_legacy_completion(tenant, openai_client, mock_provider, ledger):
    client = openai_client(tenant.secret)
    mark = mock_provider.mark()
    resp = client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Say hello")
    assert resp.choices and resp.choices[0].text
    (req,) = assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/completions")
    check_receipt(ledger, tenant, resp._request_id, req, input_tokens=3, provider="openai",
                  model="gpt-3.5-turbo-instruct", endpoint="/v1/completions", stream=False)


def test_legacy_completion_stream(tenant, openai_client, mock_provider, ledger):
    client = openai_client(tenant.secret)
    mark = mock_provider.mark()
    stream = client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Say hello", stream=True)
    rid = assert_request_id(stream.response.headers)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices), "no streamed text"
    assert all(c.usage is None for c in chunks), "unrequested usage reached the client"
    (req,) = assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/completions")
    check_receipt(ledger, tenant, rid, req, input_tokens=3, provider="openai",
                  model="gpt-3.5-turbo-instruct", endpoint="/v1/completions", stream=True)


def test_models_list(tenant, openai_client, mock_provider, ledger):
    client = openai_client(tenant.secret)
    mark = mock_provider.mark()
    raw = client.models.with_raw_response.list()
    rid = assert_request_id(raw.headers)
    assert list(raw.parse())
    (req,) = assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/models")
    assert req.method == "GET"
    # a free request (a read): its receipt costs nothing, and says so as the provider's figure
    (receipt,) = ledger.settle_tenant(tenant, [rid]).values()
    assert_receipt(receipt, tenant=tenant, request_id=rid, provider="openai", model=None, endpoint="/v1/models",
                   stream=False, input_tokens=0, output_tokens=0, priced=True, cost="0.00",
                   usage_source="provider")


def test_responses(tenant, openai_client, mock_provider, ledger):
    client = openai_client(tenant.secret)
    mark = mock_provider.mark()
    raw = client.responses.with_raw_response.create(model=OPENAI_MODEL, input="Say hello.")
    rid = assert_request_id(raw.headers)
    resp = raw.parse()
    assert resp.object == "response"
    assert resp.status == "completed"
    assert resp.output_text
    assert resp.usage is not None and resp.usage.input_tokens > 0 and resp.usage.output_tokens > 0
    (req,) = assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/responses")
    assert req.body_json["input"] == "Say hello."
    check_receipt(ledger, tenant, rid, req, input_tokens=3, provider="openai", model=OPENAI_MODEL,
                  endpoint="/v1/responses", stream=False)


def test_responses_stream(tenant, openai_client, mock_provider, ledger):
    client = openai_client(tenant.secret)
    mark = mock_provider.mark()
    stream = client.responses.create(model=OPENAI_MODEL, input="Say hello.", stream=True)
    rid = assert_request_id(stream.response.headers)
    events = list(stream)
    types = [e.type for e in events]
    assert types, "no events"
    assert types[0] == "response.created", types
    assert types[-1] == "response.completed", types
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas, f"no output_text deltas in {types}"
    final = events[-1].response
    assert final.status == "completed"
    assert final.output_text == deltas
    assert final.usage is not None and final.usage.output_tokens > 0
    (req,) = assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/responses")
    assert req.body_json["stream"] is True
    check_receipt(ledger, tenant, rid, req, input_tokens=3, provider="openai", model=OPENAI_MODEL,
                  endpoint="/v1/responses", stream=True)


def test_embeddings_sdk_default_base64(tenant, openai_client, mock_provider, ledger):
    client = openai_client(tenant.secret)
    mark = mock_provider.mark()
    resp = client.embeddings.create(model="text-embedding-3-small", input=["hello", "world"])
    assert len(resp.data) == 2
    for item in resp.data:
        assert isinstance(item.embedding, list) and item.embedding
        assert all(isinstance(x, float) for x in item.embedding)
    assert resp.usage.prompt_tokens > 0
    (req,) = assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/embeddings")
    # The SDK asks for base64 unless told otherwise; the gateway must not change that.
    assert req.body_json["encoding_format"] == "base64"
    check_receipt(ledger, tenant, resp._request_id, req, input_tokens=3, output_tokens=0, provider="openai",
                  model="text-embedding-3-small", endpoint="/v1/embeddings", stream=False)


def test_embeddings_float_and_base64_agree(tenant, openai_client, mock_provider, ledger):
    client = openai_client(tenant.secret)
    mark = mock_provider.mark()
    floats = client.embeddings.create(model="text-embedding-3-small", input="hello", encoding_format="float")
    assert floats.data[0].embedding and all(isinstance(x, float) for x in floats.data[0].embedding)
    decoded = client.embeddings.create(model="text-embedding-3-small", input="hello")
    # the mock's values are exact in f32, so the base64 body decodes to the same numbers, if passed intact
    assert decoded.data[0].embedding == floats.data[0].embedding
    reqs = assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/embeddings", count=2)
    assert [r.body_json["encoding_format"] for r in reqs] == ["float", "base64"]
    rids = [floats._request_id, decoded._request_id]
    receipts = ledger.settle_tenant(tenant, rids)
    for rid, req in zip(rids, reqs):
        assert mock_input_tokens(req.body_json) == 2
        assert_receipt(receipts[rid], tenant=tenant, request_id=rid, provider="openai",
                       model="text-embedding-3-small", endpoint="/v1/embeddings", stream=False,
                       input_tokens=2, output_tokens=0, cost="0.00000004")


ANTHROPIC_AUTH = pytest.mark.parametrize("auth", ["sdk", "x-api-key"])


@ANTHROPIC_AUTH
def test_anthropic_messages(tenant, anthropic_client, mock_provider, ledger, auth):
    client = anthropic_client(tenant.secret, auth=auth)
    mark = mock_provider.mark()
    raw = client.messages.with_raw_response.create(
        model=ANTHROPIC_MODEL, max_tokens=64, messages=MESSAGES,
    )
    rid = assert_request_id(raw.headers)
    msg = raw.parse()
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.content and msg.content[0].type == "text" and msg.content[0].text
    assert msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0
    (req,) = assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/messages")
    assert req.method == "POST"
    assert req.header("anthropic-version"), "anthropic-version not forwarded"
    assert req.body_json["max_tokens"] == 64
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (MESSAGES_INPUT_TOKENS, MOCK_OUTPUT_TOKENS)
    # 6 x $3/M + 5 x $15/M
    receipt = check_receipt(ledger, tenant, rid, req, input_tokens=MESSAGES_INPUT_TOKENS, provider="anthropic",
                            model=ANTHROPIC_MODEL, endpoint="/v1/messages", stream=False)
    assert receipt["cost_usd"] == "0.000093"


@ANTHROPIC_AUTH
def test_anthropic_messages_stream(tenant, anthropic_client, mock_provider, ledger, auth):
    client = anthropic_client(tenant.secret, auth=auth)
    mark = mock_provider.mark()
    with client.messages.stream(model=ANTHROPIC_MODEL, max_tokens=64, messages=MESSAGES) as stream:
        rid = assert_request_id(stream.response.headers)
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text
    assert final.content and final.content[0].text == text
    assert final.stop_reason is not None
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
    (req,) = assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/messages")
    assert req.body_json["stream"] is True
    # message_start says output_tokens 1, message_delta the final 5: the receipt has the final figure
    check_receipt(ledger, tenant, rid, req, input_tokens=MESSAGES_INPUT_TOKENS, provider="anthropic",
                  model=ANTHROPIC_MODEL, endpoint="/v1/messages", stream=True)


@ANTHROPIC_AUTH
def test_anthropic_messages_stream_raw_events(tenant, anthropic_client, mock_provider, ledger, auth):
    client = anthropic_client(tenant.secret, auth=auth)
    mark = mock_provider.mark()
    raw = client.messages.with_raw_response.create(model=ANTHROPIC_MODEL, max_tokens=64, messages=MESSAGES,
                                                   stream=True)
    rid = assert_request_id(raw.headers)
    events = list(raw.parse())
    types = [e.type for e in events]
    assert types[0] == "message_start", types
    assert types[-1] == "message_stop", types
    assert "content_block_delta" in types and "message_delta" in types
    (req,) = assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/messages")
    check_receipt(ledger, tenant, rid, req, input_tokens=MESSAGES_INPUT_TOKENS, provider="anthropic",
                  model=ANTHROPIC_MODEL, endpoint="/v1/messages", stream=True)


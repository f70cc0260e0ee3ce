"""Errors the provider answers come back through the gateway unchanged (status and body bytes).

Each is an admitted request, so it has exactly one receipt: the provider's status, no usage (none was
reported: `usage_source` "estimated", every count 0) and cost "0.00"."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from conftest import (
    ANTHROPIC_MODEL,
    ANTHROPIC_VERSION,
    OPENAI_MODEL,
    assert_forwarded_with_managed_key,
    assert_receipt,
    assert_request_id,
)

MESSAGES = [{"role": "user", "content": "hi"}]

OPENAI_ERRORS = {
    429: {"error": {"message": "Rate limit reached for gpt-4o-mini (upstream test).", "type": "requests",
                    "param": None, "code": "rate_limit_exceeded"}},
    500: {"error": {"message": "The server had an error (upstream test).", "type": "server_error", "param": None,
                    "code": None}},
    400: {"error": {"message": "Invalid value for 'temperature' (upstream test).", "type": "invalid_request_error",
                    "param": "temperature", "code": "invalid_value"}},
    # the provider's own 401 (a bad managed key) is not the gateway's refusal and must pass unchanged too
    401: {"error": {"message": "Incorrect API key provided: sk-manag***. (upstream test)",
                    "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}},
}
ANTHROPIC_ERRORS = {
    429: {"type": "error", "error": {"type": "rate_limit_error", "message": "Rate limited (upstream test)."}},
    500: {"type": "error", "error": {"type": "api_error", "message": "Internal server error (upstream test)."}},
    529: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded (upstream test)."}},
}
OPENAI_SDK_ERROR = {429: openai.RateLimitError, 500: openai.InternalServerError, 400: openai.BadRequestError,
                    401: openai.AuthenticationError}
ANTHROPIC_SDK_ERROR = {429: anthropic.RateLimitError, 500: anthropic.InternalServerError,
                       529: anthropic.InternalServerError}


def assert_error_receipts(ledger, tenant, rids: list[str], status: int, provider: str, model: str, endpoint: str,
                          stream: bool = False) -> None:
    receipts = ledger.settle_tenant(tenant, rids)
    for rid in rids:
        assert_receipt(receipts[rid], tenant=tenant, request_id=rid, provider=provider, model=model,
                       endpoint=endpoint, stream=stream, status=status, input_tokens=0, output_tokens=0,
                       cost="0.00", usage_source="estimated")


def script_error(mock_provider, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
    mock_provider.script(status=status, body=body, headers=headers or {}, times=1)


def provider_answer(mock_provider, status: int, body: dict, path: str, request: dict,
                    answer_headers: dict[str, str] | None = None) -> httpx.Response:
    """What the provider itself answers for this scripted error, asked directly (the reference bytes)."""
    script_error(mock_provider, status, body, answer_headers)
    r = mock_provider.http.post(path, **request)
    assert r.status_code == status and r.json() == body, (r.status_code, r.text)
    return r


@pytest.mark.parametrize("status", sorted(OPENAI_ERRORS))
def test_openai_provider_error_passes_unchanged(tenant, gateway, openai_client, mock_provider, ledger, status):
    body = OPENAI_ERRORS[status]
    request = {"json": {"model": OPENAI_MODEL, "messages": MESSAGES}}
    reference = provider_answer(mock_provider, status, body, "/v1/chat/completions",
                                {**request, "headers": {"Authorization": "Bearer sk-direct"}},
                                {"x-upstream-marker": "kept"})

    # raw: status, body bytes and the provider's own headers unchanged
    mark = mock_provider.mark()
    script_error(mock_provider, status, body, {"x-upstream-marker": "kept"})
    r = gateway.request("POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {tenant.secret}"},
                        **request)
    assert r.status_code == status, r.text
    assert r.content == reference.content
    assert r.headers.get("content-type") == reference.headers.get("content-type")
    assert r.headers.get("x-upstream-marker") == "kept"
    assert r.headers.get("x-request-id")
    assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/chat/completions")

    # the SDK raises the matching error, with the provider's body
    mark = mock_provider.mark()
    script_error(mock_provider, status, body)
    with pytest.raises(OPENAI_SDK_ERROR[status]) as ei:
        openai_client(tenant.secret).chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES)
    e = ei.value
    assert e.status_code == status
    assert e.response.content == reference.content
    assert e.body == body["error"]
    assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/chat/completions")
    assert_error_receipts(ledger, tenant, [assert_request_id(r.headers), assert_request_id(e.response.headers)],
                          status, "openai", OPENAI_MODEL, "/v1/chat/completions")


@pytest.mark.parametrize("status", sorted(ANTHROPIC_ERRORS))
def test_anthropic_provider_error_passes_unchanged(tenant, gateway, anthropic_client, mock_provider, ledger, status):
    body = ANTHROPIC_ERRORS[status]
    request = {"json": {"model": ANTHROPIC_MODEL, "max_tokens": 16, "messages": MESSAGES}}
    reference = provider_answer(mock_provider, status, body, "/v1/messages",
                                {**request, "headers": {"x-api-key": "sk-direct", "anthropic-version": ANTHROPIC_VERSION}})

    mark = mock_provider.mark()
    script_error(mock_provider, status, body)
    r = gateway.request("POST", "/v1/messages", headers={"x-api-key": tenant.secret, "anthropic-version": ANTHROPIC_VERSION},
                        **request)
    assert r.status_code == status, r.text
    assert r.content == reference.content
    assert r.headers.get("request-id") == f"mock-req-{len(mock_provider.requests())}", "provider request-id lost"
    assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/messages")

    mark = mock_provider.mark()
    script_error(mock_provider, status, body)
    with pytest.raises(ANTHROPIC_SDK_ERROR[status]) as ei:
        anthropic_client(tenant.secret).messages.create(model=ANTHROPIC_MODEL, max_tokens=16, messages=MESSAGES)
    e = ei.value
    assert e.status_code == status
    assert e.response.content == reference.content
    assert e.body == body
    assert_forwarded_with_managed_key(mock_provider, mark, tenant, "/v1/messages")
    assert_error_receipts(ledger, tenant, [assert_request_id(r.headers), assert_request_id(e.response.headers)],
                          status, "anthropic", ANTHROPIC_MODEL, "/v1/messages")


def test_provider_error_on_a_stream_request(tenant, openai_client, anthropic_client, mock_provider, ledger):
    """A provider error answered to a `stream: true` request is a plain error for the SDK, not a stream."""
    script_error(mock_provider, 429, OPENAI_ERRORS[429], {"retry-after": "7"})
    with pytest.raises(openai.RateLimitError) as ei:
        list(openai_client(tenant.secret).chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES, stream=True))
    assert ei.value.response.json() == OPENAI_ERRORS[429]
    assert ei.value.response.headers.get("retry-after") == "7"

    script_error(mock_provider, 529, ANTHROPIC_ERRORS[529])
    with pytest.raises(anthropic.InternalServerError) as ai:
        with anthropic_client(tenant.secret).messages.stream(model=ANTHROPIC_MODEL, max_tokens=16,
                                                             messages=MESSAGES) as s:
            s.get_final_message()
    assert ai.value.status_code == 529
    assert ai.value.response.json() == ANTHROPIC_ERRORS[529]

    # the requests asked for a stream: their receipts say so, whatever came back
    rid_openai, rid_anthropic = assert_request_id(ei.value.response.headers), assert_request_id(ai.value.response.headers)
    receipts = ledger.settle_tenant(tenant, [rid_openai, rid_anthropic])
    for rid, status, provider, model, endpoint in [
        (rid_openai, 429, "openai", OPENAI_MODEL, "/v1/chat/completions"),
        (rid_anthropic, 529, "anthropic", ANTHROPIC_MODEL, "/v1/messages"),
    ]:
        assert_receipt(receipts[rid], tenant=tenant, request_id=rid, provider=provider, model=model,
                       endpoint=endpoint, stream=True, status=status, input_tokens=0, output_tokens=0,
                       cost="0.00", usage_source="estimated")

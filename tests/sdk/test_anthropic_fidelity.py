"""Anthropic clients through the gateway: its own answers on Anthropic routes carry Anthropic's envelope
(`"type": "error"` around the contract's error object), so the Python and TypeScript Anthropic SDKs and the
Vercel AI SDK show their message; `models.list()` goes to the anthropic credential; a model allowlist's 403
reaches the SDK with its message, before the provider is called and without a receipt."""

from __future__ import annotations

import time

import anthropic
import pytest

from conftest import ANTHROPIC_MODEL, request_id, run_node

MESSAGES = [{"role": "user", "content": "Hi"}]
CAP_REACHED = {"message": "Monthly spend cap reached.", "type": "insufficient_quota", "param": None,
               "code": "budget_exceeded"}


def capped_anthropic_tenant(admin, make_tenant) -> str:
    """A tenant (openai and anthropic credentials) whose organization has an armed cap of $0."""
    tenant = make_tenant()
    r = admin.http.post(f"/orgs/{tenant.org_id}/caps",
                        json={"scope": "organization", "window": "month", "limit_usd": "0", "hard_stop": True})
    assert r.status_code == 201, r.text
    return tenant.secret


def raised_when_refused(call, status: int, deadline_s: float = 3.0, error=anthropic.APIStatusError):
    """Calls until the gateway answers `status` (a change reaches it within a second); the `error` raised."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            call()
            seen = 200
        except error as e:
            if e.status_code == status:
                return e
            seen = e.status_code
        assert time.monotonic() < deadline, f"still {seen}, wanted {status}"
        time.sleep(0.05)


def test_the_python_sdk_shows_the_message_of_a_402_on_messages(admin, make_tenant, anthropic_client):
    secret = capped_anthropic_tenant(admin, make_tenant)
    client = anthropic_client(secret)
    error = raised_when_refused(lambda: client.messages.create(model=ANTHROPIC_MODEL, max_tokens=8,
                                                               messages=MESSAGES), 402)
    assert error.body == {"type": "error", "error": CAP_REACHED}
    assert "Monthly spend cap reached." in str(error)
    headers = error.response.headers
    assert (headers["x-recovea-budget-scope"], headers["x-recovea-budget-window"]) == ("organization", "month")
    assert "retry-after" not in headers


def test_the_openai_sdk_also_shows_the_message_of_an_anthropic_shaped_refusal(admin, make_tenant, openai_client):
    """Anthropic's envelope wraps the contract's error object: a client that reads OpenAI's shape (here the
    OpenAI SDK's generic POST to the Anthropic route) finds the same message, type and code."""
    import openai

    secret = capped_anthropic_tenant(admin, make_tenant)
    client = openai_client(secret)
    body = {"model": ANTHROPIC_MODEL, "max_tokens": 8, "messages": MESSAGES}
    error = raised_when_refused(
        lambda: client.post("/messages", cast_to=object, body=body,
                            options={"headers": {"anthropic-version": "2023-06-01"}}),
        402, error=openai.APIStatusError)
    assert (error.message, error.type, error.code) == (
        "Error code: 402 - Monthly spend cap reached.", "insufficient_quota", "budget_exceeded")
    assert error.body == CAP_REACHED, "the SDK reads the error object inside Anthropic's envelope"


def test_the_python_sdk_shows_the_message_of_a_401_on_messages(anthropic_client):
    client = anthropic_client("rk_" + "0" * 44)
    with pytest.raises(anthropic.AuthenticationError) as raised:
        client.messages.create(model=ANTHROPIC_MODEL, max_tokens=8, messages=MESSAGES)
    assert raised.value.body == {"type": "error", "error": {"message": "Invalid API key.",
                                                             "type": "invalid_request_error", "param": None,
                                                             "code": "invalid_api_key"}}
    assert "Invalid API key." in str(raised.value)


def test_models_list_goes_to_the_anthropic_credential(tenant, anthropic_client, mock_provider, ledger):
    mark = mock_provider.mark()
    raw = anthropic_client(tenant.secret).models.with_raw_response.list()
    rid = request_id(raw.headers)
    assert raw.parse().data, "the mock's models came back"
    (request,) = mock_provider.since(mark)
    assert (request.method, request.path) == ("GET", "/v1/models")
    assert request.header("x-api-key") == tenant.anthropic_key
    assert request.header("authorization") is None, "the openai credential was used"
    assert request.header("anthropic-version")
    (receipt,) = ledger.settle_tenant(tenant, [rid]).values()
    assert (receipt["provider"], receipt["endpoint"]) == ("anthropic", "/v1/models"), receipt


def test_a_model_outside_the_allowlist_is_403_with_its_message(gateway, admin, tenant, anthropic_client,
                                                               mock_provider, ledger):
    r = admin.http.patch(f"/keys/{tenant.key_id}", json={"allowed_models": ["claude-haiku-*"]})
    assert r.status_code == 200 and r.json()["allowed_models"] == ["claude-haiku-*"], r.text
    # Until the list reaches the gateway a call goes through, with a receipt: those are collected.
    admitted: list[str] = []
    deadline = time.monotonic() + 3
    while True:
        r = gateway.request("POST", "/v1/messages", json={"model": ANTHROPIC_MODEL, "max_tokens": 8,
                                                          "messages": MESSAGES},
                            headers={"x-api-key": tenant.secret, "anthropic-version": "2023-06-01"})
        if r.status_code == 403:
            break
        assert r.status_code == 200 and time.monotonic() < deadline, f"{r.status_code} {r.text}"
        admitted.append(request_id(r.headers))
    client = anthropic_client(tenant.secret)
    mark = mock_provider.mark()
    with pytest.raises(anthropic.PermissionDeniedError) as raised:
        client.messages.create(model=ANTHROPIC_MODEL, max_tokens=8, messages=MESSAGES)
    assert raised.value.body == {"type": "error", "error": {
        "message": f"Model '{ANTHROPIC_MODEL}' is not allowed for this key.", "type": "permission_error",
        "param": None, "code": "model_not_allowed"}}
    assert f"Model '{ANTHROPIC_MODEL}' is not allowed for this key." in str(raised.value)
    assert mock_provider.since(mark) == [], "a refused model reached the provider"
    allowed = client.messages.with_raw_response.create(model="claude-haiku-4-5", max_tokens=8, messages=MESSAGES)
    assert allowed.parse().content
    admitted.append(request_id(allowed.headers))
    # exactly the admitted calls have receipts: none for the refusals
    ledger.settle_tenant(tenant, admitted)


def node_clients(gateway_url: str, secret: str, model: str) -> dict[str, dict]:
    """Runs tests/sdk/js/anthropic_clients.mjs: what the TypeScript SDK and the Vercel AI SDK surfaced."""
    return {line["client"]: line for line in run_node("anthropic_clients.mjs", gateway_url, secret, model)}


def test_the_typescript_sdk_and_the_vercel_ai_sdk_show_the_message_of_a_402(gateway, admin, make_tenant):
    secret = capped_anthropic_tenant(admin, make_tenant)
    deadline = time.monotonic() + 3
    while True:
        seen = node_clients(gateway.url, secret, ANTHROPIC_MODEL)
        if all(not c["ok"] for c in seen.values()) or time.monotonic() > deadline:
            break
    assert set(seen) == {"@anthropic-ai/sdk", "@ai-sdk/anthropic"}, seen
    for client, outcome in seen.items():
        assert outcome["ok"] is False and outcome["status"] == 402, (client, outcome)
        assert "Monthly spend cap reached." in outcome["message"], (client, outcome)
    # The Vercel AI SDK shows Anthropic's `error.message` itself, not the status text.
    assert seen["@ai-sdk/anthropic"]["message"] == "Monthly spend cap reached."


def test_the_typescript_sdk_and_the_vercel_ai_sdk_show_the_message_of_a_401(gateway):
    seen = node_clients(gateway.url, "rk_" + "0" * 44, ANTHROPIC_MODEL)
    for client, outcome in seen.items():
        assert outcome["ok"] is False and outcome["status"] == 401, (client, outcome)
        assert "Invalid API key." in outcome["message"], (client, outcome)
    assert seen["@ai-sdk/anthropic"]["message"] == "Invalid API key."


def test_the_typescript_clients_go_through_when_admitted(gateway, tenant):
    seen = node_clients(gateway.url, tenant.secret, ANTHROPIC_MODEL)
    assert all(outcome["ok"] for outcome in seen.values()), seen

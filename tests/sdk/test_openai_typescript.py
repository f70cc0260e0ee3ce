"""The OpenAI TypeScript SDK (`openai` on npm) through `recovea serve`, as the Python SDK's tests drive it: a
chat completion, a stream with usage and models.list, each metered exactly; and the gateway's own refusals
(401, 402, 403 `model_not_allowed`, 429), which the SDK raises as its typed errors with the gateway's status,
code and message. The calls are made by tests/sdk/js/openai_clients.mjs, one JSON line each."""

from __future__ import annotations

import time

import httpx

from conftest import (
    OPENAI_CHAT_COST,
    OPENAI_CHAT_USAGE,
    OPENAI_MODEL,
    PROPAGATION_DEADLINE_S,
    assert_no_recovea_secret,
    assert_receipt,
    random_base62,
    request_id,
    run_node,
    unique,
)

MOCK_TEXT = "This is a mock response."
CHAT = {"model": OPENAI_MODEL, "messages": [{"role": "user", "content": "Say hello"}]}


def typescript(gateway, secret: str, *calls: str, model: str = OPENAI_MODEL) -> dict[str, dict]:
    """What the TypeScript SDK surfaced of each of `calls`, by call."""
    lines = run_node("openai_clients.mjs", gateway.url, secret, model, *calls)
    assert [line["call"] for line in lines] == list(calls), lines
    return {line["call"]: line for line in lines}


def refused_until(gateway, secret: str, status: int) -> list[str]:
    """Sends the script's chat request until the gateway answers `status` (an admin change reaches it within
    the propagation deadline); the request ids it admitted meanwhile (each has a receipt)."""
    admitted: list[str] = []
    deadline = time.monotonic() + PROPAGATION_DEADLINE_S
    while True:
        r = gateway.request("POST", "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {secret}"})
        if r.status_code == status:
            return admitted
        if r.status_code == 200:
            admitted.append(request_id(r.headers))
        assert time.monotonic() < deadline, f"still {r.status_code} {r.text}, wanted {status}"
        time.sleep(0.05)


def assert_refusal(outcome: dict, status: int, sdk_class: str, error: dict) -> None:
    """The SDK raised `sdk_class` with the gateway's status, `error` object, code, type and message."""
    assert outcome["ok"] is False, outcome
    assert (outcome["status"], outcome["class"]) == (status, sdk_class), outcome
    assert outcome["error"] == error, outcome
    assert (outcome["code"], outcome["type"]) == (error["code"], error["type"]), outcome
    assert outcome["message"] == f"{status} {error['message']}", outcome
    assert outcome["request_id"].startswith("req_"), outcome


def test_chat_stream_and_models_are_metered_exactly(gateway, tenant, mock_provider, ledger):
    mock_provider.script(usage=OPENAI_CHAT_USAGE, times=2)
    mark = mock_provider.mark()
    seen = typescript(gateway, tenant.secret, "chat", "stream", "models")
    assert all(outcome["ok"] for outcome in seen.values()), seen

    chat, stream, models = seen["chat"], seen["stream"], seen["models"]
    assert chat["text"] == MOCK_TEXT and chat["usage"] == OPENAI_CHAT_USAGE, chat
    # asked for (`include_usage`): exactly one usage chunk, the provider's
    assert stream["text"] == MOCK_TEXT and stream["usage"] == [OPENAI_CHAT_USAGE], stream
    assert models["ids"] and OPENAI_MODEL in models["ids"], models

    sent = mock_provider.since(mark)
    assert [(r.method, r.path) for r in sent] == [("POST", "/v1/chat/completions")] * 2 + [("GET", "/v1/models")]
    for req in sent:
        assert req.header("authorization") == f"Bearer {tenant.openai_key}", req.headers
    assert sent[1].body_json["stream_options"] == {"include_usage": True}
    assert_no_recovea_secret(sent, tenant.secret)

    rids = [chat["request_id"], stream["request_id"], models["request_id"]]
    receipts = ledger.settle_tenant(tenant, rids)
    for rid, is_stream in zip(rids[:2], (False, True)):
        assert_receipt(receipts[rid], tenant=tenant, request_id=rid, provider="openai", model=OPENAI_MODEL,
                       endpoint="/v1/chat/completions", stream=is_stream, input_tokens=1000, output_tokens=200,
                       cached=400, reasoning=50, cost=OPENAI_CHAT_COST)
    assert_receipt(receipts[rids[2]], tenant=tenant, request_id=rids[2], provider="openai", model=None,
                   endpoint="/v1/models", stream=False, input_tokens=0, output_tokens=0, cost="0.00",
                   usage_source="provider")


def test_a_wrong_key_is_an_authentication_error_with_the_gateways_message(gateway, mock_provider):
    mark = mock_provider.mark()
    seen = typescript(gateway, "rk_" + random_base62(44), "chat", "stream", "models")
    invalid = {"message": "Invalid API key.", "type": "invalid_request_error", "param": None,
               "code": "invalid_api_key"}
    for outcome in seen.values():
        assert_refusal(outcome, 401, "AuthenticationError", invalid)
    assert mock_provider.since(mark) == [], "a refused request reached the provider"


def test_a_reached_cap_is_a_402_with_the_gateways_message_and_headers(gateway, admin, make_tenant, mock_provider,
                                                                     ledger):
    tenant = make_tenant(anthropic=False)
    r = admin.http.post(f"/orgs/{tenant.org_id}/caps",
                        json={"scope": "organization", "window": "month", "limit_usd": "0", "hard_stop": True})
    assert r.status_code == 201, r.text
    admitted = refused_until(gateway, tenant.secret, 402)
    mark = mock_provider.mark()
    seen = typescript(gateway, tenant.secret, "chat", "stream")
    reached = {"message": "Monthly spend cap reached.", "type": "insufficient_quota", "param": None,
               "code": "budget_exceeded"}
    for outcome in seen.values():
        assert_refusal(outcome, 402, "APIError", reached)
        headers = outcome["headers"]
        assert (headers["x-recovea-budget-scope"], headers["x-recovea-budget-window"]) == ("organization", "month")
        assert headers["x-should-retry"] == "false" and "retry-after" not in headers, headers
    assert mock_provider.since(mark) == [], "a refused request reached the provider"
    ledger.settle_tenant(tenant, admitted)


def test_a_model_outside_the_allowlist_is_a_permission_error(gateway, admin, make_tenant, mock_provider, ledger):
    tenant = make_tenant(anthropic=False)
    r = admin.http.patch(f"/keys/{tenant.key_id}", json={"allowed_models": ["gpt-4o"]})
    assert r.status_code == 200 and r.json()["allowed_models"] == ["gpt-4o"], r.text
    admitted = refused_until(gateway, tenant.secret, 403)
    mark = mock_provider.mark()
    seen = typescript(gateway, tenant.secret, "chat", "stream")
    not_allowed = {"message": f"Model '{OPENAI_MODEL}' is not allowed for this key.", "type": "permission_error",
                   "param": None, "code": "model_not_allowed"}
    for outcome in seen.values():
        assert_refusal(outcome, 403, "PermissionDeniedError", not_allowed)
    assert mock_provider.since(mark) == [], "a refused model reached the provider"
    allowed = typescript(gateway, tenant.secret, "chat", model="gpt-4o")["chat"]
    assert allowed["ok"] and allowed["text"] == MOCK_TEXT, allowed
    # receipts for the admitted calls alone, none for the refusals
    ledger.settle_tenant(tenant, [*admitted, allowed["request_id"]])


def test_a_rate_limited_key_is_a_rate_limit_error_that_says_when_to_retry(gateway, admin, mock_provider, ledger):
    org = admin.create_org(unique("ts-rate-org"))
    admin.put_provider(org["id"], "openai", "openai", "sk-managed-openai-ts-rate")
    key = admin.create_key(org["id"], unique("ts-rate-key"), requests_per_minute=1)
    # until the key reaches the gateway it is refused as unknown; its first request spends the minute
    deadline = time.monotonic() + PROPAGATION_DEADLINE_S
    while (r := httpx.get(f"{gateway.url}/v1/models", headers={"Authorization": f"Bearer {key['secret']}"})
           ).status_code == 401:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.05)
    assert r.status_code == 200, r.text
    mark = mock_provider.mark()
    outcome = typescript(gateway, key["secret"], "chat")["chat"]
    assert outcome["ok"] is False and outcome["status"] == 429, outcome
    wait_ms = int(outcome["headers"]["retry-after-ms"])
    assert 0 < wait_ms <= 60_000, outcome
    assert outcome["headers"]["retry-after"] == str(-(-wait_ms // 1000)), outcome
    limited = {"message": f"Rate limit reached for this key. Retry in {wait_ms} ms.", "type": "rate_limit_error",
               "param": None, "code": "rate_limit_exceeded"}
    assert_refusal(outcome, 429, "RateLimitError", limited)
    assert mock_provider.since(mark) == [], "a rate-limited request reached the provider"
    ledger.settle(org["id"], key["id"], [request_id(r.headers)])

"""Keys brought by the client (`x-recovea-key` + the client's own provider key) and missing credentials.

A request with a client-brought provider key is still admitted, so it is metered like any other; a request
refused for want of a credential (400 `provider_not_configured`) is not.
"""

from __future__ import annotations

import anthropic
import openai
import pytest

from conftest import (
    ANTHROPIC_MODEL,
    ANTHROPIC_VERSION,
    OPENAI_MODEL,
    assert_no_recovea_secret,
    assert_receipt,
    assert_request_id,
)

MESSAGES = [{"role": "user", "content": "hi"}]


AUTH_HEADERS = ("authorization", "x-api-key")


def _sent(raw, name: str) -> list[str]:
    """The values of header `name` in the request the SDK itself sent to the gateway."""
    return [v for k, v in raw.http_request.headers.multi_items() if k.lower() == name]


def _assert_client_credentials_untouched(reqs, raws, tenant, managed_key) -> None:
    assert len(reqs) == len(raws)
    for req, raw in zip(reqs, raws):
        assert _sent(raw, "x-recovea-key") == [tenant.secret]
        for name in AUTH_HEADERS:
            assert req.header_values(name) == _sent(raw, name), (
                f"{name}: provider got {req.header_values(name)}, client sent {_sent(raw, name)}"
            )
        if managed_key:
            assert managed_key not in str(req.headers), "the managed key was used for a client-brought key"
    assert_no_recovea_secret(reqs, tenant.secret)


@pytest.mark.parametrize("managed", [True, False], ids=["org-has-credentials", "org-has-none"])
def test_client_own_openai_key_passes_untouched(make_tenant, openai_client, mock_provider, ledger, managed):
    t = make_tenant(openai=managed, anthropic=managed)
    client = openai_client("sk-client-own", default_headers={"x-recovea-key": t.secret})
    mark = mock_provider.mark()
    raw = client.chat.completions.with_raw_response.create(model=OPENAI_MODEL, messages=MESSAGES)
    assert raw.parse().choices[0].message.content
    raw_stream = client.chat.completions.with_raw_response.create(model=OPENAI_MODEL, messages=MESSAGES, stream=True)
    assert list(raw_stream.parse())
    assert _sent(raw, "authorization") == ["Bearer sk-client-own"]
    reqs = mock_provider.since(mark)
    assert [r.path for r in reqs] == ["/v1/chat/completions"] * 2, [(r.method, r.path) for r in reqs]
    assert reqs[0].header_values("authorization") == ["Bearer sk-client-own"]
    _assert_client_credentials_untouched(reqs, [raw, raw_stream], t, t.openai_key)
    rids = [assert_request_id(raw.headers), assert_request_id(raw_stream.headers)]
    receipts = ledger.settle_tenant(t, rids)
    for rid, stream in zip(rids, [False, True]):
        # "hi": 1 + 1 input tokens, 5 output
        assert_receipt(receipts[rid], tenant=t, request_id=rid, provider="openai", model=OPENAI_MODEL,
                       endpoint="/v1/chat/completions", stream=stream, input_tokens=2, output_tokens=5)


@pytest.mark.parametrize("auth", ["sdk", "x-api-key"])
@pytest.mark.parametrize("managed", [True, False], ids=["org-has-credentials", "org-has-none"])
def test_client_own_anthropic_key_passes_untouched(make_tenant, anthropic_client, mock_provider, ledger, managed,
                                                   auth):
    t = make_tenant(openai=managed, anthropic=managed)
    client = anthropic_client("sk-ant-client-own", auth=auth, default_headers={"x-recovea-key": t.secret})
    mark = mock_provider.mark()
    raw = client.messages.with_raw_response.create(model=ANTHROPIC_MODEL, max_tokens=16, messages=MESSAGES)
    assert raw.parse().content
    sent = _sent(raw, "authorization") + _sent(raw, "x-api-key")
    assert sent in (["Bearer sk-ant-client-own"], ["sk-ant-client-own"]), sent
    reqs = mock_provider.since(mark)
    assert [r.path for r in reqs] == ["/v1/messages"], [(r.method, r.path) for r in reqs]
    _assert_client_credentials_untouched(reqs, [raw], t, t.anthropic_key)
    rid = assert_request_id(raw.headers)
    assert_receipt(ledger.settle_tenant(t, [rid])[rid], tenant=t, request_id=rid, provider="anthropic",
                   model=ANTHROPIC_MODEL, endpoint="/v1/messages", stream=False, input_tokens=2, output_tokens=5)


def _assert_not_configured(r, provider: str) -> None:
    assert r.status_code == 400, f"{r.status_code} {r.text}"
    assert_request_id(r.headers)
    assert r.headers.get("content-type", "").startswith("application/json")
    body = r.json()
    # on the anthropic route, Anthropic's envelope around the same error object
    if provider == "anthropic":
        assert body.pop("type") == "error", body
    assert set(body) == {"error"}
    err = body["error"]
    assert err["code"] == "provider_not_configured", body
    assert err["type"] == "invalid_request_error", body
    assert err["param"] is None, body
    assert provider in err["message"].lower(), f"the message does not name {provider}: {err['message']!r}"


def test_no_credential_is_400_provider_not_configured(make_tenant, gateway, openai_client, anthropic_client,
                                                      mock_provider, ledger):
    t = make_tenant(openai=False, anthropic=False)
    mark = mock_provider.mark()

    r = gateway.request("POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {t.secret}"},
                        json={"model": OPENAI_MODEL, "messages": MESSAGES})
    _assert_not_configured(r, "openai")
    r = gateway.request("POST", "/v1/messages", headers={"x-api-key": t.secret, "anthropic-version": ANTHROPIC_VERSION},
                        json={"model": ANTHROPIC_MODEL, "max_tokens": 16, "messages": MESSAGES})
    _assert_not_configured(r, "anthropic")

    with pytest.raises(openai.BadRequestError) as ei:
        openai_client(t.secret).chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES)
    assert ei.value.code == "provider_not_configured"
    with pytest.raises(anthropic.BadRequestError) as ai:
        anthropic_client(t.secret).messages.create(model=ANTHROPIC_MODEL, max_tokens=16, messages=MESSAGES)
    assert ai.value.body["error"]["code"] == "provider_not_configured"

    assert mock_provider.since(mark) == [], "a request without a credential reached the provider"
    assert t.probe_request_ids == []
    assert ledger.settle_tenant(t) == {}, "a provider_not_configured refusal has a receipt"


def test_only_the_unconfigured_route_is_refused(make_tenant, gateway, openai_client, anthropic_client, mock_provider,
                                                ledger):
    t = make_tenant(openai=True, anthropic=False)
    mark = mock_provider.mark()
    resp = openai_client(t.secret).chat.completions.create(model=OPENAI_MODEL, messages=MESSAGES)
    assert resp.choices
    with pytest.raises(anthropic.BadRequestError) as ai:
        anthropic_client(t.secret).messages.create(model=ANTHROPIC_MODEL, max_tokens=16, messages=MESSAGES)
    _assert_not_configured(ai.value.response, "anthropic")
    assert [r.path for r in mock_provider.since(mark)] == ["/v1/chat/completions"]
    # one receipt: the admitted chat (and the setup's openai probe), none for the refused message
    (receipt,) = ledger.settle_tenant(t, [resp._request_id]).values()
    assert receipt["endpoint"] == "/v1/chat/completions" and receipt["status"] == 200, receipt

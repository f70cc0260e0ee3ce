"""Unknown, malformed, missing, revoked and expired keys: one identical 401, and nothing forwarded."""

from __future__ import annotations

import datetime as dt
import json

import anthropic
import httpx
import openai
import pytest

from conftest import (
    ANTHROPIC_MODEL,
    ANTHROPIC_VERSION,
    OPENAI_MODEL,
    PROPAGATION_DEADLINE_S,
    assert_request_id,
    random_base62,
    unique,
    wait_admitted,
    wait_refused,
)

EXPECTED_ERROR = {
    "message": "Invalid API key.",
    "type": "invalid_request_error",
    "param": None,
    "code": "invalid_api_key",
}
VOLATILE_HEADERS = {"x-request-id", "date"}
CHAT_BODY = {"model": OPENAI_MODEL, "messages": [{"role": "user", "content": "hi"}]}
MESSAGES_BODY = {"model": ANTHROPIC_MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def stable_headers(r: httpx.Response) -> list[tuple[str, str]]:
    return sorted((k.lower(), v) for k, v in r.headers.multi_items() if k.lower() not in VOLATILE_HEADERS)


def openai_route(gateway, headers: dict[str, str]) -> httpx.Response:
    return gateway.request("POST", "/v1/chat/completions", headers=headers, json=CHAT_BODY)


def anthropic_route(gateway, headers: dict[str, str]) -> httpx.Response:
    return gateway.request("POST", "/v1/messages", headers={"anthropic-version": ANTHROPIC_VERSION, **headers},
                           json=MESSAGES_BODY)


@pytest.fixture
def revoked_secret(make_tenant, admin, gateway, openai_client, mock_provider) -> str:
    """A key that worked once, then was revoked, and the gateway refuses it."""
    t = make_tenant()
    key = admin.create_key(t.org_id, unique("to-revoke"))
    wait_admitted(gateway, key["secret"], "openai")
    mark = mock_provider.mark()
    resp = openai_client(key["secret"]).chat.completions.create(**CHAT_BODY)
    assert resp.choices, "the key did not work before its revocation"
    assert len(mock_provider.since(mark)) == 1
    revoked = admin.revoke_key(key["id"])
    assert revoked["id"] == key["id"] and revoked.get("revoked_at"), revoked
    wait_refused(gateway, key["secret"], "openai")
    wait_refused(gateway, key["secret"], "anthropic")
    return key["secret"]


@pytest.fixture
def expired_secret(make_tenant, admin, gateway) -> str:
    """A key created with `expires_at` a few seconds ahead, seen working, then refused once past it."""
    t = make_tenant()
    expires = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) + dt.timedelta(seconds=4)
    key = admin.create_key(t.org_id, unique("to-expire"), expires_at=expires.strftime("%Y-%m-%dT%H:%M:%SZ"))
    wait_admitted(gateway, key["secret"], "openai")
    # refused from the expiry on: poll through the time left, plus the usual deadline
    left = (expires - dt.datetime.now(dt.timezone.utc)).total_seconds()
    wait_refused(gateway, key["secret"], "openai", deadline_s=max(0.0, left) + PROPAGATION_DEADLINE_S)
    return key["secret"]


def test_every_bad_key_gets_the_identical_401(gateway, tenant, revoked_secret, expired_secret, mock_provider):
    unknown = "rk_" + random_base62(max(40, len(tenant.secret) - 3))
    assert unknown != tenant.secret
    cases: dict[str, httpx.Response] = {}
    mark = mock_provider.mark()

    # the openai route, key as `Authorization: Bearer`
    cases["unknown"] = openai_route(gateway, {"Authorization": f"Bearer {unknown}"})
    cases["malformed: rk_ alone"] = openai_route(gateway, {"Authorization": "Bearer rk_"})
    cases["malformed: too short"] = openai_route(gateway, {"Authorization": "Bearer rk_abc123"})
    cases["malformed: bad characters"] = openai_route(gateway, {"Authorization": "Bearer rk_" + "!-_." * 11})
    cases["malformed: real secret truncated"] = openai_route(
        gateway, {"Authorization": f"Bearer {tenant.secret[:-1]}"})
    cases["malformed: real secret with one character changed"] = openai_route(
        gateway, {"Authorization": f"Bearer {tenant.secret[:-1]}{'A' if tenant.secret[-1] != 'A' else 'B'}"})
    cases["missing"] = openai_route(gateway, {})
    cases["missing: bare Bearer"] = openai_route(gateway, {"Authorization": "Bearer"})
    cases["missing: only a provider key"] = openai_route(gateway, {"Authorization": "Bearer sk-not-recovea"})
    cases["revoked"] = openai_route(gateway, {"Authorization": f"Bearer {revoked_secret}"})
    cases["expired"] = openai_route(gateway, {"Authorization": f"Bearer {expired_secret}"})
    # the other places a key is read from
    cases["unknown in x-recovea-key"] = openai_route(gateway, {"x-recovea-key": unknown})
    cases["revoked in x-recovea-key"] = openai_route(gateway, {"x-recovea-key": revoked_secret})
    cases["malformed in x-recovea-key"] = openai_route(gateway, {"x-recovea-key": "rk_abc123"})
    # the anthropic route, key as `x-api-key`
    cases["anthropic: unknown"] = anthropic_route(gateway, {"x-api-key": unknown})
    cases["anthropic: unknown as bearer"] = anthropic_route(gateway, {"Authorization": f"Bearer {unknown}"})
    cases["anthropic: revoked as bearer"] = anthropic_route(gateway, {"Authorization": f"Bearer {revoked_secret}"})
    cases["anthropic: malformed"] = anthropic_route(gateway, {"x-api-key": "rk_abc123"})
    cases["anthropic: missing"] = anthropic_route(gateway, {})
    cases["anthropic: revoked"] = anthropic_route(gateway, {"x-api-key": revoked_secret})
    cases["anthropic: expired"] = anthropic_route(gateway, {"x-api-key": expired_secret})
    # a GET without a body
    cases["GET unknown"] = gateway.request("GET", "/v1/models", headers={"Authorization": f"Bearer {unknown}"})

    for name, r in cases.items():
        assert r.status_code == 401, f"{name}: {r.status_code} {r.text}"
        assert_request_id(r.headers)
        assert r.headers.get("content-type", "").startswith("application/json"), f"{name}: {r.headers}"
        assert r.json() == {"error": EXPECTED_ERROR}, f"{name}: {r.text}"

    ref_name, ref = next(iter(cases.items()))
    for name, r in cases.items():
        assert r.content == ref.content, f"body bytes differ: {name} {r.content!r} vs {ref_name} {ref.content!r}"
        assert stable_headers(r) == stable_headers(ref), (
            f"headers differ: {name} {stable_headers(r)} vs {ref_name} {stable_headers(ref)}"
        )

    forwarded = mock_provider.since(mark)
    assert forwarded == [], f"refused requests reached the provider: {[(f.method, f.path) for f in forwarded]}"


def test_sdks_raise_authentication_error(gateway, tenant, revoked_secret, openai_client, anthropic_client,
                                         mock_provider):
    unknown = "rk_" + random_base62(len(tenant.secret) - 3)
    reference = openai_route(gateway, {"Authorization": f"Bearer {unknown}"}).content
    assert json.loads(reference) == {"error": EXPECTED_ERROR}
    mark = mock_provider.mark()

    for label, key in [("unknown", unknown), ("malformed", "rk_abc123"), ("revoked", revoked_secret)]:
        client = openai_client(key)
        with pytest.raises(openai.AuthenticationError) as ei:
            client.chat.completions.create(**CHAT_BODY)
        e = ei.value
        assert e.status_code == 401, label
        assert e.code == "invalid_api_key" and e.type == "invalid_request_error", label
        assert e.response.content == reference, label

        with pytest.raises(openai.AuthenticationError) as ei:
            list(client.chat.completions.create(**CHAT_BODY, stream=True))
        assert ei.value.response.content == reference, label

        with pytest.raises(openai.AuthenticationError):
            client.responses.create(model=OPENAI_MODEL, input="hi")
        with pytest.raises(openai.AuthenticationError):
            client.embeddings.create(model="text-embedding-3-small", input="hi")

        for auth in ("sdk", "x-api-key"):
            aclient = anthropic_client(key, auth=auth)
            with pytest.raises(anthropic.AuthenticationError) as ai:
                aclient.messages.create(**MESSAGES_BODY)
            assert ai.value.status_code == 401, (label, auth)
            assert ai.value.response.content == reference, (label, auth)
            assert ai.value.body == {"error": EXPECTED_ERROR}, (label, auth)
            with pytest.raises(anthropic.AuthenticationError):
                with aclient.messages.stream(**MESSAGES_BODY) as s:
                    s.get_final_message()

    # the openai SDK with no key at all: its Authorization header removed
    client = openai_client("unused")
    with pytest.raises(openai.AuthenticationError) as ei:
        client.chat.completions.create(**CHAT_BODY, extra_headers={"Authorization": openai.Omit()})
    assert ei.value.response.content == reference
    assert "authorization" not in {k.lower() for k in ei.value.response.request.headers}

    forwarded = mock_provider.since(mark)
    assert forwarded == [], f"refused requests reached the provider: {[(f.method, f.path) for f in forwarded]}"

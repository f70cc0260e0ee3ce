"""The parts of the admin API the suite relies on, checked against INTERFACE.md."""

from __future__ import annotations

import httpx

from conftest import SECRET_RE, Admin, unique


def test_org_key_provider_shapes(admin: Admin, gateway):
    name = unique("shape-org")
    org = admin.create_org(name)
    assert {"id", "name", "created_at"} <= set(org) and org["name"] == name

    key = admin.create_key(org["id"], "k1")
    assert {"id", "org_id", "name", "prefix", "secret", "created_at"} <= set(key)
    assert key["org_id"] == org["id"] and key["name"] == "k1"
    assert SECRET_RE.match(key["secret"]), key["secret"]
    assert key["secret"].startswith(key["prefix"]), (key["prefix"], key["secret"])

    listed = admin.http.get(f"/orgs/{org['id']}/keys")
    assert listed.status_code == 200
    assert key["secret"] not in listed.text, "a key listing shows the secret"

    managed = "sk-managed-openai-shape-0123456789"
    p = admin.put_provider(org["id"], "openai", "openai", managed)
    assert p["name"] == "openai" and p["kind"] == "openai"
    # left out, base_url is the node's --openai-base-url: the answer shows it, or null for "the node's default"
    # (routing to it is what the other tests check)
    assert p["base_url"] in (None, gateway.mock_url, gateway.mock_url + "/"), p
    assert "key_hint" in p and managed not in str(p), "the provider key was returned"
    p = admin.put_provider(org["id"], "anthropic", "anthropic", "sk-managed-anthropic-shape-0123456789")
    assert p["base_url"] in (None, gateway.mock_url, gateway.mock_url + "/"), p


def test_bad_admin_token_is_401(gateway):
    r = httpx.post(f"{gateway.admin_url}/admin/v1/orgs", json={"name": unique("x")},
                   headers={"Authorization": "Bearer not-the-token"})
    assert r.status_code == 401
    assert set(r.json()["error"]) >= {"message", "type", "param", "code"}


def test_azure_and_gemini_credentials(admin: Admin, gateway):
    org = admin.create_org(unique("cloud-org"))
    p = admin.put_provider(org["id"], "azure", "azure_openai", "azure-key-0123456789",
                           base_url="https://my-resource.openai.azure.com/")
    assert (p["kind"], p["base_url"]) == ("azure_openai", "https://my-resource.openai.azure.com")
    p = admin.put_provider(org["id"], "gemini", "gemini", "AIza-key-0123456789")
    assert (p["kind"], p["base_url"]) == ("gemini", None)
    # Every Azure resource has its own endpoint: there is no default to fall back on.
    r = admin.http.put(f"/orgs/{org['id']}/providers/azure2", json={"kind": "azure_openai", "api_key": "k" * 20})
    assert r.status_code == 400 and "base_url" in r.json()["error"]["message"], r.text
    r = admin.http.put(f"/orgs/{org['id']}/providers/x", json={"kind": "vertex", "api_key": "k" * 20})
    assert r.status_code == 400 and "azure_openai" in r.json()["error"]["message"], r.text
    # Azure is priced as OpenAI: it has no fallback price of its own.
    fallback = {"input_per_mtok_usd": "1", "output_per_mtok_usd": "2"}
    r = admin.http.put("/fallback-prices/azure_openai", json=fallback)
    assert r.status_code == 400 and "openai" in r.json()["error"]["message"], r.text
    assert "gemini" in admin.http.get("/prices").json()["fallback"]

"""The console for a customer, in a real browser: signed in with an organization's tokens, it shows that
organization alone. A viewer reads it with no write control offered, a forged write is the API's 403,
another organization's page is the 404 of an unknown one and the operator's pages are 403; an admin
arms and raises a cap, creates and revokes a key (the gateway then refuses it), issues a token, reads
its receipts filtered and as CSV, and the audit log names its token for every change."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import httpx

from conftest import sdk
from steps import click_through, poll, session_cookie, sign_in, submit
from webdriver import Browser

SHOTS = Path(os.environ.get("RECOVEA_CONSOLE_SCREENSHOTS", sdk.REPO_ROOT / "target" / "console-screenshots"))
MODEL = "gpt-4o-mini"


def org_with_token(admin: sdk.Admin, role: str) -> tuple[dict, dict]:
    """A new organization (an unarmed monthly cap of $5 on it) and a token of `role` for it."""
    org = admin.create_org(f"Customer {uuid.uuid4().hex[:6]}")
    cap = {"scope": "organization", "window": "month", "limit_usd": "5", "hard_stop": False}
    r = admin.http.post(f"/orgs/{org['id']}/caps", json=cap)
    assert r.status_code == 201, r.text
    r = admin.http.post(f"/orgs/{org['id']}/tokens", json={"name": f"console {role}", "role": role})
    assert r.status_code == 201, r.text
    return org, r.json()


def nav_links(browser: Browser) -> list[str]:
    return [a.attribute("href") for a in browser.find_all("header.top nav a")]


def csrf(browser: Browser) -> str:
    return browser.find("form.sign-out input[name=csrf]").attribute("value")


def test_a_viewer_sees_its_organization_alone_and_changes_nothing(browser: Browser, gateway, admin) -> None:
    admin_url = gateway.admin_url
    org, token = org_with_token(admin, "viewer")
    other, _ = org_with_token(admin, "admin")
    [cap] = admin.http.get(f"/orgs/{org['id']}/caps").json()["caps"]
    [other_cap] = admin.http.get(f"/orgs/{other['id']}/caps").json()["caps"]
    key = admin.create_key(org["id"], "their key")

    sign_in(browser, admin_url, token["secret"])
    assert browser.url == f"{admin_url}/orgs/{org['id']}", "a token's visitor lands on its organization"
    assert browser.text("h1") == org["name"]
    assert browser.text("header.top .who") == "Signed in as token console viewer (viewer)"
    assert nav_links(browser) == [f"/orgs/{org['id']}"], "no operator page is offered"
    # Its spend against its cap, its cap, its key: read, with no control that would change them.
    assert browser.text("#spend .cap-bar .limit") == "$5.00"
    assert browser.text(f'.cap-row[data-cap="{cap["id"]}"] .cap-limit') == "$5.00"
    assert browser.find_all(f'.key-row[data-key="{key["id"]}"]')
    forms = [f.attribute("action") for f in browser.find_all("main form")]
    assert forms == [], f"a viewer is offered {forms}"
    assert not browser.find_all("#new-cap, #new-key, #new-token, #provider")
    browser.screenshot(SHOTS / "organization-viewer.png")

    # Its receipts and their CSV are its to read.
    click_through(browser, f"a[href='/orgs/{org['id']}/receipts']")
    assert browser.find_all("#filters") and browser.find("#csv")

    # Another organization is an unknown one; the operator's pages are refused.
    browser.go(f"{admin_url}/orgs/{other['id']}")
    assert browser.text(".form-error") == f"No organization {other['id']}."
    browser.go(f"{admin_url}/orgs/{other['id']}/receipts")
    assert browser.text(".form-error") == f"No organization {other['id']}."
    for page in ("/nodes", "/prices"):
        browser.go(f"{admin_url}{page}")
        assert browser.text(".form-error") == "Only the operator may do this.", page
    browser.go(f"{admin_url}/")
    assert browser.url == f"{admin_url}/orgs/{org['id']}"

    # A write forged with the session's own CSRF token is the API's 403 (404 for another's cap).
    cookies = {"recovea_session": session_cookie(browser)}
    with httpx.Client(base_url=admin_url, cookies=cookies) as http:
        for path, form, status in (
            (f"/caps/{cap['id']}/arm", {}, 403),
            (f"/caps/{cap['id']}", {"limit_usd": "500"}, 403),
            (f"/keys/{key['id']}/revoke", {}, 403),
            (f"/orgs/{org['id']}/keys", {"name": "forged"}, 403),
            (f"/orgs/{org['id']}/tokens", {"name": "forged", "role": "admin"}, 403),
            ("/orgs", {"name": "forged"}, 403),
            (f"/caps/{other_cap['id']}/arm", {}, 404),
        ):
            r = http.post(path, data={**form, "csrf": csrf(browser)})
            assert r.status_code == status, (path, r.status_code, r.text)
        r = http.get(f"/orgs/{other['id']}")
        assert r.status_code == 404
    after = admin.http.get(f"/caps/{cap['id']}").json()
    assert (after["hard_stop"], after["limit_usd"]) == (False, "5.00"), after
    assert admin.http.get(f"/keys/{key['id']}").json()["revoked_at"] is None
    assert [k["name"] for k in admin.http.get(f"/orgs/{org['id']}/keys").json()["keys"]] == ["their key"]


def test_an_admin_runs_its_organization_and_the_audit_names_its_token(
        browser: Browser, gateway, admin, mock_provider) -> None:
    admin_url = gateway.admin_url
    org, token = org_with_token(admin, "admin")
    org_id = org["id"]
    [cap] = admin.http.get(f"/orgs/{org_id}/caps").json()["caps"]
    # The operator sets the credential whole; the organization's admin may only replace its key.
    admin.put_provider(org_id, "openai", "openai", f"sk-managed-{uuid.uuid4().hex}")

    sign_in(browser, admin_url, token["secret"])
    assert browser.url == f"{admin_url}/orgs/{org_id}"
    assert nav_links(browser) == [f"/orgs/{org_id}"]
    assert not browser.find_all("#provider, #new-org"), "setting a credential whole is the operator's"

    # Arm the cap, then raise it.
    row = f'.cap-row[data-cap="{cap["id"]}"]'
    click_through(browser, f"{row} form[action$='/arm'] button")
    assert browser.text(f"{row} .badge") == "armed"
    browser.find(f"#{cap['id']}-limit_usd").type("12.50")
    submit(browser, f"{row} form.row")
    assert browser.text("#spend .cap-bar .limit") == "$12.50"
    assert browser.text("#spend .cap-bar .badge") == "armed"
    browser.screenshot(SHOTS / "organization-admin.png")

    # A key: its secret shown once; traffic through the gateway with it.
    browser.find("#new-key-name").type("customer key")
    submit(browser, "#new-key")
    secret = browser.text("#secret-value")
    assert re.fullmatch(r"rk_[0-9A-Za-z]{40,}", secret), secret
    key_id = next(k["id"] for k in admin.http.get(f"/orgs/{org_id}/keys").json()["keys"] if k["name"] == "customer key")
    sdk.wait_until(gateway, secret, "openai", lambda r: sdk.refusal_code(r) is None, "key reaching the gateway")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
    for _ in range(2):
        r = gateway.request("POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {secret}"}, json=body)
        assert r.status_code == 200, r.text

    # Its receipts, filtered, and the CSV of the filtered set.
    def listed() -> bool:
        browser.go(f"{admin_url}/orgs/{org_id}/receipts?model={MODEL}")
        return len(browser.find_all("table.receipts tbody tr")) == 2
    poll("the receipts in the list", listed)
    browser.find("#filters-key_id").select(key_id)
    browser.find("#filters-status").type("200")
    submit(browser, "#filters")
    assert "key_id=" in browser.url and "status=200" in browser.url
    assert len(browser.find_all("table.receipts tbody tr")) == 2
    csv = httpx.get(f"{admin_url}{browser.find('#csv').attribute('href')}",
                    cookies={"recovea_session": session_cookie(browser)})
    assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv"), csv.text
    rows = csv.text.strip().splitlines()
    assert rows[0].startswith("id,request_id,org_id,key_id,") and len(rows) == 3, rows
    assert all(f",{org_id},{key_id}," in row for row in rows[1:]), rows

    # A token for a colleague, shown once; then revoked.
    browser.go(f"{admin_url}/orgs/{org_id}")
    browser.find("#new-token-name").type("colleague")
    browser.find("#new-token-role").select("viewer")
    submit(browser, "#new-token")
    assert browser.text("#new-secret h2") == "Token colleague created"
    assert browser.text("#secret-value").startswith("rot_")
    browser.go(f"{admin_url}/orgs/{org_id}")
    [colleague] = [t for t in admin.http.get(f"/orgs/{org_id}/tokens").json()["tokens"] if t["name"] == "colleague"]
    click_through(browser, f'.token-row[data-token="{colleague["id"]}"] form[action$="/revoke"] button')
    assert "revoked" in browser.text(f'.token-row[data-token="{colleague["id"]}"] .badge.revoked')

    # Revoking the key in the console: the gateway refuses it.
    click_through(browser, f'.key-row[data-key="{key_id}"] form[action$="/revoke"] button')
    assert "revoked" in browser.text(f'.key-row[data-key="{key_id}"] .badge.revoked')
    sdk.wait_refused(gateway, secret)

    # Every change names the token that made it, through a console session.
    entries = admin.http.get(f"/orgs/{org_id}/audit").json()["entries"]
    by_token = [e for e in entries if e["actor"].get("type") == "org_token"]
    expected_actor = {"type": "org_token", "id": token["id"], "name": "console admin"}
    assert {(e["object_kind"], e["action"]) for e in by_token} >= {
        ("cap", "update"), ("key", "create"), ("key", "revoke"), ("org_token", "create"), ("org_token", "revoke")}, by_token
    for entry in by_token:
        assert entry["actor"] == expected_actor and entry["auth"] == "console_session", entry


def test_a_revoked_tokens_session_ends_and_the_sign_in_page_offers_no_sign_on_unless_configured(
        browser: Browser, gateway, admin) -> None:
    org, token = org_with_token(admin, "viewer")
    sign_in(browser, gateway.admin_url, token["secret"])
    assert browser.url == f"{gateway.admin_url}/orgs/{org['id']}"
    assert admin.http.post(f"/tokens/{token['id']}/revoke").status_code == 200
    browser.go(f"{gateway.admin_url}/orgs/{org['id']}")
    assert browser.url == f"{gateway.admin_url}/sign-in", "a revoked token's session ends at once"
    assert not browser.find_all("#sign-on"), "no single sign-on link where none is configured"

"""The console in a real browser: headless Chromium (Debian's) against the real `recovea serve` and the
mock provider. It signs in, creates an organization, a provider credential, a key and an armed cap
through the pages, sends traffic through the gateway until the cap refuses, watching the spend bar
move, revokes the key in the console and sees the gateway answer 401. Each page's screenshot goes to
target/console-screenshots/; RECOVEA_CONSOLE_SCREENSHOTS=docs/console refreshes the documentation's."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import httpx
import pytest

from conftest import sdk
from steps import click_through, poll, session_cookie, sign_in, submit
from webdriver import Browser

ADMIN_TOKEN = sdk.ADMIN_TOKEN
# A test run leaves the work tree as it was: the docs' screenshots change only when asked for.
SHOTS = Path(os.environ.get("RECOVEA_CONSOLE_SCREENSHOTS", sdk.REPO_ROOT / "target" / "console-screenshots"))
MODEL = "gpt-4o-mini"
SECRET_RE = re.compile(r"^rk_[0-9A-Za-z]{40,}$")


def test_a_wrong_token_is_told_so_and_nothing_else(browser: Browser, gateway) -> None:
    browser.go(f"{gateway.admin_url}/sign-in")
    browser.screenshot(SHOTS / "sign-in.png")
    sign_in(browser, gateway.admin_url, "not-the-admin-token")
    assert browser.url == f"{gateway.admin_url}/sign-in"
    assert browser.text(".form-error") == "Wrong token."
    assert not [c for c in browser.cookies() if c["name"] == "recovea_session"]

    r = httpx.post(f"{gateway.admin_url}/sign-in", data={"token": "not-the-admin-token"})
    assert r.status_code == 401 and "set-cookie" not in r.headers
    assert "Wrong token." in r.text and "not-the-admin-token" not in r.text


def test_sign_in_opens_a_strict_session_that_never_holds_the_token(gateway) -> None:
    r = httpx.post(f"{gateway.admin_url}/sign-in", data={"token": ADMIN_TOKEN})
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    for part in ("HttpOnly", "SameSite=Strict", "Path=/"):
        assert part in cookie, cookie
    assert ADMIN_TOKEN not in cookie and "Secure" not in cookie
    csp = r.headers["content-security-policy"]
    for directive in ("default-src 'none'", "frame-ancestors 'none'", "form-action 'self'"):
        assert directive in csp, csp
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"
    behind_tls = httpx.post(f"{gateway.admin_url}/sign-in", data={"token": ADMIN_TOKEN},
                            headers={"x-forwarded-proto": "https"})
    assert behind_tls.headers["set-cookie"].endswith("; Secure"), behind_tls.headers["set-cookie"]
    # The admin API is untouched: a session cookie is no admin token.
    session = cookie.split(";")[0].split("=", 1)[1]
    api = httpx.get(f"{gateway.admin_url}/admin/v1/orgs", cookies={"recovea_session": session})
    assert api.status_code == 401


def test_a_post_without_the_sessions_csrf_token_is_refused(browser: Browser, gateway, admin) -> None:
    sign_in(browser, gateway.admin_url)
    assert browser.url == f"{gateway.admin_url}/"
    session = session_cookie(browser)
    name = f"csrf-{uuid.uuid4().hex[:10]}"
    with httpx.Client(base_url=gateway.admin_url, cookies={"recovea_session": session}) as http:
        for form in ({"name": name}, {"name": name, "csrf": "forged"}):
            r = http.post("/orgs", data=form)
            assert r.status_code == 403, (form, r.status_code)
        assert name not in [o["name"] for o in admin.http.get("/orgs").json()["orgs"]]
        csrf = browser.find("#new-org input[name=csrf]").attribute("value")
        r = http.post("/orgs", data={"name": name, "csrf": csrf})
        assert r.status_code == 303 and r.headers["location"].startswith("/orgs/org_"), r.text
        assert name in [o["name"] for o in admin.http.get("/orgs").json()["orgs"]]
        # Signing out ends the session on the server: its cookie opens nothing afterwards.
        submit(browser, "form.sign-out")
        assert browser.url == f"{gateway.admin_url}/sign-in"
        assert http.get("/").status_code == 303
        assert http.post("/orgs", data={"name": name, "csrf": csrf}).status_code == 401


def test_the_console_runs_an_organization_from_creation_to_a_refused_cap(browser: Browser, gateway) -> None:
    admin_url = gateway.admin_url
    sign_in(browser, admin_url)

    # Prices: gpt-4o-mini at a cent a token, so that each request moves the bar by whole cents.
    browser.go(f"{admin_url}/prices")
    browser.find("#price-model").type(MODEL)
    browser.find("#price-kind").select("openai")
    browser.find("#price-input_per_mtok_usd").type("10000")
    browser.find("#price-output_per_mtok_usd").type("10000")
    submit(browser, "#price")
    assert browser.url == f"{admin_url}/prices"
    assert "override" in browser.text(f'tr[data-model="{MODEL}"]')
    browser.screenshot(SHOTS / "prices.png")

    # An organization.
    browser.go(f"{admin_url}/")
    org_name = f"Console Org {uuid.uuid4().hex[:6]}"
    browser.find("#new-org-name").type(org_name)
    submit(browser, "#new-org")
    assert re.fullmatch(rf"{re.escape(admin_url)}/orgs/org_\w+", browser.url), browser.url
    org_id = browser.url.rsplit("/", 1)[-1]
    assert browser.text("h1") == org_name
    # The console's changes are the admin API's, and so audited: as a console session's.
    audit = httpx.get(f"{admin_url}/admin/v1/audit", params={"org_id": org_id},
                      headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    assert audit.status_code == 200, audit.text
    [created] = audit.json()["entries"]
    assert (created["action"], created["object_kind"], created["auth"]) == ("create", "org", "console_session")

    # A provider credential: only its hint is shown.
    provider_key = f"sk-managed-console-{uuid.uuid4().hex}"
    browser.find("#provider-api_key").type(provider_key)
    submit(browser, "#provider")
    assert browser.text('tr[data-provider="openai"] code.hint') == "..." + provider_key[-4:]
    assert provider_key not in browser.script("return document.documentElement.outerHTML")

    # A key: the secret is on the page that answers the form, once.
    browser.find("#new-key-name").type("console key")
    submit(browser, "#new-key")
    secret = browser.text("#secret-value")
    assert SECRET_RE.match(secret), secret
    browser.go(f"{admin_url}/orgs/{org_id}")
    assert secret not in browser.script("return document.documentElement.outerHTML")

    # A refused form says what the API said, beside the field.
    browser.find("#new-cap-limit_usd").type("ten dollars")
    submit(browser, "#new-cap")
    error = browser.text("#new-cap-limit_usd-error")
    assert error.startswith("limit_usd: "), error
    assert browser.find("#new-cap-limit_usd").attribute("value") == "ten dollars"

    # An armed monthly cap of fifty cents on the organization.
    browser.find("#new-cap-limit_usd").type("0.50")
    assert browser.find("#new-cap-hard_stop").attribute("checked") is not None
    submit(browser, "#new-cap")
    assert browser.url.endswith(f"/orgs/{org_id}#caps"), browser.url
    assert browser.text("#spend .cap-bar .badge") == "armed"
    assert browser.find("#spend .cap-bar rect.fill").attribute("width") == "0"
    assert browser.text("#spend .cap-bar .limit") == "$0.50"

    # Traffic through the gateway until the cap refuses.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}]}
    headers = {"Authorization": f"Bearer {secret}"}
    sdk.wait_until(gateway, secret, "openai", lambda r: sdk.refusal_code(r) is None, "key reaching the gateway")
    admitted, refused = 0, None
    for _ in range(100):
        r = gateway.request("POST", "/v1/chat/completions", headers=headers, json=body)
        if r.status_code == 402:
            refused = r
            break
        assert r.status_code == 200, (r.status_code, r.text)
        admitted += 1
        if admitted == 1:
            # The bar moves once the first receipt is in the ledger.
            def moved() -> bool:
                browser.go(f"{admin_url}/orgs/{org_id}")
                return int(browser.find("#spend .cap-bar rect.fill").attribute("width")) > 0
            poll("the spend bar moving", moved)
            assert browser.text("#spend .cap-bar .spent") != "$0.00"
    assert refused is not None, f"the armed cap never refused ({admitted} requests admitted)"
    assert refused.json()["error"]["code"] == "budget_exceeded", refused.text
    assert admitted >= 2

    def at_the_line() -> bool:
        browser.go(f"{admin_url}/orgs/{org_id}")
        return browser.find("#spend .cap-bar rect.fill").attribute("width") == "1000"
    poll("the spend bar at the line", at_the_line)
    assert browser.text("#spend .cap-bar .projection").startswith("At the line")
    browser.go(f"{admin_url}/")
    card = f'section.org-card[data-org="{org_id}"]'
    assert browser.find(f"{card} rect.fill").attribute("width") == "1000"
    assert browser.text(f"{card} .month-spend strong") != "$0.00"
    browser.screenshot(SHOTS / "organizations.png")
    browser.screenshot(SHOTS / "organizations-390.png", width=390)
    browser.go(f"{admin_url}/orgs/{org_id}")
    browser.screenshot(SHOTS / "organization.png")
    browser.screenshot(SHOTS / "organization-390.png", width=390)

    # Receipts: the list, one receipt's exact cost, and the CSV of the filtered set.
    browser.go(f"{admin_url}/orgs/{org_id}/receipts")
    rows = browser.find_all("table.receipts tbody tr")
    assert len(rows) >= admitted, (len(rows), admitted)
    browser.screenshot(SHOTS / "receipts.png")
    # Filters: the API's own, its refusal beside the field.
    browser.find("#filters-model").type(MODEL)
    submit(browser, "#filters")
    assert len(browser.find_all("table.receipts tbody tr")) == admitted
    browser.find("#filters-status").type("two hundred")
    submit(browser, "#filters")
    assert browser.text("#filters-status-error").startswith("status: "), browser.text("main")
    browser.find("#filters-status").type("200")
    browser.find("#filters-usage_source").select("provider")
    submit(browser, "#filters")
    assert len(browser.find_all("table.receipts tbody tr")) == admitted
    assert "usage_source=provider" in browser.url and "model=" in browser.url
    csv_href = browser.find("#csv").attribute("href")
    browser.go(f"{admin_url}/orgs/{org_id}/receipts")
    click_through(browser, "table.receipts tbody tr:last-child a")
    assert "/v1/chat/completions" in browser.text("dl.detail")
    # 3 input and 5 output tokens at a cent each.
    assert browser.text("dl.detail strong.exact") == "$0.08"
    browser.screenshot(SHOTS / "receipt.png")
    csv = httpx.get(f"{admin_url}{csv_href}", cookies={"recovea_session": session_cookie(browser)})
    assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv")
    assert csv.text.startswith("id,request_id,org_id,key_id,")
    assert len(csv.text.strip().splitlines()) - 1 == admitted, "the CSV holds the filtered set"

    browser.go(f"{admin_url}/nodes")
    assert browser.text("h1") == "Nodes"
    browser.screenshot(SHOTS / "nodes.png")

    # Revoking the key in the console: the gateway answers 401 for it.
    browser.go(f"{admin_url}/orgs/{org_id}")
    click_through(browser, "#keys form[action$='/revoke'] button")
    assert "revoked" in browser.text("#keys .key-row .badge")
    sdk.wait_refused(gateway, secret)


def test_a_credentials_price_namespace_and_fallback_show_and_fallback_receipts_are_marked(
        browser: Browser, gateway, mock_provider) -> None:
    admin_url = gateway.admin_url
    sign_in(browser, admin_url)
    browser.go(f"{admin_url}/")
    browser.find("#new-org-name").type(f"Pricing Org {uuid.uuid4().hex[:6]}")
    submit(browser, "#new-org")
    org_id = browser.url.rsplit("/", 1)[-1]

    # A Groq-style credential priced in the `groq` namespace, with a fallback of its own.
    browser.find("#provider-name").type("fast")
    browser.find("#provider-base_url").type(mock_provider.url)
    browser.find("#provider-price_namespace").type("groq")
    browser.find("#provider-fallback_input_per_mtok_usd").type("0.10")
    browser.find("#provider-fallback_output_per_mtok_usd").type("0.20")
    browser.find("#provider-api_key").type(f"sk-fast-{uuid.uuid4().hex}")
    submit(browser, "#provider")
    pricing = browser.text('tr[data-provider="fast"] td.pricing')
    assert "namespace groq" in pricing and "fallback $0.10 / $0.20 per Mtok" in pricing, pricing

    browser.find("#new-key-name").type("pricing key")
    submit(browser, "#new-key")
    secret = browser.text("#secret-value")
    body = {"model": "a-model-nobody-prices", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {secret}"}
    def answered() -> bool:
        # Refused (401) until the key reaches the gateway: a refusal has no receipt.
        r = gateway.request("POST", "/fast/v1/chat/completions", headers=headers, json=body)
        assert r.status_code in (200, 401), r.text
        return r.status_code == 200
    poll("the key and credential reaching the gateway", answered)

    def listed() -> bool:
        browser.go(f"{admin_url}/orgs/{org_id}/receipts")
        return len(browser.find_all("table.receipts tbody tr")) >= 1
    poll("the receipt in the list", listed)
    badge = browser.find("table.receipts tbody tr span.badge.warn")
    assert badge.text == "fallback price"
    assert badge.attribute("title") == "No price: costed at fallback:credential"


def test_wrong_tokens_are_limited_per_address_and_the_right_one_always_signs_in(gateway) -> None:
    # Last in the file: it spends this address's allowance. Ten at once, one more every six
    # seconds: the tests before used a few, and time gave some back.
    for _ in range(20):
        r = httpx.post(f"{gateway.admin_url}/sign-in", data={"token": "not-the-admin-token"})
        if r.status_code == 429:
            break
        assert r.status_code == 401 and "Wrong token." in r.text
    else:
        pytest.fail("twenty more wrong tokens were all let through")
    assert 1 <= int(r.headers["retry-after"]) <= 6, r.headers
    assert "Too many wrong tokens from this address" in r.text and "set-cookie" not in r.headers
    # Behind a proxy every client shares one address: a guesser there must not lock the operator out.
    r = httpx.post(f"{gateway.admin_url}/sign-in", data={"token": ADMIN_TOKEN})
    assert r.status_code == 303 and "recovea_session=" in r.headers["set-cookie"], (r.status_code, r.headers)


"""Single sign-on into the console, end to end in a real browser, through a real OpenID Connect provider:
npm's `oidc-provider` (tests/oidc/provider.mjs, installed by scripts/install-oidc-provider; without
Node.js and npm these tests fail, never skip). A person signs in through the provider's own login and
consent pages: alice, her organization's admin, lands on it and her change is audited under her
subject; olga, of the operator group, gets the operator's console; nobody, whose account names no
organization, is told why; ghost, whose account names an organization this Recovea does not have, is
refused too.

The console is reached as `localhost` and the provider as `127.0.0.1`: two sites, as in production, so
that the callback is a cross-site navigation and the session cookie (`SameSite=Strict`) meets the
browser's rules for one."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterable

import httpx
import pytest

from conftest import sdk
from steps import click_through, poll, session_cookie
from webdriver import Browser

SHOTS = Path(os.environ.get("RECOVEA_CONSOLE_SCREENSHOTS", sdk.REPO_ROOT / "target" / "console-screenshots"))
CLIENT_ID = "recovea"
OPERATOR_GROUP = "recovea-operators"
# An organization id of the right shape that no organization has.
GHOST_ORG = "org_" + "0" * 22


def free_port() -> int:
    """A loopback port free now. The console's port must be known before it starts (it is in the
    redirect URL the provider is told of and the flag the console is given); the moment between this
    and the start is the only race, and nothing else on the machine picks ports from this range."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Provider:
    def __init__(self, proc: subprocess.Popen, issuer: str):
        self.proc, self.issuer = proc, issuer

    def set_accounts(self, accounts: dict) -> None:
        r = httpx.post(f"{self.issuer}/_test/accounts", content=json.dumps(accounts))
        assert r.status_code == 204, r.text


@pytest.fixture(scope="module")
def console_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def provider(console_port: int, tmp_path_factory) -> Iterable[Provider]:
    install = subprocess.run([str(sdk.REPO_ROOT / "scripts" / "install-oidc-provider")])
    assert install.returncode == 0, "scripts/install-oidc-provider failed: the sign-on tests need node and npm"
    log = tmp_path_factory.mktemp("oidc") / "provider.log"
    env = {**os.environ, "OIDC_TEST_PROVIDER": json.dumps(
        {"redirectUris": [f"http://localhost:{console_port}/console/oidc/callback"], "accounts": {}})}
    with open(log, "wb") as err:
        # Its standard input stays open while it runs: it exits when that closes.
        proc = subprocess.Popen(["node", str(sdk.REPO_ROOT / "tests" / "oidc" / "provider.mjs")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env)
    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l.decode()) for l in iter(proc.stdout.readline, b"")],
                     daemon=True).start()
    try:
        deadline = time.monotonic() + 30
        issuer = None
        while issuer is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the OpenID Connect provider did not start:\n{log.read_text(errors='replace')}",
                            pytrace=False)
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if line.startswith("issuer "):
                issuer = line.split(" ", 1)[1].strip()
        yield Provider(proc, issuer)
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def sso_gateway(mock_provider, provider: Provider, console_port: int, tmp_path_factory):
    yield from sdk.launch_serve(
        mock_provider, tmp_path_factory.mktemp("sso"), "sso gateway",
        "--oidc-issuer", provider.issuer,
        "--oidc-client-id", CLIENT_ID,
        "--oidc-client-secret", f"{CLIENT_ID}-secret",
        "--oidc-redirect-url", f"http://localhost:{console_port}/console/oidc/callback",
        "--oidc-scopes", "openid email profile recovea",
        "--oidc-org-claim", "recovea_org",
        "--oidc-role-claim", "recovea_role",
        "--oidc-operator-group", OPERATOR_GROUP,
        admin_listen=f"127.0.0.1:{console_port}")


@pytest.fixture(scope="module")
def acme(sso_gateway, provider: Provider) -> Iterable[dict]:
    """An organization in the console's store, and the provider's accounts that name it."""
    sso_admin = sdk.Admin(sso_gateway.admin_url)
    org = sso_admin.create_org("Acme by sign-on")
    cap = {"scope": "organization", "window": "month", "limit_usd": "20", "hard_stop": False}
    assert sso_admin.http.post(f"/orgs/{org['id']}/caps", json=cap).status_code == 201
    provider.set_accounts({
        "alice": {"email": "alice@acme.example", "email_verified": True, "recovea_org": org["id"],
                  "recovea_role": "admin", "groups": ["staff"]},
        "olga": {"email": "olga@operator.example", "email_verified": True, "groups": ["staff", OPERATOR_GROUP]},
        "nobody": {"email": "nobody@example.com", "email_verified": False, "groups": []},
        "ghost": {"email": "ghost@example.com", "email_verified": True, "recovea_org": GHOST_ORG,
                  "recovea_role": "admin", "groups": []},
    })
    yield {"org": org, "admin": sso_admin}
    sso_admin.http.close()


def console(sso_gateway) -> str:
    """The console as the browser reaches it: by name, another site than the provider's address."""
    port = sso_gateway.admin_url.rsplit(":", 1)[1]
    return f"http://localhost:{port}"


def sign_on(browser: Browser, sso_gateway, provider: Provider, login: str) -> None:
    """From the console's sign-in page through the provider's login and consent pages, back to the
    console: as far as the page the console answers with at the end."""
    base = console(sso_gateway)
    browser.go(f"{base}/sign-in")
    assert browser.text("#sign-on") == "Sign in with single sign-on"
    click_through(browser, "#sign-on")
    assert browser.url.startswith(f"{provider.issuer}/"), f"the provider's login page, not {browser.url}"
    browser.find("input[name=login]").type(login)
    browser.find("input[name=password]").type("any password")
    click_through(browser, "button[type=submit]")
    if browser.url.startswith(provider.issuer):
        assert browser.find_all("input[name=prompt][value=consent]"), browser.text("body")
        click_through(browser, "button[type=submit]")

    def back() -> bool:
        return browser.url.startswith(base) and "/console/oidc/callback" not in browser.url \
            or bool(browser.find_all("#sign-on-error"))
    poll("back at the console", back, deadline_s=15)


def test_alice_signs_in_through_the_provider_and_lands_on_her_organization(
        browser: Browser, sso_gateway, provider: Provider, acme) -> None:
    org = acme["org"]
    sign_on(browser, sso_gateway, provider, "alice")
    base = console(sso_gateway)
    assert browser.url == f"{base}/orgs/{org['id']}", browser.url
    assert browser.text("h1") == org["name"]
    assert browser.text("header.top .who") == "Signed in as alice@acme.example (admin)"
    assert [a.attribute("href") for a in browser.find_all("header.top nav a")] == [f"/orgs/{org['id']}"]
    browser.screenshot(SHOTS / "organization-sign-on.png")
    # The session cookie is the console's own, strict; the login cookie is gone.
    cookies = {c["name"]: c for c in browser.cookies()}
    assert cookies["recovea_session"]["sameSite"] == "Strict" and cookies["recovea_session"]["httpOnly"]
    assert "recovea_oidc" not in cookies

    # An admin's change, audited under her subject and email.
    [cap] = acme["admin"].http.get(f"/orgs/{org['id']}/caps").json()["caps"]
    click_through(browser, f'.cap-row[data-cap="{cap["id"]}"] form[action$="/arm"] button')
    assert browser.text(f'.cap-row[data-cap="{cap["id"]}"] .badge') == "armed"
    [armed] = [e for e in acme["admin"].http.get(f"/orgs/{org['id']}/audit").json()["entries"]
               if e["object_id"] == cap["id"] and e["action"] == "update"]
    assert armed["actor"] == {"type": "person", "subject": "alice", "email": "alice@acme.example"}, armed
    assert armed["auth"] == "console_session"
    # What is not hers is not reachable.
    browser.go(f"{base}/nodes")
    assert browser.text(".form-error") == "Only the operator may do this."
    with httpx.Client(base_url=sso_gateway.admin_url, cookies={"recovea_session": session_cookie(browser)}) as http:
        assert http.post("/orgs", data={"name": "hers", "csrf": "x"}).status_code == 403, "no CSRF token"


def test_olga_of_the_operator_group_gets_the_operators_console(
        browser: Browser, sso_gateway, provider: Provider, acme) -> None:
    sign_on(browser, sso_gateway, provider, "olga")
    base = console(sso_gateway)
    assert browser.url == f"{base}/", browser.url
    assert browser.text("h1") == "Organizations"
    assert browser.text("header.top .who") == "Signed in as olga@operator.example (operator)"
    hrefs = [a.attribute("href") for a in browser.find_all("header.top nav a")]
    assert hrefs == ["/", "/nodes", "/prices"], hrefs
    assert browser.find_all(f'section.org-card[data-org="{acme["org"]["id"]}"]')
    browser.go(f"{base}/nodes")
    assert browser.text("h1") == "Nodes"


def test_a_person_whose_account_reaches_nothing_is_told_why(
        driver, sso_gateway, provider: Provider, acme) -> None:
    for login, why in (
        ("nobody", 'You cannot sign in to this console: your account carries no organization (claim "recovea_org").'),
        ("ghost", "You cannot sign in to this console: your account's organization does not exist in this Recovea."),
    ):
        browser = driver.browser()  # a fresh person at the provider, too
        try:
            sign_on(browser, sso_gateway, provider, login)
            assert browser.text("#sign-on-error") == why, login
            assert GHOST_ORG not in browser.script("return document.documentElement.outerHTML"), "no claim's value"
            assert "recovea_session" not in {c["name"] for c in browser.cookies()}, login
            if login == "nobody":
                browser.screenshot(SHOTS / "sign-on-refused.png")
            browser.go(f"{console(sso_gateway)}/")
            assert browser.url == f"{console(sso_gateway)}/sign-in", "no session was opened"
        finally:
            browser.quit()


def test_a_callback_that_is_not_this_browsers_opens_nothing(sso_gateway, acme) -> None:
    r = httpx.get(f"{sso_gateway.admin_url}/console/oidc/callback", params={"code": "c", "state": "forged"})
    assert r.status_code == 400, (r.status_code, r.text)
    assert "recovea_session" not in r.headers.get("set-cookie", ""), r.headers
    assert "This sign-in has expired or was started elsewhere." in r.text


def test_logins_are_limited_per_address(sso_gateway, provider: Provider, acme) -> None:
    # Last in the file: it spends this address's allowance (thirty at once, then one every two seconds).
    for _ in range(40):
        r = httpx.get(f"{sso_gateway.admin_url}/console/oidc/login")
        if r.status_code == 429:
            break
        assert r.status_code == 302 and r.headers["location"].startswith(f"{provider.issuer}/"), r.text
        assert r.headers["set-cookie"].startswith("recovea_oidc="), r.headers
    else:
        pytest.fail("forty logins from one address were all started")
    assert 1 <= int(r.headers["retry-after"]) <= 2, r.headers
    assert "Too many sign-ins from this address" in r.text

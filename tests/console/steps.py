"""What a person does in the console, as the browser suite's tests do it: sign in, submit a form,
follow a link, wait for what the pages show. Shared by the suite's files."""

from __future__ import annotations

import os
import time

import pytest

from conftest import sdk
from webdriver import Browser

ADMIN_TOKEN = sdk.ADMIN_TOKEN
# Receipts reach the ledger from the spool within a moment; the pages read the ledger. Poll, never sleep.
LEDGER_DEADLINE_S = float(os.environ.get("RECOVEA_CONSOLE_LEDGER_DEADLINE", "20"))


def sign_in(browser: Browser, admin_url: str, token: str = ADMIN_TOKEN) -> None:
    browser.go(f"{admin_url}/")
    assert browser.url == f"{admin_url}/sign-in", "a visitor without a session is sent to the sign-in page"
    browser.find("#token").type(token)
    submit(browser, "form[action='/sign-in']")


def submit(browser: Browser, form_css: str) -> None:
    """Submits the form and waits for the page it leads to."""
    click_through(browser, f"{form_css} button[type=submit]")


def click_through(browser: Browser, css: str) -> None:
    """Clicks what `css` finds and waits for the page it leads to: WebDriver's click can return
    before the browser has left the page, and a check made then would read the old page."""
    browser.script("window.recoveaLeaving = true;")
    browser.find(css).click()

    def arrived() -> bool:
        try:
            return bool(browser.script(
                "return window.recoveaLeaving === undefined && document.readyState === 'complete';"))
        except Exception:  # the old page went away while the script ran: not there yet
            return False
    poll("the page the form leads to", arrived, deadline_s=10)


def poll(what: str, check, deadline_s: float = LEDGER_DEADLINE_S):
    deadline = time.monotonic() + deadline_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not seen after {deadline_s}s", pytrace=False)
        time.sleep(0.1)


def session_cookie(browser: Browser) -> str:
    cookies = {c["name"]: c for c in browser.cookies()}
    assert "recovea_session" in cookies, cookies
    return cookies["recovea_session"]["value"]

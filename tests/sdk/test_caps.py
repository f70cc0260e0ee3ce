"""Spend caps seen by the official openai SDK: a reached cap (402) is not retried; a cap that cannot
confirm its spend (503 with retry-after: 1) is retried, honouring the hint; soft caps never refuse."""

import json
import socket
import time

import httpx
import openai
import pytest

from conftest import ADMIN_TOKEN, Admin, launch_serve, unique

CHAT = dict(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}])


def refusals(gateway, outcome: str) -> int:
    text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(f'recovea_requests_total{{outcome="{outcome}"}} '):
            return int(line.split()[-1])
    raise AssertionError(f"no recovea_requests_total for {outcome}:\n{text}")


def capped_tenant(admin: Admin, limit_usd: str, hard_stop: bool) -> str:
    org = admin.create_org(unique("caps-org"))
    admin.put_provider(org["id"], "openai", "openai", "sk-managed-caps-0123456789")
    key = admin.create_key(org["id"], unique("caps-key"))
    r = admin.http.post(f"/orgs/{org['id']}/caps", json={"scope": "organization", "window": "month",
                                                         "limit_usd": limit_usd, "hard_stop": hard_stop})
    assert r.status_code == 201, r.text
    return key["secret"]


def eventually(call, want_status: int, deadline_s: float = 3.0):
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            call()
            status = 200
        except openai.APIStatusError as e:
            status = e.status_code
            if status == want_status:
                return e
        if status == want_status:
            return None
        assert time.monotonic() < deadline, f"still {status}, wanted {want_status}"
        time.sleep(0.05)


def test_a_reached_cap_is_402_and_the_sdk_does_not_retry_it(gateway, admin):
    secret = capped_tenant(admin, "0", hard_stop=True)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=secret, max_retries=3)
    error = eventually(lambda: client.chat.completions.create(**CHAT), 402)
    before = refusals(gateway, "budget_exceeded")
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(**CHAT)
    assert raised.value.status_code == 402
    assert refusals(gateway, "budget_exceeded") == before + 1, "a reached cap must not be retried"
    body = raised.value.response.json()
    assert body["error"] == {"message": "Monthly spend cap reached.", "type": "insufficient_quota", "param": None,
                             "code": "budget_exceeded"}
    headers = raised.value.response.headers
    assert headers["x-recovea-budget-scope"] == "organization"
    assert headers["x-recovea-budget-window"] == "month"
    assert headers["x-should-retry"] == "false"
    assert "retry-after" not in headers
    assert error is not None


def test_a_soft_cap_at_its_line_never_refuses(gateway, admin):
    secret = capped_tenant(admin, "0", hard_stop=False)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=secret, max_retries=0)
    eventually(lambda: client.chat.completions.create(**CHAT), 200)
    for _ in range(3):
        client.chat.completions.create(**CHAT)


@pytest.fixture(scope="module")
def unconfirmed_gateway(mock_provider, tmp_path_factory):
    """A `serve` whose counters can never be confirmed: its Redis is a port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    yield from launch_serve(mock_provider, tmp_path_factory.mktemp("unconfirmed"), "unconfirmed gateway",
                            "--redis-url", f"redis://127.0.0.1:{dead_port}/", "--counter-max-age", "1s")


def test_an_unconfirmable_cap_is_503_and_the_sdk_retries_it_after_retry_after(unconfirmed_gateway):
    admin = Admin(unconfirmed_gateway.admin_url, ADMIN_TOKEN)
    secret = capped_tenant(admin, "100", hard_stop=True)
    client = openai.OpenAI(base_url=f"{unconfirmed_gateway.url}/v1", api_key=secret, max_retries=2)
    eventually(lambda: openai.OpenAI(base_url=f"{unconfirmed_gateway.url}/v1", api_key=secret,
                                     max_retries=0).chat.completions.create(**CHAT), 503)
    before = refusals(unconfirmed_gateway, "budget_unverifiable")
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as raised:
        client.chat.completions.create(**CHAT)
    elapsed = time.monotonic() - started
    assert raised.value.status_code == 503
    assert refusals(unconfirmed_gateway, "budget_unverifiable") == before + 3, "one try and two retries"
    assert elapsed >= 2.0, f"two retries honouring retry-after: 1 take at least 2 s, took {elapsed:.2f}"
    response = raised.value.response
    assert response.headers["retry-after"] == "1"
    assert response.text == json.dumps({"error": {
        "message": "Monthly spend cannot be confirmed right now. Retry in a moment.",
        "type": "insufficient_quota", "param": None, "code": "budget_unverifiable"}}, indent=2)

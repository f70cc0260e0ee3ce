"""Realtime over WebSocket through the official openai SDK's realtime client: the upgrade is
forwarded, each `response.done` is metered as it arrives (text, audio and cached tokens at their
own prices), and an armed cap at its line cuts the session at the client's next `response.create`
with the contract's `error` event and a 1008 close."""

import time

import httpx
import openai
import pytest

from conftest import unique

MODEL = "gpt-realtime"


def queue_usage(mock_provider, *usages: dict) -> None:
    r = httpx.post(f"{mock_provider.url}/__mock/realtime/usage", json=list(usages), timeout=5)
    assert r.status_code == 204, r.text


def usage(text_in=0, audio_in=0, cached_text=0, cached_audio=0, text_out=0, audio_out=0) -> dict:
    return {
        "total_tokens": text_in + audio_in + text_out + audio_out,
        "input_tokens": text_in + audio_in,
        "output_tokens": text_out + audio_out,
        "input_token_details": {
            "text_tokens": text_in, "audio_tokens": audio_in, "image_tokens": 0,
            "cached_tokens": cached_text + cached_audio,
            "cached_tokens_details": {"text_tokens": cached_text, "audio_tokens": cached_audio, "image_tokens": 0},
        },
        "output_token_details": {"text_tokens": text_out, "audio_tokens": audio_out},
    }


def tenant_with_cap(admin, limit_usd: str | None):
    org = admin.create_org(unique("rt-org"))
    admin.put_provider(org["id"], "openai", "openai", "sk-managed-realtime-0123456789")
    key = admin.create_key(org["id"], unique("rt-key"))
    if limit_usd is not None:
        r = admin.http.post(f"/orgs/{org['id']}/caps", json={
            "scope": "organization", "window": "month", "limit_usd": limit_usd, "hard_stop": True})
        assert r.status_code == 201, r.text
    return org["id"], key


def receipts_of(admin, org_id: str, key_id: str, count: int, deadline_s: float = 5.0) -> list[dict]:
    deadline = time.monotonic() + deadline_s
    while True:
        r = admin.http.get(f"/orgs/{org_id}/receipts", params={"key_id": key_id})
        assert r.status_code == 200, r.text
        found = r.json()["receipts"]
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"{len(found)} of {count} receipts"
        time.sleep(0.05)


def test_each_response_of_a_session_is_metered_at_text_and_audio_prices(gateway, admin, mock_provider):
    org_id, key = tenant_with_cap(admin, None)
    queue_usage(mock_provider,
                usage(text_in=1_000, audio_in=9_000, cached_text=500, cached_audio=1_000, text_out=2_000, audio_out=9_000),
                usage(text_in=10, text_out=5))
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key["secret"])
    done = 0
    with client.realtime.connect(model=MODEL) as connection:
        for _ in range(2):
            connection.response.create()
            for event in connection:
                if event.type == "response.done":
                    done += 1
                    break
    assert done == 2
    receipts = receipts_of(admin, org_id, key["id"], 2)
    costs = sorted(r["cost_usd"] for r in receipts)
    # gpt-realtime: $4 / $16 text, $32 / $64 audio, $0.40 cached text and audio:
    # 500 x 4 + 500 x 0.4 + 8,000 x 32 + 1,000 x 0.4 + 2,000 x 16 + 9,000 x 64 per million = $0.8666;
    # and 10 x 4 + 5 x 16 per million = $0.00012.
    assert costs == ["0.00012", "0.8666"]
    audio = next(r for r in receipts if r["cost_usd"] == "0.8666")
    assert (audio["audio_input_tokens"], audio["cached_audio_input_tokens"], audio["audio_output_tokens"]) == (9_000, 1_000, 9_000)
    assert audio["endpoint"] == "/v1/realtime" and audio["model"] == MODEL


def test_at_the_line_the_next_response_create_gets_the_error_event_and_a_1008_close(gateway, admin, mock_provider):
    org_id, key = tenant_with_cap(admin, "1.00")
    # 16,000 audio tokens out at $64 per million: $1.024, past the line.
    queue_usage(mock_provider, usage(audio_in=1_000, audio_out=16_000))
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key["secret"])
    events = []
    closed = None
    with client.realtime.connect(model=MODEL) as connection:
        connection.response.create()
        for event in connection:
            if event.type == "response.done":
                break
        receipts_of(admin, org_id, key["id"], 1)
        connection.response.create()
        try:
            for event in connection:
                events.append(event)
        except Exception as e:  # the socket closes under the iteration
            closed = e
    errors = [e for e in events if e.type == "error"]
    assert len(errors) == 1, events
    error = errors[0].error
    assert (error.type, error.code, error.message, error.param) == (
        "insufficient_quota", "budget_exceeded", "Monthly spend cap reached.", None)
    assert closed is not None and closed.rcvd is not None, closed
    assert closed.rcvd.code == 1008, closed
    with pytest.raises(Exception):
        with client.realtime.connect(model=MODEL) as connection:
            connection.response.create()
            next(iter(connection))

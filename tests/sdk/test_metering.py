"""Metering: one receipt per admitted request, with the provider's usage and the exact cost.

The mock's usage is replaced verbatim by a scripted `usage` (POST /__mock/script) to bring cached, cache-write
and reasoning tokens in. Prices are per million tokens; expected costs are computed with `Decimal`, rounded
once (half up) to the nano-dollar. Price overrides change the global table: each test that sets one uses a
model no other test uses, and waits until the serving gateway prices with the new revision.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import httpx
import openai
import pytest

from conftest import (
    ANTHROPIC_MODEL,
    ANTHROPIC_VERSION,
    BUILTIN_PRICES,
    MOCK_OUTPUT_TOKENS,
    OPENAI_CHAT_COST,
    OPENAI_CHAT_USAGE,
    OPENAI_MODEL,
    PROPAGATION_DEADLINE_S,
    RECEIPT_FIELDS,
    Price,
    assert_receipt,
    assert_request_id,
    expected_cost,
    format_usd,
    mock_input_tokens,
    parse_time,
    refusal_code,
    request_id,
    unique,
    utcnow,
    wait_admitted,
)

CHAT = [{"role": "user", "content": "Say hello"}]
CHAT_INPUT_TOKENS = 3  # 1 + "Say hello"

RESPONSES_USAGE = {  # 2000 input of which 1500 cached; 300 output of which 120 reasoning
    "input_tokens": 2000, "input_tokens_details": {"cached_tokens": 1500},
    "output_tokens": 300, "output_tokens_details": {"reasoning_tokens": 120}, "total_tokens": 2300,
}
# gpt-4o-mini: 500 x 0.15 + 1500 x 0.075 + 300 x 0.6 per M = (75 + 112.5 + 180) / 1e6
RESPONSES_COST = "0.0003675"

ANTHROPIC_USAGE = {"input_tokens": 100, "cache_creation_input_tokens": 20, "cache_read_input_tokens": 300,
                   "output_tokens": 40}
HAIKU = "claude-haiku-4-5"
# claude-haiku-4-5: 100 x 1 + 300 x 0.1 + 20 x 1.25 + 40 x 5 per M = (100 + 30 + 25 + 200) / 1e6
ANTHROPIC_COST = "0.000355"


def unique_model(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# --------------------------------------------------------------------------------------------------
# Provider usage with cached, cache-write and reasoning tokens
# --------------------------------------------------------------------------------------------------


def test_openai_chat_cached_and_reasoning_tokens(tenant, openai_client, mock_provider, ledger):
    """Plain, streamed without usage for the client (the gateway must get it anyway, and hide it), streamed
    with `include_usage` and with `include_usage: false`: the same provider usage, the same cost."""
    client = openai_client(tenant.secret)
    mock_provider.script(usage=OPENAI_CHAT_USAGE, times=4)
    t0, rev = utcnow(), ledger.price_revision()

    raw = client.chat.completions.with_raw_response.create(model=OPENAI_MODEL, messages=CHAT)
    resp = raw.parse()
    assert resp.usage.prompt_tokens == 1000 and resp.usage.prompt_tokens_details.cached_tokens == 400
    rids = [assert_request_id(raw.headers)]

    for stream_options in (None, {"include_usage": False}, {"include_usage": True}):
        kw = {"stream_options": stream_options} if stream_options is not None else {}
        stream = client.chat.completions.create(model=OPENAI_MODEL, messages=CHAT, stream=True, **kw)
        rids.append(assert_request_id(stream.response.headers))
        chunks = list(stream)
        assert "".join(c.delta.content or "" for ch in chunks for c in ch.choices), "no streamed content"
        usage = [ch.usage for ch in chunks if ch.usage is not None]
        if stream_options and stream_options["include_usage"]:
            assert len(usage) == 1 and chunks[-1].usage is usage[0], f"{len(usage)} usage chunks"
            assert usage[0].prompt_tokens == 1000 and usage[0].completion_tokens_details.reasoning_tokens == 50
        else:
            assert usage == [], f"the client did not ask for usage, yet got {usage}"

    receipts = ledger.settle_tenant(tenant, rids)
    for rid, stream in zip(rids, [False, True, True, True]):
        assert_receipt(receipts[rid], tenant=tenant, request_id=rid, provider="openai", model=OPENAI_MODEL,
                       endpoint="/v1/chat/completions", stream=stream, input_tokens=1000, output_tokens=200,
                       cached=400, reasoning=50, cost=OPENAI_CHAT_COST, price_revision=rev, not_before=t0)
    assert expected_cost(BUILTIN_PRICES[OPENAI_MODEL], 1000, 200, cached=400) == OPENAI_CHAT_COST


def test_openai_responses_cached_and_reasoning_tokens(tenant, openai_client, mock_provider, ledger):
    client = openai_client(tenant.secret)
    mock_provider.script(usage=RESPONSES_USAGE, times=2)
    raw = client.responses.with_raw_response.create(model=OPENAI_MODEL, input="Say hello.")
    assert raw.parse().usage.output_tokens_details.reasoning_tokens == 120
    stream = client.responses.create(model=OPENAI_MODEL, input="Say hello.", stream=True)
    events = list(stream)
    assert events[-1].type == "response.completed" and events[-1].response.usage.input_tokens == 2000
    rids = [assert_request_id(raw.headers), assert_request_id(stream.response.headers)]
    receipts = ledger.settle_tenant(tenant, rids)
    for rid, is_stream in zip(rids, [False, True]):
        assert_receipt(receipts[rid], tenant=tenant, request_id=rid, provider="openai", model=OPENAI_MODEL,
                       endpoint="/v1/responses", stream=is_stream, input_tokens=2000, output_tokens=300,
                       cached=1500, reasoning=120, cost=RESPONSES_COST)
    assert expected_cost(BUILTIN_PRICES[OPENAI_MODEL], 2000, 300, cached=1500) == RESPONSES_COST


@pytest.mark.parametrize("auth", ["sdk", "x-api-key"])
def test_anthropic_cache_read_and_write_tokens(tenant, anthropic_client, mock_provider, ledger, auth):
    """`input_tokens` of the receipt = input + cache reads + cache writes; streamed, the usage comes in both
    `message_start` and `message_delta` and must be counted once."""
    client = anthropic_client(tenant.secret, auth=auth)
    mock_provider.script(usage=ANTHROPIC_USAGE, times=3)
    raw = client.messages.with_raw_response.create(model=HAIKU, max_tokens=64, messages=CHAT)
    msg = raw.parse()
    assert (msg.usage.input_tokens, msg.usage.cache_read_input_tokens) == (100, 300)
    with client.messages.stream(model=HAIKU, max_tokens=64, messages=CHAT) as stream:
        rid_stream = assert_request_id(stream.response.headers)
        final = stream.get_final_message()
    assert final.usage.output_tokens == 40
    raw_events = client.messages.with_raw_response.create(model=HAIKU, max_tokens=64, messages=CHAT, stream=True)
    types = [e.type for e in raw_events.parse()]
    assert types[0] == "message_start" and "message_delta" in types, types
    rids = [assert_request_id(raw.headers), rid_stream, assert_request_id(raw_events.headers)]
    receipts = ledger.settle_tenant(tenant, rids)
    for rid, is_stream in zip(rids, [False, True, True]):
        assert_receipt(receipts[rid], tenant=tenant, request_id=rid, provider="anthropic", model=HAIKU,
                       endpoint="/v1/messages", stream=is_stream, input_tokens=420, output_tokens=40, cached=300,
                       cache_write=20, cost=ANTHROPIC_COST)
    assert expected_cost(BUILTIN_PRICES[HAIKU], 420, 40, cached=300, cache_write=20) == ANTHROPIC_COST


def test_endpoint_is_the_path_without_query_and_provider_the_credential_name(make_tenant, admin, gateway, ledger,
                                                                             mock_provider):
    t = make_tenant()
    name = "sdkcred" + uuid.uuid4().hex[:8]
    admin.put_provider(t.org_id, name, "openai", f"sk-managed-{name}")
    headers = {"Authorization": f"Bearer {t.secret}"}
    body = {"model": OPENAI_MODEL, "messages": CHAT}
    # the new credential reaches the gateway within the propagation deadline
    deadline = time.monotonic() + PROPAGATION_DEADLINE_S
    rids = []
    while True:
        # a fresh connection each: see test_a_refusal_keeps_its_connection_usable_or_says_close
        r = httpx.post(f"{gateway.url}/{name}/v1/chat/completions?probe=1", headers=headers, json=body, timeout=10)
        if refusal_code(r) is None:
            break
        assert time.monotonic() < deadline, f"credential {name} not served: {r.status_code} {r.text}"
        time.sleep(0.05)
    assert r.status_code == 200, r.text
    rids.append(request_id(r.headers))
    mark = mock_provider.mark()
    r2 = gateway.request("POST", "/v1/chat/completions?api-version=2&x=y", headers=headers, json=body)
    assert r2.status_code == 200, r2.text
    rids.append(request_id(r2.headers))
    assert [q.path for q in mock_provider.since(mark)] == ["/v1/chat/completions?api-version=2&x=y"]
    receipts = ledger.settle_tenant(t, rids)
    for rid, provider in zip(rids, [name, "openai"]):
        assert_receipt(receipts[rid], tenant=t, request_id=rid, provider=provider, model=OPENAI_MODEL,
                       endpoint="/v1/chat/completions", stream=False, input_tokens=CHAT_INPUT_TOKENS,
                       output_tokens=MOCK_OUTPUT_TOKENS)


# --------------------------------------------------------------------------------------------------
# Exactly one receipt per admitted request
# --------------------------------------------------------------------------------------------------


def test_concurrent_requests_get_one_receipt_each(tenant, openai_client, anthropic_client, ledger):
    oc, ac = openai_client(tenant.secret), anthropic_client(tenant.secret)

    def chat(_):
        raw = oc.chat.completions.with_raw_response.create(model=OPENAI_MODEL, messages=CHAT)
        assert raw.parse().choices
        return assert_request_id(raw.headers), "/v1/chat/completions", False

    def chat_stream(_):
        stream = oc.chat.completions.create(model=OPENAI_MODEL, messages=CHAT, stream=True)
        assert list(stream)
        return assert_request_id(stream.response.headers), "/v1/chat/completions", True

    def message(_):
        raw = ac.messages.with_raw_response.create(model=ANTHROPIC_MODEL, max_tokens=16, messages=CHAT)
        assert raw.parse().content
        return assert_request_id(raw.headers), "/v1/messages", False

    calls = [chat, chat_stream, message] * 8
    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(lambda f: f(None), calls))
    rids = [r[0] for r in results]
    assert len(set(rids)) == len(calls), "request ids are not unique"
    receipts = ledger.settle_tenant(tenant, rids)
    for rid, endpoint, is_stream in results:
        anthropic = endpoint == "/v1/messages"
        assert_receipt(receipts[rid], tenant=tenant, request_id=rid, provider="anthropic" if anthropic else "openai",
                       model=ANTHROPIC_MODEL if anthropic else OPENAI_MODEL, endpoint=endpoint, stream=is_stream,
                       input_tokens=CHAT_INPUT_TOKENS, output_tokens=MOCK_OUTPUT_TOKENS)


def test_sdk_retry_after_a_provider_500_is_two_receipts(tenant, openai_client, mock_provider, ledger):
    """The SDK retries a 500 by itself: two admitted requests, two receipts (the 500 costs nothing)."""
    client = openai_client(tenant.secret, max_retries=1)
    mock_provider.script(status=500, headers={"retry-after-ms": "10"})
    raw = client.chat.completions.with_raw_response.create(model=OPENAI_MODEL, messages=CHAT)
    assert raw.retries_taken == 1
    rid = assert_request_id(raw.headers)
    deadline = time.monotonic() + 5
    while True:
        got = [r for r in ledger.receipts(tenant.org_id, key_id=tenant.key_id)
               if r["request_id"] not in tenant.probe_request_ids]
        if len(got) >= 2 and ledger.pending() == 0:
            break
        assert time.monotonic() < deadline, f"expected 2 receipts, got {got}"
        time.sleep(0.05)
    assert len(got) == 2, got
    first, second = got  # oldest first
    assert second["request_id"] == rid, got
    assert first["request_id"] != rid and first["request_id"].startswith("req_"), got
    ledger.settle_tenant(tenant, [first["request_id"], rid])
    assert_receipt(first, tenant=tenant, request_id=first["request_id"], provider="openai", model=OPENAI_MODEL,
                   endpoint="/v1/chat/completions", stream=False, status=500, input_tokens=0, output_tokens=0,
                   cost="0.00", usage_source="estimated")
    assert_receipt(second, tenant=tenant, request_id=rid, provider="openai", model=OPENAI_MODEL,
                   endpoint="/v1/chat/completions", stream=False, input_tokens=CHAT_INPUT_TOKENS,
                   output_tokens=MOCK_OUTPUT_TOKENS)


def test_refused_requests_have_no_receipt(make_tenant, gateway, openai_client, anthropic_client, mock_provider,
                                          ledger):
    """401 (unknown or mangled key) and 400 `provider_not_configured`: nothing in the org's receipts but the
    admitted requests."""
    t = make_tenant(openai=True, anthropic=False)
    ok = openai_client(t.secret).chat.completions.create(model=OPENAI_MODEL, messages=CHAT)
    mark = mock_provider.mark()
    refused = []
    for secret in (t.secret[:-1], "rk_" + "A" * 40):
        with pytest.raises(openai.AuthenticationError) as ei:
            openai_client(secret).chat.completions.create(model=OPENAI_MODEL, messages=CHAT)
        refused.append(assert_request_id(ei.value.response.headers))
    for _ in range(3):  # a fresh connection each: see test_a_refusal_keeps_its_connection_usable_or_says_close
        r = httpx.post(f"{gateway.url}/v1/messages", headers={"x-api-key": t.secret, "anthropic-version": ANTHROPIC_VERSION},
                       json={"model": ANTHROPIC_MODEL, "max_tokens": 16, "messages": CHAT})
        assert refusal_code(r) == "provider_not_configured", r.text
        refused.append(request_id(r.headers))
    assert mock_provider.since(mark) == []
    ledger.settle_tenant(t, [ok._request_id])
    org_wide = ledger.receipts(t.org_id)
    assert sorted(r["request_id"] for r in org_wide) == sorted([ok._request_id, *t.probe_request_ids]), org_wide
    assert not set(refused) & {r["request_id"] for r in org_wide}


def test_stream_cut_by_the_provider_has_one_receipt(tenant, openai_client, mock_provider, ledger):
    client = openai_client(tenant.secret)
    mock_provider.script(cut_after_events=3)
    stream = client.chat.completions.create(model=OPENAI_MODEL, messages=CHAT, stream=True)
    rid = assert_request_id(stream.response.headers)
    with pytest.raises(Exception):
        list(stream)
    (receipt,) = ledger.settle_tenant(tenant, [rid]).values()
    # no usage arrived: estimated from what was seen, and still priced
    assert (receipt["status"], receipt["stream"], receipt["usage_source"], receipt["priced"]) == (
        200, True, "estimated", True), receipt
    assert receipt["model"] == OPENAI_MODEL and receipt["endpoint"] == "/v1/chat/completions", receipt


def test_client_gone_mid_stream_has_one_receipt(tenant, gateway, mock_provider, ledger):
    mock_provider.script(chunk_delay_ms=150)
    with httpx.Client(base_url=gateway.url, timeout=10) as c:
        with c.stream("POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {tenant.secret}"},
                      json={"model": OPENAI_MODEL, "messages": CHAT, "stream": True}) as r:
            assert r.status_code == 200
            rid = request_id(r.headers)
            next(r.iter_lines())
    (receipt,) = ledger.settle_tenant(tenant, [rid]).values()
    assert (receipt["status"], receipt["stream"], receipt["model"]) == (200, True, OPENAI_MODEL), receipt


# --------------------------------------------------------------------------------------------------
# Prices: overrides, revisions, unpriced models, rounding
# --------------------------------------------------------------------------------------------------


def test_builtin_prices_of_the_suites_models(ledger):
    table = ledger.prices()["prices"]
    for model, price in BUILTIN_PRICES.items():
        if model == "gpt-4o":
            continue  # overridden by test_price_override_changes_the_next_cost (checked there first)
        got = table.get(model)
        assert got is not None, f"no built-in price for {model}"
        assert Decimal(got["input_per_mtok_usd"]) == Decimal(price.input), (model, got)
        assert Decimal(got["output_per_mtok_usd"]) == Decimal(price.output), (model, got)
        for key, want in (("cached_input_per_mtok_usd", price.cached),
                          ("cache_write_per_mtok_usd", price.cache_write)):
            assert (Decimal(got[key]) if got.get(key) is not None else None) == (
                Decimal(want) if want is not None else None), (model, key, got)


class PriceWatcher:
    """Tells when the serving gateway prices with a given revision: a key of its own makes requests until
    one's receipt carries the revision (the suite's test keys never see these requests)."""

    def __init__(self, tenant, admin, gateway, ledger):
        self.org_id, self.gateway, self.ledger = tenant.org_id, gateway, ledger
        key = admin.create_key(tenant.org_id, unique("price-watch"))
        self.key_id, self.secret, self.rids = key["id"], key["secret"], []
        wait_admitted(gateway, self.secret, "openai", admitted=self.rids)

    def wait_for(self, revision: int) -> None:
        deadline = time.monotonic() + PROPAGATION_DEADLINE_S + 2
        while True:
            r = self.gateway.request("POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {self.secret}"},
                                     json={"model": OPENAI_MODEL, "messages": CHAT})
            assert r.status_code == 200, r.text
            rid = request_id(r.headers)
            self.rids.append(rid)
            seen = self.ledger.settle(self.org_id, self.key_id, self.rids)[rid]["price_revision"]
            if seen >= revision:
                return
            assert time.monotonic() < deadline, f"the gateway still prices with revision {seen}, not {revision}"


def test_price_override_changes_the_next_cost(tenant, admin, gateway, openai_client, mock_provider, ledger):
    model = "gpt-4o"  # no other test uses it
    builtin = BUILTIN_PRICES[model]
    listed = ledger.prices()
    assert Decimal(listed["prices"][model]["input_per_mtok_usd"]) == Decimal(builtin.input), listed["prices"][model]
    rev0 = listed["revision"]
    watcher = PriceWatcher(tenant, admin, gateway, ledger)
    client = openai_client(tenant.secret)

    mock_provider.script(usage=OPENAI_CHAT_USAGE)
    before = client.chat.completions.create(model=model, messages=CHAT)

    override = Price("4.2", "17.3")  # no cached price: cached input is billed at the input price
    put = ledger.put_price(model, override)
    assert isinstance(put.get("revision"), int) and put["revision"] > rev0, put
    rev1 = put["revision"]
    listed = ledger.prices()
    assert listed["revision"] == rev1, listed["revision"]
    assert Decimal(listed["prices"][model]["input_per_mtok_usd"]) == Decimal("4.2")
    assert Decimal(listed["prices"][model]["output_per_mtok_usd"]) == Decimal("17.3")
    watcher.wait_for(rev1)

    mock_provider.script(usage=OPENAI_CHAT_USAGE)
    after = client.chat.completions.create(model=model, messages=CHAT)

    receipts = ledger.settle_tenant(tenant, [before._request_id, after._request_id])
    common = dict(tenant=tenant, provider="openai", model=model, endpoint="/v1/chat/completions", stream=False,
                  input_tokens=1000, output_tokens=200, cached=400, reasoning=50)
    # 600 x 2.5 + 400 x 1.25 + 200 x 10 per M; the receipt written before the override keeps its cost
    assert_receipt(receipts[before._request_id], request_id=before._request_id, cost="0.004",
                   price_revision=rev0, **common)
    # 1000 x 4.2 + 200 x 17.3 per M
    assert_receipt(receipts[after._request_id], request_id=after._request_id, cost="0.00766",
                   price_revision=rev1, **common)
    assert expected_cost(override, 1000, 200, cached=400) == "0.00766"


def test_unpriced_model_then_priced(tenant, admin, gateway, openai_client, ledger):
    model = unique_model("sdk-unpriced")
    client = openai_client(tenant.secret)
    rev0 = ledger.price_revision()
    unpriced = client.chat.completions.create(model=model, messages=CHAT)
    assert unpriced.model == model

    price = Price("0.5", "1.5", "0.25")
    rev1 = ledger.put_price(model, price)["revision"]
    assert rev1 > rev0
    PriceWatcher(tenant, admin, gateway, ledger).wait_for(rev1)
    priced = client.chat.completions.create(model=model, messages=CHAT)

    receipts = ledger.settle_tenant(tenant, [unpriced._request_id, priced._request_id])
    common = dict(tenant=tenant, provider="openai", model=model, endpoint="/v1/chat/completions", stream=False,
                  input_tokens=CHAT_INPUT_TOKENS, output_tokens=MOCK_OUTPUT_TOKENS)
    # usage is still the provider's; the cost is unknown, so never free: the kind's fallback price
    fallback = ledger.fallback_price("openai")
    assert_receipt(receipts[unpriced._request_id], request_id=unpriced._request_id, priced=False, price=fallback,
                   priced_as="fallback:openai", price_revision=rev0, **common)
    # 3 x 0.5 + 5 x 1.5 per M
    assert_receipt(receipts[priced._request_id], request_id=priced._request_id, price=price, cost="0.000009",
                   priced_as=model, price_revision=rev1, **common)


def test_cost_is_rounded_once_to_the_nano_dollar(tenant, admin, gateway, anthropic_client, mock_provider, ledger):
    """7 plain + 3 cache reads + 2 cache writes + 11 output at these prices is 12234.56787 nano-dollars:
    rounded once, 12235; rounding each term first would give 12234, and so would truncating."""
    model = unique_model("sdk-rounding")
    price = Price("0.123456789", "0.987654321", "0.012345678", "0.234567891")
    rev = ledger.put_price(model, price)["revision"]
    PriceWatcher(tenant, admin, gateway, ledger).wait_for(rev)
    mock_provider.script(usage={"input_tokens": 7, "cache_read_input_tokens": 3, "cache_creation_input_tokens": 2,
                                "output_tokens": 11})
    raw = anthropic_client(tenant.secret).messages.with_raw_response.create(model=model, max_tokens=16,
                                                                            messages=CHAT)
    rid = assert_request_id(raw.headers)
    receipt = ledger.settle_tenant(tenant, [rid])[rid]
    assert expected_cost(price, 12, 11, cached=3, cache_write=2) == "0.000012235"
    assert_receipt(receipt, tenant=tenant, request_id=rid, provider="anthropic", model=model, endpoint="/v1/messages",
                   stream=False, input_tokens=12, output_tokens=11, cached=3, cache_write=2, price=price,
                   cost="0.000012235", price_revision=rev)


# --------------------------------------------------------------------------------------------------
# Listing, CSV and summary
# --------------------------------------------------------------------------------------------------


def _some_traffic(tenant, openai_client, anthropic_client, mock_provider) -> list[str]:
    oc, ac = openai_client(tenant.secret), anthropic_client(tenant.secret)
    rids = [oc.chat.completions.create(model=OPENAI_MODEL, messages=CHAT)._request_id]
    stream = oc.chat.completions.create(model=OPENAI_MODEL, messages=CHAT, stream=True)
    list(stream)
    rids.append(request_id(stream.response.headers))
    rids.append(oc.embeddings.create(model="text-embedding-3-small", input="hello")._request_id)
    raw = ac.messages.with_raw_response.create(model=ANTHROPIC_MODEL, max_tokens=16, messages=CHAT)
    rids.append(request_id(raw.headers))
    mock_provider.script(status=500)
    with pytest.raises(openai.InternalServerError) as ei:
        oc.chat.completions.create(model=OPENAI_MODEL, messages=CHAT)
    rids.append(request_id(ei.value.response.headers))
    return rids


def _csv_value(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def test_csv_export_matches_json(tenant, openai_client, anthropic_client, mock_provider, ledger):
    rids = _some_traffic(tenant, openai_client, anthropic_client, mock_provider)
    ledger.settle_tenant(tenant, rids)
    receipts = ledger.receipts(tenant.org_id, key_id=tenant.key_id)
    r = ledger.csv(tenant.org_id, key_id=tenant.key_id)
    assert r.headers.get("content-type", "").startswith("text/csv"), r.headers
    rows = list(csv.reader(io.StringIO(r.text)))
    header, body = rows[0], rows[1:]
    # every receipt field, then the columns added since, in this order: `tags` (`key=value,...`; empty, and
    # absent from the JSON, without tags), the audio counts (0 and absent from the JSON without audio), and a
    # deferred job's id and hold (empty, and absent, for other receipts), and who paid the provider (`managed` or
    # `client`; empty for receipts written before it was recorded)
    later = ["tags", "audio_input_tokens", "cached_audio_input_tokens", "audio_output_tokens", "job_id", "held_usd",
             "provider_key"]
    assert set(header[:-len(later)]) == RECEIPT_FIELDS and header[-len(later):] == later, header
    assert len(body) == len(receipts), (len(body), len(receipts), r.text)
    absent = {"audio_input_tokens": "0", "cached_audio_input_tokens": "0", "audio_output_tokens": "0",
              "job_id": "", "held_usd": "", "provider_key": ""}
    for row, receipt in zip(body, receipts):  # same order: oldest first
        tags = ",".join(f"{k}={v}" for k, v in sorted(receipt.get("tags", {}).items()))
        expected = {k: _csv_value(receipt[k]) for k in header[:-len(later)]} | {"tags": tags}
        expected |= {k: _csv_value(receipt[k]) if k in receipt else v for k, v in absent.items()}
        assert dict(zip(header, row)) == expected, (row, receipt)
    # the whole org, and a key filter that matches nothing but the header
    assert len(list(csv.reader(io.StringIO(ledger.csv(tenant.org_id).text)))) == len(receipts) + 1
    other = ledger.csv(tenant.org_id, key_id="key_" + "0" * 20).text
    assert list(csv.reader(io.StringIO(other))) == [header], other


def test_listing_filters_pages_and_order(make_tenant, admin, gateway, openai_client, ledger):
    t = make_tenant()
    key2 = admin.create_key(t.org_id, unique("second"))
    key2_rids: list[str] = []
    wait_admitted(gateway, key2["secret"], "openai", admitted=key2_rids)
    c1, c2 = openai_client(t.secret), openai_client(key2["secret"])
    rids = []
    for _ in range(5):
        rids.append(c1.chat.completions.create(model=OPENAI_MODEL, messages=CHAT)._request_id)
        key2_rids.append(c2.chat.completions.create(model=OPENAI_MODEL, messages=CHAT)._request_id)
    ledger.settle_tenant(t, rids)
    ledger.settle(t.org_id, key2["id"], key2_rids)

    mine = ledger.receipts(t.org_id, key_id=t.key_id)
    assert [r["request_id"] for r in mine if r["request_id"] in rids] == rids, "not oldest first"
    starts = [parse_time(r["started_at"]) for r in mine]
    assert starts == sorted(starts), "not oldest first"
    everything = ledger.receipts(t.org_id)
    assert {r["request_id"] for r in everything} == {r["request_id"] for r in mine} | set(key2_rids)
    starts = [parse_time(r["started_at"]) for r in everything]
    assert starts == sorted(starts), "not oldest first"

    # pages of 2, following next_cursor, give the same list; the last page says no more
    paged, cursor, pages = [], None, 0
    while True:
        page = ledger.page(t.org_id, limit=2, **({"cursor": cursor} if cursor else {}))
        assert len(page["receipts"]) <= 2
        paged += page["receipts"]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert pages < 100
    assert [r["id"] for r in paged] == [r["id"] for r in everything]
    assert pages == -(-len(everything) // 2), (pages, len(everything))

    # time window
    first, last = parse_time(everything[0]["started_at"]), parse_time(everything[-1]["started_at"])
    fmt = lambda d: d.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"  # noqa: E731
    hour = dt.timedelta(hours=1)
    assert ledger.receipts(t.org_id, **{"from": fmt(last + hour)}) == []
    assert ledger.receipts(t.org_id, to=fmt(first - hour)) == []
    window = ledger.receipts(t.org_id, **{"from": fmt(first - dt.timedelta(seconds=1)),
                                          "to": fmt(last + dt.timedelta(seconds=1))})
    assert [r["id"] for r in window] == [r["id"] for r in everything]

    # bad parameters are 400s, not silently ignored
    for params in ({"limit": "0"}, {"limit": "abc"}, {"cursor": "not-a-cursor"}, {"format": "xml"},
                   {"from": "yesterday"}):
        r = admin.http.get(f"/orgs/{t.org_id}/receipts", params=params)
        assert r.status_code == 400, (params, r.status_code, r.text)
    r = admin.http.get(f"/orgs/org_{'0' * 20}/receipts")
    assert r.status_code == 404, r.text


def test_summary_matches_the_receipts(tenant, openai_client, anthropic_client, mock_provider, ledger):
    rids = _some_traffic(tenant, openai_client, anthropic_client, mock_provider)
    ledger.settle_tenant(tenant, rids)
    receipts = ledger.receipts(tenant.org_id, key_id=tenant.key_id)
    want: dict = defaultdict(lambda: {"requests": 0, "input_tokens": 0, "output_tokens": 0, "cost": Decimal(0)})
    for r in receipts:
        row = want[(parse_time(r["started_at"]).date().isoformat(), r["key_id"], r["model"])]
        row["requests"] += 1
        row["input_tokens"] += r["input_tokens"]
        row["output_tokens"] += r["output_tokens"]
        row["cost"] += Decimal(r["cost_usd"])
    rows = ledger.summary(tenant.org_id)
    got = {(row["day"], row["key_id"], row["model"]): {
        "requests": row["requests"], "input_tokens": row["input_tokens"], "output_tokens": row["output_tokens"],
        "cost_usd": row["cost_usd"]} for row in rows}
    assert len(got) == len(rows), f"duplicate (day, key, model) rows: {rows}"
    assert got == {k: {"requests": v["requests"], "input_tokens": v["input_tokens"],
                       "output_tokens": v["output_tokens"], "cost_usd": format_usd(v["cost"])}
                   for k, v in want.items()}, rows


def test_mock_input_token_formula():
    """The suite's copy of the mock's rule, on the examples crates/testkit documents."""
    assert mock_input_tokens({"messages": [{"role": "user", "content": "Say hello"}]}) == 3
    assert mock_input_tokens({"content": [{"type": "text", "text": "hi there"}]}) == 3
    assert mock_input_tokens({"input": [[1, 2, 3]], "model": "x", "dimensions": 8}) == 4
    assert mock_input_tokens({}) == 1

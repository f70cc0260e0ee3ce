"""Attribution tags sent by the official SDKs (`x-recovea-tags` as an extra header): on the receipt, never
upstream, filterable and summed by tag; a bad header is a 400 the SDK shows, with no receipt."""

from __future__ import annotations

import anthropic
import openai
import pytest

from conftest import ANTHROPIC_MODEL, OPENAI_MODEL

CHAT = [{"role": "user", "content": "Hi"}]


def test_tags_reach_the_receipt_not_the_provider(tenant, openai_client, anthropic_client, mock_provider, ledger):
    mark = mock_provider.mark()
    tagged = openai_client(tenant.secret).chat.completions.create(
        model=OPENAI_MODEL, messages=CHAT, extra_headers={"x-recovea-tags": "team=search, feature=autocomplete"})
    message = anthropic_client(tenant.secret).messages.with_raw_response.create(
        model=ANTHROPIC_MODEL, max_tokens=8, messages=CHAT, extra_headers={"x-recovea-tags": "team=ads"})
    plain = openai_client(tenant.secret).chat.completions.create(model=OPENAI_MODEL, messages=CHAT)
    rids = [tagged._request_id, message.headers["x-request-id"], plain._request_id]
    for request in mock_provider.since(mark):
        assert request.header("x-recovea-tags") is None, f"{request.path}: tags forwarded"
    receipts = ledger.settle_tenant(tenant, rids)
    assert receipts[rids[0]]["tags"] == {"feature": "autocomplete", "team": "search"}
    assert receipts[rids[1]]["tags"] == {"team": "ads"}
    assert "tags" not in receipts[rids[2]], "a receipt without tags has no tags member"

    by_tag = ledger.receipts(tenant.org_id, tag="team:search")
    assert [r["request_id"] for r in by_tag] == [rids[0]]
    summary = ledger.http.get(f"/orgs/{tenant.org_id}/receipts/summary", params={"group_by": "tag:team"})
    assert summary.status_code == 200, summary.text
    counts = {row["tag_value"]: row["requests"] for row in summary.json()["rows"]}
    assert counts["search"] == 1 and counts["ads"] == 1 and counts[None] >= 1, counts


def test_invalid_tags_are_a_400_the_sdks_show(tenant, openai_client, anthropic_client, mock_provider, ledger):
    mark = mock_provider.mark()
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client(tenant.secret).chat.completions.create(
            model=OPENAI_MODEL, messages=CHAT, extra_headers={"x-recovea-tags": "team=a b"})
    assert raised.value.code == "invalid_tags"
    assert "Invalid x-recovea-tags: the value of 'team' must be" in raised.value.message
    with pytest.raises(anthropic.BadRequestError) as araised:
        anthropic_client(tenant.secret).messages.create(
            model=ANTHROPIC_MODEL, max_tokens=8, messages=CHAT, extra_headers={"x-recovea-tags": "a=1,a=2"})
    assert araised.value.body["type"] == "error"
    assert araised.value.body["error"]["message"] == "Invalid x-recovea-tags: the key 'a' is given twice."
    assert mock_provider.since(mark) == [], "a refused request reached the provider"
    ledger.settle_tenant(tenant)

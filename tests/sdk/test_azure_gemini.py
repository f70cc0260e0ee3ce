"""Azure OpenAI and Google Gemini through `recovea serve`, with their official SDKs.

Azure: the `openai` SDK's `AzureOpenAI` client (Python, and TypeScript through tests/sdk/js), its endpoint the
gateway's URL: it calls `/openai/deployments/{deployment}/...?api-version=...` with the Recovea key in `api-key`,
which the gateway routes to the organization's credential named `azure` (kind `azure_openai`). Azure's v1 paths are reached by
name (`/azure/openai/v1/...`) with the plain `OpenAI` client.

Gemini: the `google-genai` SDK, its base URL the gateway's: it calls `/v1/models/{model}:generateContent`
and `:streamGenerateContent?alt=sse` (`/v1beta/...` with `api_version="v1beta"`) with the key in
`x-goog-api-key`, routed to the credential named `gemini`; and the `openai` SDK on Gemini's OpenAI-compatible
endpoint (`/v1beta/openai/`). The gateway's own refusals on Gemini's routes are in Google's error envelope, so
that google-genai's exception shows their status, Google status and message (docs/behaviour.md).
"""

from __future__ import annotations

import time
import uuid

import openai
import pytest
from google import genai
from google.genai import errors, types

from conftest import (
    MOCK_OUTPUT_TOKENS,
    PROPAGATION_DEADLINE_S,
    OPENAI_MODEL,
    assert_no_recovea_secret,
    assert_receipt,
    refusal_code,
    request_id,
    run_node,
)

API_VERSION = "2024-10-21"
GEMINI_MODEL = "gemini-2.5-flash"
CHAT = [{"role": "user", "content": "Say hello"}]
CHAT_INPUT_TOKENS = 3  # 1 + "Say hello"


@pytest.fixture
def cloud_tenant(make_tenant, admin, gateway):
    """A tenant whose organization has an `azure` and a `gemini` credential, both at the mock."""
    tenant = make_tenant(openai=False, anthropic=False)
    tenant.azure_key = f"azure-managed-{uuid.uuid4().hex}"
    tenant.gemini_key = f"AIza-managed-{uuid.uuid4().hex}"
    admin.put_provider(tenant.org_id, "azure", "azure_openai", tenant.azure_key, base_url=gateway.mock_url)
    admin.put_provider(tenant.org_id, "gemini", "gemini", tenant.gemini_key, base_url=gateway.mock_url)
    azure_probe = (f"/openai/deployments/{OPENAI_MODEL}/chat/completions?api-version={API_VERSION}", "api-key",
                   {"model": OPENAI_MODEL, "messages": CHAT})
    for probe in (azure_probe, GEMINI_PROBE):
        tenant.probe_request_ids += probed_until(gateway, tenant.secret, probe, lambda r: refusal_code(r) is None)
    return tenant


# Gemini's native call, as google-genai makes it: (path, key header, body).
GEMINI_PROBE = (f"/v1beta/models/{GEMINI_MODEL}:generateContent", "x-goog-api-key",
                {"contents": [{"parts": [{"text": "ping"}]}]})


def probed_until(gateway, secret: str, probe: tuple[str, str, dict], done) -> list[str]:
    """Sends `probe` with `secret` until `done(response)` (an admin change reaches the gateway within the
    propagation deadline); the request ids of the probes it forwarded (each has a receipt)."""
    path, header, body = probe
    forwarded: list[str] = []
    deadline = time.monotonic() + PROPAGATION_DEADLINE_S
    while True:
        r = gateway.request("POST", path, headers={header: secret}, json=body)
        if r.status_code == 200:
            forwarded.append(request_id(r.headers))
        if done(r):
            return forwarded
        assert time.monotonic() < deadline, f"{path}: still {r.status_code} {r.text}"
        time.sleep(0.05)


def assert_deployment_calls(mock_provider, mark, tenant, ledger, plain: str, streamed: str) -> None:
    """A chat completion and a stream went to the deployment's path with the managed `api-key`, the stream
    asking the provider for usage; each has a receipt with the mock's exact usage."""
    sent = mock_provider.since(mark)
    assert len(sent) == 2
    for req in sent:
        assert req.path == f"/openai/deployments/{OPENAI_MODEL}/chat/completions?api-version={API_VERSION}"
        assert req.header("api-key") == tenant.azure_key
        assert req.header("authorization") is None
    assert sent[1].body_json["stream_options"] == {"include_usage": True}
    assert_no_recovea_secret(sent, tenant.secret)

    receipts = ledger.settle_tenant(tenant, [plain, streamed])
    for rid, stream_ in ((plain, False), (streamed, True)):
        assert_receipt(receipts[rid], tenant=tenant, request_id=rid, provider="azure", model=OPENAI_MODEL,
                       endpoint=f"/openai/deployments/{OPENAI_MODEL}/chat/completions", stream=stream_,
                       input_tokens=CHAT_INPUT_TOKENS, output_tokens=MOCK_OUTPUT_TOKENS)


def test_azure_openai_sdk_chat_and_stream_through_the_gateway(gateway, mock_provider, cloud_tenant, ledger):
    client = openai.AzureOpenAI(azure_endpoint=gateway.url, api_key=cloud_tenant.secret,
                                api_version=API_VERSION, max_retries=0, timeout=30)
    mark = mock_provider.mark()
    raw = client.chat.completions.with_raw_response.create(model=OPENAI_MODEL, messages=CHAT)
    completion = raw.parse()
    assert completion.choices[0].message.content == "This is a mock response."
    assert completion.usage.prompt_tokens == CHAT_INPUT_TOKENS
    plain = request_id(raw.headers)

    stream = client.chat.completions.with_raw_response.create(model=OPENAI_MODEL, messages=CHAT, stream=True)
    chunks = list(stream.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "This is a mock response."
    assert all(c.usage is None for c in chunks), "the usage chunk the gateway asked for is not the client's"
    assert_deployment_calls(mock_provider, mark, cloud_tenant, ledger, plain, request_id(stream.headers))
    client.close()


def test_the_typescript_azure_client_chat_and_stream_through_the_gateway(gateway, mock_provider, cloud_tenant,
                                                                         ledger):
    """The `openai` npm package's `AzureOpenAI` (tests/sdk/js/openai_clients.mjs), its deployment the model."""
    mark = mock_provider.mark()
    lines = run_node("openai_clients.mjs", gateway.url, cloud_tenant.secret, OPENAI_MODEL, "azure-chat",
                     "azure-stream")
    chat, stream = lines
    assert chat["ok"] and stream["ok"], lines
    assert chat["text"] == stream["text"] == "This is a mock response.", lines
    # the stream asked for usage (`include_usage`): one usage chunk, the provider's, as the plain answer's
    assert stream["usage"] == [chat["usage"]], lines
    tokens = (chat["usage"]["prompt_tokens"], chat["usage"]["completion_tokens"])
    assert tokens == (CHAT_INPUT_TOKENS, MOCK_OUTPUT_TOKENS), chat
    assert_deployment_calls(mock_provider, mark, cloud_tenant, ledger, chat["request_id"], stream["request_id"])


@pytest.mark.parametrize(("base", "model", "upstream", "header", "provider"), [
    pytest.param("/azure/openai/v1", OPENAI_MODEL, "/openai/v1/chat/completions", "api-key", "azure",
                 id="azure-v1-by-the-credentials-name"),
    pytest.param("/v1beta/openai", GEMINI_MODEL, "/v1beta/openai/chat/completions", "x-goog-api-key", "gemini",
                 id="geminis-openai-compatible-endpoint"),
])
def test_openai_sdk_on_an_openai_compatible_path(gateway, mock_provider, cloud_tenant, ledger, base, model,
                                                 upstream, header, provider):
    client = openai.OpenAI(base_url=f"{gateway.url}{base}", api_key=cloud_tenant.secret, max_retries=0, timeout=30)
    mark = mock_provider.mark()
    raw = client.chat.completions.with_raw_response.create(model=model, messages=CHAT)
    assert raw.parse().choices[0].message.content == "This is a mock response."
    (sent,) = mock_provider.since(mark)
    assert sent.path == upstream
    managed = cloud_tenant.azure_key if provider == "azure" else cloud_tenant.gemini_key
    assert (sent.header(header), sent.header("authorization")) == (managed, None)
    rid = request_id(raw.headers)
    receipt = ledger.settle_tenant(cloud_tenant, [rid])[rid]
    assert_receipt(receipt, tenant=cloud_tenant, request_id=rid, provider=provider, model=model,
                   endpoint=upstream, stream=False, input_tokens=CHAT_INPUT_TOKENS, output_tokens=MOCK_OUTPUT_TOKENS)
    client.close()


def _genai(gateway, secret, api_version=None):
    options = types.HttpOptions(base_url=gateway.url, timeout=30_000, api_version=api_version)
    return genai.Client(api_key=secret, http_options=options)


def _gateway_request_id(response) -> str:
    return request_id(response.sdk_http_response.headers)


def test_google_genai_sdk_generate_content_and_stream_through_the_gateway(gateway, mock_provider, cloud_tenant,
                                                                          ledger):
    client = _genai(gateway, cloud_tenant.secret)
    mark = mock_provider.mark()
    response = client.models.generate_content(model=GEMINI_MODEL, contents="Say hello")
    assert response.text == "This is a mock response."
    assert response.usage_metadata.prompt_token_count == CHAT_INPUT_TOKENS
    plain = _gateway_request_id(response)

    chunks = list(client.models.generate_content_stream(model=GEMINI_MODEL, contents="Say hello"))
    assert "".join(c.text or "" for c in chunks) == "This is a mock response."
    assert chunks[-1].usage_metadata.candidates_token_count == MOCK_OUTPUT_TOKENS
    streamed = _gateway_request_id(chunks[0])

    sent = mock_provider.since(mark)
    assert [req.path for req in sent] == [
        f"/v1/models/{GEMINI_MODEL}:generateContent",
        f"/v1/models/{GEMINI_MODEL}:streamGenerateContent?alt=sse",
    ]
    for req in sent:
        assert req.header("x-goog-api-key") == cloud_tenant.gemini_key
    assert_no_recovea_secret(sent, cloud_tenant.secret)

    receipts = ledger.settle_tenant(cloud_tenant, [plain, streamed])
    for rid, method, stream_ in ((plain, "generateContent", False), (streamed, "streamGenerateContent", True)):
        assert_receipt(receipts[rid], tenant=cloud_tenant, request_id=rid, provider="gemini", model=GEMINI_MODEL,
                       endpoint=f"/v1/models/{GEMINI_MODEL}:{method}", stream=stream_,
                       input_tokens=CHAT_INPUT_TOKENS, output_tokens=MOCK_OUTPUT_TOKENS)


def test_gemini_thoughts_cache_and_tool_prompts_on_the_receipt(gateway, mock_provider, cloud_tenant, ledger):
    mock_provider.script(usage={"promptTokenCount": 1000, "cachedContentTokenCount": 600,
                                "candidatesTokenCount": 10, "thoughtsTokenCount": 90,
                                "toolUsePromptTokenCount": 20, "totalTokenCount": 1120})
    client = _genai(gateway, cloud_tenant.secret, api_version="v1beta")
    response = client.models.generate_content(model=GEMINI_MODEL, contents="Say hello")
    assert response.usage_metadata.thoughts_token_count == 90
    rid = _gateway_request_id(response)
    receipt = ledger.settle_tenant(cloud_tenant, [rid])[rid]
    # input: the prompt (cached content included) and the tool-use prompt; output: candidates and thoughts.
    assert_receipt(receipt, tenant=cloud_tenant, request_id=rid, provider="gemini", model=GEMINI_MODEL,
                   endpoint=f"/v1beta/models/{GEMINI_MODEL}:generateContent", stream=False,
                   input_tokens=1020, cached=600, output_tokens=100, reasoning=90)
    assert receipt["cost_usd"] == "0.000394"


def google_error(status: int, google_status: str, message: str, kind: str, code: str) -> dict:
    """The gateway's own answer on a Gemini route (docs/behaviour.md): Google's error envelope, the contract's
    `type` and `code` in its `ErrorInfo` detail."""
    return {"error": {"code": status, "message": message, "status": google_status, "details": [{
        "@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": code.upper(), "domain": "recovea",
        "metadata": {"type": kind, "code": code}}]}}


def gemini_refusals(client) -> list[errors.APIError]:
    """What google-genai raises for generate_content and for generate_content_stream."""
    raised = []
    for call in (lambda: client.models.generate_content(model=GEMINI_MODEL, contents="Say hello"),
                 lambda: list(client.models.generate_content_stream(model=GEMINI_MODEL, contents="Say hello"))):
        with pytest.raises(errors.APIError) as error:
            call()
        raised.append(error.value)
    return raised


def assert_gemini_refusal(error: errors.APIError, expected: dict) -> None:
    """google-genai's exception shows the gateway's status, Google status and message; the contract's code
    and type are in its details."""
    status, google_status = expected["error"]["code"], expected["error"]["status"]
    assert isinstance(error, errors.ClientError), type(error)
    assert (error.code, error.status, error.message) == (status, google_status, expected["error"]["message"])
    assert error.details == expected, error.details
    assert str(error).startswith(f"{status} {google_status}. "), str(error)
    assert request_id(error.response.headers)


def test_google_genai_sdk_shows_the_gateways_401(gateway, mock_provider):
    mark = mock_provider.mark()
    expected = google_error(401, "UNAUTHENTICATED", "Invalid API key.", "invalid_request_error", "invalid_api_key")
    for api_version in (None, "v1beta"):
        for error in gemini_refusals(_genai(gateway, "rk_" + "0" * 44, api_version)):
            assert_gemini_refusal(error, expected)
    assert mock_provider.since(mark) == [], "a refused request reached the provider"


def test_google_genai_sdk_shows_the_gateways_402(gateway, admin, mock_provider, cloud_tenant, ledger):
    r = admin.http.post(f"/orgs/{cloud_tenant.org_id}/caps",
                        json={"scope": "organization", "window": "month", "limit_usd": "0", "hard_stop": True})
    assert r.status_code == 201, r.text
    forwarded = probed_until(gateway, cloud_tenant.secret, GEMINI_PROBE, lambda r: r.status_code == 402)
    mark = mock_provider.mark()
    expected = google_error(402, "RESOURCE_EXHAUSTED", "Monthly spend cap reached.", "insufficient_quota",
                            "budget_exceeded")
    for error in gemini_refusals(_genai(gateway, cloud_tenant.secret)):
        assert_gemini_refusal(error, expected)
        headers = error.response.headers
        assert (headers["x-recovea-budget-scope"], headers["x-recovea-budget-window"]) == ("organization", "month")
    assert mock_provider.since(mark) == [], "a refused request reached the provider"
    ledger.settle_tenant(cloud_tenant, forwarded)


def test_google_genai_sdk_shows_the_gateways_403(gateway, admin, mock_provider, cloud_tenant, ledger):
    r = admin.http.patch(f"/keys/{cloud_tenant.key_id}", json={"allowed_models": ["gemini-2.5-pro"]})
    assert r.status_code == 200, r.text
    forwarded = probed_until(gateway, cloud_tenant.secret, GEMINI_PROBE, lambda r: r.status_code == 403)
    mark = mock_provider.mark()
    expected = google_error(403, "PERMISSION_DENIED", f"Model '{GEMINI_MODEL}' is not allowed for this key.",
                            "permission_error", "model_not_allowed")
    for error in gemini_refusals(_genai(gateway, cloud_tenant.secret, api_version="v1beta")):
        assert_gemini_refusal(error, expected)
    assert mock_provider.since(mark) == [], "a refused model reached the provider"
    ledger.settle_tenant(cloud_tenant, forwarded)

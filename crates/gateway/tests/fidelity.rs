//! Model allowlists, attribution tags and Anthropic-shaped answers on the request path,
//! in-process over real sockets, in front of the mock provider: the gateway's own answers byte for
//! byte, what reached the provider, and which receipts were written.

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use recovea_core::Answer;
use recovea_core::answer::WireShape;
use recovea_core::caps::{Cap, Scope};
use recovea_core::endpoints::EndpointAllowlist;
use recovea_core::ids::{KeyId, OrgId};
use recovea_core::keys::hash_secret;
use recovea_core::models::ModelAllowlist;
use recovea_core::ratelimit::KeyLimits;
use recovea_core::snapshot::{ProviderCredential, ProviderKind, SnapshotBuilder};
use recovea_core::window::Window;
use recovea_counters::InProcess;
use recovea_gateway::{GatewayConfig, GatewaySettings};
use recovea_testkit::wait::{DEADLINE, eventually};
use recovea_testkit::{Behaviour, MockProvider};

mod support;

use support::Harness;

/// org_acme lists no models; this key lists none either.
const OPEN_KEY: &str = "rk_open0000000000000000000000000000000000000001";
/// org_acme; the key lists `gpt-4o-mini` and `claude-*`.
const LISTED_KEY: &str = "rk_listed00000000000000000000000000000000000002";
/// org_strict lists `gpt-4o-mini`; this key lists nothing.
const STRICT_KEY: &str = "rk_strict00000000000000000000000000000000000003";
/// org_strict; the key lists `claude-*`: no model is in both lists.
const DISJOINT_KEY: &str = "rk_disjoint000000000000000000000000000000000004";
/// org_capped: an armed monthly cap of $0.
const CAPPED_KEY: &str = "rk_capped00000000000000000000000000000000000005";
/// org_acme, one request a minute.
const SLOW_KEY: &str = "rk_slow0000000000000000000000000000000000000006";
const UNKNOWN_KEY: &str = "rk_unknown00000000000000000000000000000000000007";
/// org_acme; the key may call chat completions, messages and Gemini's model calls only.
const INFERENCE_KEY: &str = "rk_inference0000000000000000000000000000000008";
/// org_fenced lists `/v1/chat/*` and `/v1/embeddings`; this key lists nothing.
const FENCED_KEY: &str = "rk_fenced00000000000000000000000000000000000009";
/// org_fenced; the key lists `/v1/embeddings` and `/v1/files*`.
const FENCED_FILES_KEY: &str = "rk_fencedfiles00000000000000000000000000000010";
/// org_acme; at most two requests in flight.
const PAIR_KEY: &str = "rk_pair0000000000000000000000000000000000000011";
/// org_busy (at most two requests in flight across its keys), no limit of their own.
const BUSY_A_KEY: &str = "rk_busya000000000000000000000000000000000000012";
const BUSY_B_KEY: &str = "rk_busyb000000000000000000000000000000000000013";
const MANAGED_OPENAI: &str = "sk-managed-openai-0123456789";
const MANAGED_ANTHROPIC: &str = "sk-ant-managed-0123456789";
const MANAGED_GEMINI: &str = "AIza-managed-0123456789";

const CHAT_MINI: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi"}]}"#;
const CHAT_4O: &str = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}]}"#;
const MESSAGES: &str =
    r#"{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"Hi"}]}"#;

impl Harness {
    /// A node whose counters are confirmed once, as `serve`'s sync loop does at start.
    async fn start(max_body_bytes: u64) -> Self {
        Self::start_confirmed(max_body_bytes, true).await
    }

    async fn start_confirmed(max_body_bytes: u64, confirmed: bool) -> Self {
        let mock = MockProvider::start().await;
        let settings =
            GatewaySettings { max_body_bytes, gemini_base_url: mock.url(), ..support::settings(&mock.url()) };
        let config = GatewayConfig::new(settings).expect("valid config");
        let h = Self::serve(mock, config, Some(snapshot())).await;
        if confirmed {
            h.confirm(&InProcess::default()).await;
        }
        h
    }

    /// As the Anthropic SDKs send it: the key in `x-api-key`, and `anthropic-version`.
    fn anthropic(&self, method: http::Method, path: &str, secret: &str) -> http::request::Builder {
        Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .header("x-api-key", secret)
            .header("anthropic-version", "2023-06-01")
    }
}

fn models(patterns: &[&str]) -> ModelAllowlist {
    ModelAllowlist::parse(patterns.iter().map(|p| (*p).to_owned()).collect()).expect("valid list")
}

fn endpoints(patterns: &[&str]) -> EndpointAllowlist {
    EndpointAllowlist::parse(patterns.iter().map(|p| (*p).to_owned()).collect()).expect("valid list")
}

fn snapshot() -> recovea_core::Snapshot {
    let (acme, strict, capped) = (org("org_acme"), org("org_strict"), org("org_capped"));
    let (fenced, busy) = (org("org_fenced"), org("org_busy"));
    let mut b = SnapshotBuilder::new(1);
    b.org(acme.clone()).org(strict.clone()).org(capped.clone()).org(fenced.clone()).org(busy.clone());
    b.org_allowed_models(strict.clone(), models(&["gpt-4o-mini"]));
    b.org_allowed_endpoints(fenced.clone(), endpoints(&["/v1/chat/*", "/v1/embeddings"]));
    b.org_max_concurrent_requests(busy.clone(), 2);
    for org in [&acme, &strict, &capped, &fenced, &busy] {
        b.provider(org, credential("openai", ProviderKind::OpenAi, MANAGED_OPENAI));
        b.provider(org, credential("anthropic", ProviderKind::Anthropic, MANAGED_ANTHROPIC));
        b.provider(org, credential("gemini", ProviderKind::Gemini, MANAGED_GEMINI));
    }
    let zero = support::cap("cap_zero", Scope::Organization, Window::Month, "0", true);
    b.cap(Cap { org_id: capped.clone(), ..zero });
    b.key(hash_secret(OPEN_KEY), key("key_open"), acme.clone(), None);
    b.key(hash_secret(LISTED_KEY), key("key_listed"), acme.clone(), None);
    b.key_allowed_models(hash_secret(LISTED_KEY), models(&["gpt-4o-mini", "claude-*"]));
    b.key(hash_secret(STRICT_KEY), key("key_strict"), strict.clone(), None);
    b.key(hash_secret(DISJOINT_KEY), key("key_disjoint"), strict, None);
    b.key_allowed_models(hash_secret(DISJOINT_KEY), models(&["claude-*"]));
    b.key(hash_secret(CAPPED_KEY), key("key_capped"), capped, None);
    let one_a_minute = KeyLimits { requests_per_minute: Some(1), tokens_per_minute: None };
    b.key_with_limits(hash_secret(SLOW_KEY), key("key_slow"), acme.clone(), None, one_a_minute);
    b.key(hash_secret(INFERENCE_KEY), key("key_inference"), acme.clone(), None);
    let inference = endpoints(&["/v1/chat/completions", "/v1/messages", "/v1beta/models/*"]);
    b.key_allowed_endpoints(hash_secret(INFERENCE_KEY), inference);
    b.key(hash_secret(FENCED_KEY), key("key_fenced"), fenced.clone(), None);
    b.key(hash_secret(FENCED_FILES_KEY), key("key_fencedfiles"), fenced, None);
    b.key_allowed_endpoints(hash_secret(FENCED_FILES_KEY), endpoints(&["/v1/embeddings", "/v1/files*"]));
    b.key(hash_secret(PAIR_KEY), key("key_pair"), acme, None);
    b.key_max_concurrent_requests(hash_secret(PAIR_KEY), 2);
    b.key(hash_secret(BUSY_A_KEY), key("key_busya"), busy.clone(), None);
    b.key(hash_secret(BUSY_B_KEY), key("key_busyb"), busy, None);
    b.build()
}

fn org(id: &str) -> OrgId {
    OrgId::parse(id).expect("id")
}

fn key(id: &str) -> KeyId {
    KeyId::parse(id).expect("id")
}

fn credential(name: &str, kind: ProviderKind, api_key: &str) -> ProviderCredential {
    ProviderCredential::new(name.into(), kind, None, api_key.into())
}

/// The status, the body byte for byte, and every header of `expected`.
async fn assert_answer(response: Response<hyper::body::Incoming>, expected: &Answer) {
    assert_eq!(response.status().as_u16(), expected.status);
    let headers = response.headers().clone();
    assert_eq!(headers.get("content-type").expect("content type"), "application/json");
    for (name, value) in &expected.headers {
        assert_eq!(headers.get(*name).map(|v| v.to_str().expect("text")), Some(value.as_str()), "{name}");
    }
    let body = response.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(
        std::str::from_utf8(&body).expect("utf-8"),
        std::str::from_utf8(&expected.body).expect("utf-8")
    );
}

/// A 429's `retry-after-ms`.
fn retry_after_ms(response: &Response<hyper::body::Incoming>) -> u64 {
    let value = response.headers().get("retry-after-ms").expect("retry-after-ms");
    value.to_str().expect("text").parse().expect("ms")
}

async fn ok(response: Response<hyper::body::Incoming>) {
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.expect("body");
}

#[tokio::test]
async fn a_model_no_list_allows_is_refused_403_before_the_provider_and_without_a_receipt() {
    let h = Harness::start(1 << 20).await;
    let refused = Answer::model_not_allowed("gpt-4o");
    // The key's list refuses.
    assert_answer(h.send(h.post_as("/v1/chat/completions", LISTED_KEY), CHAT_4O).await, &refused).await;
    // The organization's list refuses, the key having none.
    assert_answer(h.send(h.post_as("/v1/chat/completions", STRICT_KEY), CHAT_4O).await, &refused).await;
    // Each list allows a model the other does not: both must allow it.
    assert_answer(
        h.send(h.post_as("/v1/chat/completions", DISJOINT_KEY), CHAT_MINI).await,
        &Answer::model_not_allowed("gpt-4o-mini"),
    )
    .await;
    // On an Anthropic route the 403 carries Anthropic's envelope.
    let opus = r#"{"model":"claude-opus-4-1","max_tokens":8,"messages":[]}"#;
    assert_answer(
        h.send(h.anthropic(http::Method::POST, "/v1/messages", STRICT_KEY), opus).await,
        &Answer::model_not_allowed("claude-opus-4-1").shaped(WireShape::Anthropic),
    )
    .await;
    assert!(h.mock.requests().is_empty(), "a refused model never reaches the provider");

    // What the lists allow goes through: an exact name, a prefix, and no list at all.
    ok(h.send(h.post_as("/v1/chat/completions", LISTED_KEY), CHAT_MINI).await).await;
    ok(h.send(h.anthropic(http::Method::POST, "/v1/messages", LISTED_KEY), MESSAGES).await).await;
    ok(h.send(h.post_as("/v1/chat/completions", STRICT_KEY), CHAT_MINI).await).await;
    ok(h.send(h.post_as("/v1/chat/completions", OPEN_KEY), CHAT_4O).await).await;
    // A request that names no model has nothing to refuse.
    let list =
        Request::get(format!("{}/v1/models", h.url)).header("authorization", format!("Bearer {LISTED_KEY}"));
    ok(h.send(list, "").await).await;
    assert_eq!(h.mock.requests().len(), 5);
    // Five receipts, for the five admitted requests: the refused ones wrote none.
    let mut keys: Vec<String> = h.receipts(5).await.iter().map(|r| r.key_id.to_string()).collect();
    keys.sort();
    assert_eq!(keys, ["key_listed", "key_listed", "key_listed", "key_open", "key_strict"]);
}

/// A GET with `secret` as a bearer key.
fn get_as(h: &Harness, path: &str, secret: &str) -> http::request::Builder {
    Request::get(format!("{}{path}", h.url)).header("authorization", format!("Bearer {secret}"))
}

#[tokio::test]
async fn an_endpoint_no_list_allows_is_refused_403_before_the_provider_and_without_a_receipt() {
    let h = Harness::start(1 << 20).await;
    let refused = |endpoint: &str| Answer::endpoint_not_allowed(endpoint);
    // The key's list keeps it to inference: the management paths beside it are refused, matched
    // on the path without its query.
    for path in ["/v1/files", "/v1/files?purpose=batch", "/v1/chat/completions/chatcmpl-1"] {
        let expected = refused(path.split('?').next().expect("a path"));
        assert_answer(h.send(get_as(&h, path, INFERENCE_KEY), "").await, &expected).await;
    }
    // A named route is matched on the path the provider is sent: `/openai/v1/files` is `/v1/files`.
    assert_answer(h.send(get_as(&h, "/openai/v1/files", INFERENCE_KEY), "").await, &refused("/v1/files"))
        .await;
    // The organization's list refuses, the key having none; then each list allows a path the
    // other does not: both must allow it.
    assert_answer(
        h.send(h.post_as("/v1/embeddings/x", FENCED_KEY), "{}").await,
        &refused("/v1/embeddings/x"),
    )
    .await;
    assert_answer(h.send(get_as(&h, "/v1/files", FENCED_FILES_KEY), "").await, &refused("/v1/files")).await;
    assert_answer(
        h.send(h.post_as("/v1/chat/completions", FENCED_FILES_KEY), CHAT_MINI).await,
        &refused("/v1/chat/completions"),
    )
    .await;
    // In Anthropic's envelope on an Anthropic route, in Google's on Gemini's own API.
    assert_answer(
        h.send(h.anthropic(http::Method::POST, "/v1/messages/batches", INFERENCE_KEY), MESSAGES).await,
        &refused("/v1/messages/batches").shaped(WireShape::Anthropic),
    )
    .await;
    let files = Request::get(format!("{}/v1beta/files", h.url)).header("x-goog-api-key", INFERENCE_KEY);
    assert_answer(h.send(files, "").await, &refused("/v1beta/files").shaped(WireShape::Gemini)).await;
    assert!(h.mock.requests().is_empty(), "a refused endpoint never reaches the provider");

    // What the lists allow goes through: an exact path (by default and by name), a prefix.
    ok(h.send(h.post_as("/v1/chat/completions", INFERENCE_KEY), CHAT_MINI).await).await;
    ok(h.send(h.post_as("/openai/v1/chat/completions", INFERENCE_KEY), CHAT_MINI).await).await;
    ok(h.send(h.anthropic(http::Method::POST, "/v1/messages", INFERENCE_KEY), MESSAGES).await).await;
    let generate = Request::post(format!("{}/v1beta/models/gemini-2.5-flash:generateContent", h.url))
        .header("content-type", "application/json")
        .header("x-goog-api-key", INFERENCE_KEY);
    ok(h.send(generate, r#"{"contents":[{"parts":[{"text":"Hi"}]}]}"#).await).await;
    ok(h.send(h.post_as("/v1/chat/completions", FENCED_KEY), CHAT_MINI).await).await;
    let embed = r#"{"model":"text-embedding-3-small","input":"Hi"}"#;
    ok(h.send(h.post_as("/v1/embeddings", FENCED_FILES_KEY), embed).await).await;
    assert_eq!(h.mock.requests().len(), 6);
    // Six receipts, for the six admitted requests: the refused ones wrote none.
    assert_eq!(h.receipts(6).await.len(), 6);
    assert_eq!(h.metric(r#"recovea_requests_total{outcome="endpoint_not_allowed"}"#).await, 9);
}

const STREAM_MINI: &str =
    r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Hi"}]}"#;

/// The body of a refusal, as text.
async fn text_of(response: Response<hyper::body::Incoming>) -> (StatusCode, String) {
    let status = response.status();
    let body = response.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8(body.to_vec()).expect("utf-8"))
}

/// Sends `body` as `secret` until it is admitted, with a deadline: a slot given back when a
/// client leaves is free once the node sees the connection go.
async fn admitted_soon(h: &Harness, secret: &str) {
    eventually(DEADLINE, "the slot given back", || async {
        let (status, body) =
            text_of(h.send(h.post_as("/v1/chat/completions", secret), CHAT_MINI).await).await;
        assert!([StatusCode::OK, StatusCode::TOO_MANY_REQUESTS].contains(&status), "{status}: {body}");
        (status == StatusCode::OK).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_key_has_at_most_its_limit_of_requests_in_flight_streams_until_their_end() {
    let h = Harness::start(1 << 20).await;
    // Two streams in flight: one that stalls, one that ends after a few slow events.
    h.mock.script(Behaviour::default().stall_after_events(1));
    let stalled = h.send(h.post_as("/v1/chat/completions", PAIR_KEY), STREAM_MINI).await;
    assert_eq!(stalled.status(), StatusCode::OK);
    h.mock.script(Behaviour { chunk_delay_ms: Some(300), pieces: Some(3), ..Behaviour::default() });
    let slow = h.send(h.post_as("/v1/chat/completions", PAIR_KEY), STREAM_MINI).await;
    assert_eq!(slow.status(), StatusCode::OK);
    // The third is refused, before the provider, with the exact answer; other keys go on.
    let third = h.send(h.post_as("/v1/chat/completions", PAIR_KEY), CHAT_MINI).await;
    assert_answer(third, &Answer::concurrency_limit_exceeded("key", 2)).await;
    assert_eq!(h.mock.requests().len(), 2, "a refused request never reaches the provider");
    ok(h.send(h.post_as("/v1/chat/completions", OPEN_KEY), CHAT_MINI).await).await;
    // The slow stream holds its slot until its last event: once it has ended, one more goes.
    let body = slow.into_body().collect().await.expect("the stream ends").to_bytes();
    assert!(std::str::from_utf8(&body).expect("utf-8").contains("[DONE]"));
    ok(h.send(h.post_as("/v1/chat/completions", PAIR_KEY), CHAT_MINI).await).await;
    ok(h.send(h.post_as("/v1/chat/completions", PAIR_KEY), CHAT_MINI).await).await;
    // The stalled one still holds its slot: a second stall fills the pair again.
    h.mock.script(Behaviour::default().stall_after_events(1));
    let second_stall = h.send(h.post_as("/v1/chat/completions", PAIR_KEY), STREAM_MINI).await;
    assert_eq!(second_stall.status(), StatusCode::OK);
    let (status, _) = text_of(h.send(h.post_as("/v1/chat/completions", PAIR_KEY), CHAT_MINI).await).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // A client that leaves gives its slot back.
    drop(stalled);
    admitted_soon(&h, PAIR_KEY).await;
    drop(second_stall);
    assert!(h.metric(r#"recovea_requests_total{outcome="concurrency_limited"}"#).await >= 2);
}

#[tokio::test]
async fn an_organization_has_at_most_its_limit_of_requests_in_flight_across_its_keys() {
    let h = Harness::start(1 << 20).await;
    h.mock.script(Behaviour::default().stall_after_events(1).times(2));
    let a = h.send(h.post_as("/v1/chat/completions", BUSY_A_KEY), STREAM_MINI).await;
    let b = h.send(h.post_as("/v1/chat/completions", BUSY_B_KEY), STREAM_MINI).await;
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    // Each key has one in flight, and neither has a limit of its own: the organization's refuses.
    let refused = Answer::concurrency_limit_exceeded("organization", 2);
    assert_answer(h.send(h.post_as("/v1/chat/completions", BUSY_A_KEY), CHAT_MINI).await, &refused).await;
    let anthropic = h.send(h.anthropic(http::Method::POST, "/v1/messages", BUSY_B_KEY), MESSAGES).await;
    assert_answer(anthropic, &refused.clone().shaped(WireShape::Anthropic)).await;
    assert_eq!(h.mock.requests().len(), 2);
    drop(a);
    admitted_soon(&h, BUSY_B_KEY).await;
    drop(b);
}

#[tokio::test]
async fn every_answer_of_the_gateway_on_an_anthropic_route_carries_anthropics_envelope() {
    let h = Harness::start(1 << 20).await;
    let anthropic = |answer: Answer| answer.shaped(WireShape::Anthropic);
    // 401, on the messages route and on any path that carries `anthropic-version`.
    for path in ["/v1/messages", "/v1/models", "/v1/messages/count_tokens"] {
        let method = if path == "/v1/models" { http::Method::GET } else { http::Method::POST };
        let response = h.send(h.anthropic(method, path, UNKNOWN_KEY), MESSAGES).await;
        assert_answer(response, &anthropic(Answer::invalid_api_key())).await;
    }
    // Without `anthropic-version`, /v1/messages is still Anthropic's; other paths keep OpenAI's shape.
    let bare = Request::post(format!("{}/v1/messages", h.url)).header("x-api-key", UNKNOWN_KEY);
    assert_answer(h.send(bare, MESSAGES).await, &anthropic(Answer::invalid_api_key())).await;
    assert_answer(
        h.send(h.post_as("/v1/chat/completions", UNKNOWN_KEY), CHAT_MINI).await,
        &Answer::invalid_api_key(),
    )
    .await;
    // 404: a path the gateway does not serve.
    let response = h.send(h.anthropic(http::Method::POST, "/v2/messages", OPEN_KEY), MESSAGES).await;
    assert_answer(response, &anthropic(Answer::unknown_route())).await;
    // A path past 2 KiB is no route: the path reaches the receipt, the log and the span.
    let long = format!("/v1/messages/{}", "x".repeat(2048));
    let response = h.send(h.anthropic(http::Method::POST, &long, OPEN_KEY), MESSAGES).await;
    assert_answer(response, &anthropic(Answer::unknown_route())).await;
    // 402: an armed cap at its line, its headers kept.
    let response = h.send(h.anthropic(http::Method::POST, "/v1/messages", CAPPED_KEY), MESSAGES).await;
    assert_answer(response, &anthropic(Answer::budget_exceeded("organization", "month", "Monthly"))).await;
    // 429: the key's rate limit, with its retry headers.
    ok(h.send(h.anthropic(http::Method::POST, "/v1/messages", SLOW_KEY), MESSAGES).await).await;
    let response = h.send(h.anthropic(http::Method::POST, "/v1/messages", SLOW_KEY), MESSAGES).await;
    let wait_ms = retry_after_ms(&response);
    assert_answer(response, &anthropic(Answer::rate_limited(wait_ms))).await;
    // 403: a model outside the lists.
    let response = h.send(h.anthropic(http::Method::POST, "/v1/messages", DISJOINT_KEY), CHAT_MINI).await;
    assert_answer(response, &anthropic(Answer::model_not_allowed("gpt-4o-mini"))).await;
    assert_eq!(h.mock.requests().len(), 1, "only the first request of the slow key was forwarded");
}

/// Gemini's own API (`generateContent` and the rest, on `/v1beta/` or `/v1/`, by default or by name):
/// every answer of the gateway's in Google's envelope, so that google-genai shows its status and
/// message. Gemini's OpenAI-compatible endpoint keeps OpenAI's shape.
#[tokio::test]
async fn every_answer_of_the_gateway_on_a_gemini_route_is_in_googles_envelope() {
    const CONTENTS: &str = r#"{"contents":[{"parts":[{"text":"Hi"}]}]}"#;
    const GENERATE: &str = "/v1beta/models/gemini-2.5-flash:generateContent";
    let h = Harness::start(64).await;
    let gemini = |answer: Answer| answer.shaped(WireShape::Gemini);
    let google = |path: &str, secret: &str| {
        Request::post(format!("{}{path}", h.url))
            .header("content-type", "application/json")
            .header("x-goog-api-key", secret)
    };
    // 401, on each of Gemini's paths.
    for path in [
        GENERATE,
        "/v1/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        "/gemini/v1beta/models/gemini-2.5-flash:countTokens",
    ] {
        assert_answer(h.send(google(path, UNKNOWN_KEY), CONTENTS).await, &gemini(Answer::invalid_api_key()))
            .await;
    }
    // Its OpenAI-compatible endpoint is spoken to by OpenAI's SDKs.
    let compatible = h.post_as("/v1beta/openai/chat/completions", UNKNOWN_KEY);
    assert_answer(h.send(compatible, CHAT_MINI).await, &Answer::invalid_api_key()).await;
    // 402: an armed cap at its line, its headers kept.
    let response = h.send(google(GENERATE, CAPPED_KEY), CONTENTS).await;
    assert_answer(response, &gemini(Answer::budget_exceeded("organization", "month", "Monthly"))).await;
    // 403: the model in the path, outside the lists.
    let response = h.send(google(GENERATE, DISJOINT_KEY), CONTENTS).await;
    assert_answer(response, &gemini(Answer::model_not_allowed("gemini-2.5-flash"))).await;
    // 413: a body over the limit.
    let response = h.send(google(GENERATE, OPEN_KEY), &"x".repeat(65)).await;
    assert_answer(response, &gemini(Answer::request_too_large(64))).await;
    // 429: the key's rate limit, with its retry headers.
    ok(h.send(google(GENERATE, SLOW_KEY), CONTENTS).await).await;
    let response = h.send(google(GENERATE, SLOW_KEY), CONTENTS).await;
    let wait_ms = retry_after_ms(&response);
    assert_answer(response, &gemini(Answer::rate_limited(wait_ms))).await;
    let seen = h.mock.requests();
    assert_eq!(seen.len(), 1, "only the first request of the slow key was forwarded");
    assert_eq!(seen[0].header("x-goog-api-key"), Some(MANAGED_GEMINI));
}

#[tokio::test]
async fn a_body_over_the_limit_on_an_anthropic_route_is_413_in_anthropics_envelope() {
    let h = Harness::start(64).await;
    let response = h.send(h.anthropic(http::Method::POST, "/v1/messages", OPEN_KEY), &"x".repeat(65)).await;
    assert_answer(response, &Answer::request_too_large(64).shaped(WireShape::Anthropic)).await;
    let response = h.send(h.post_as("/v1/chat/completions", OPEN_KEY), &"x".repeat(65)).await;
    assert_answer(response, &Answer::request_too_large(64)).await;
}

#[tokio::test]
async fn a_request_carrying_anthropic_version_goes_to_the_anthropic_credential_on_every_path() {
    let h = Harness::start(1 << 20).await;
    ok(h.send(h.anthropic(http::Method::GET, "/v1/models", OPEN_KEY), "").await).await;
    ok(h.send(h.anthropic(http::Method::GET, "/v1/models/claude-sonnet-4-5", OPEN_KEY), "").await).await;
    // Without it, /v1/models is OpenAI's.
    let openai =
        Request::get(format!("{}/v1/models", h.url)).header("authorization", format!("Bearer {OPEN_KEY}"));
    ok(h.send(openai, "").await).await;
    let seen = h.mock.requests();
    assert_eq!(seen.len(), 3);
    for request in &seen[..2] {
        assert_eq!(request.header("x-api-key"), Some(MANAGED_ANTHROPIC), "{}", request.path);
        assert_eq!(request.header("authorization"), None);
        assert_eq!(request.header("anthropic-version"), Some("2023-06-01"));
    }
    assert_eq!(seen[2].header("authorization"), Some(format!("Bearer {MANAGED_OPENAI}").as_str()));
    assert_eq!(seen[2].header("x-api-key"), None);
}

#[tokio::test]
async fn tags_reach_the_receipt_and_never_the_provider() {
    let h = Harness::start(1 << 20).await;
    let tagged = h
        .post_as("/v1/chat/completions", OPEN_KEY)
        .header("x-recovea-tags", "team=search, feature=autocomplete");
    ok(h.send(tagged, CHAT_MINI).await).await;
    let two_lines = h
        .anthropic(http::Method::POST, "/v1/messages", OPEN_KEY)
        .header("x-recovea-tags", "team=ads")
        .header("x-recovea-tags", "env=prod/eu-1");
    ok(h.send(two_lines, MESSAGES).await).await;
    ok(h.send(h.post_as("/v1/chat/completions", OPEN_KEY), CHAT_MINI).await).await;
    for request in h.mock.requests() {
        assert_eq!(request.header("x-recovea-tags"), None, "{}: tags forwarded", request.path);
        assert!(!request.headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("x-recovea-tags")));
    }
    let mut receipts = h.receipts(3).await;
    receipts.sort_by_key(|r| r.endpoint.clone());
    let tags: Vec<String> = receipts.iter().map(|r| recovea_core::tags::to_text(&r.tags)).collect();
    // chat completions (tagged, then untagged), then messages
    let mut chat = [tags[0].clone(), tags[1].clone()];
    chat.sort();
    assert_eq!(chat, ["".to_owned(), "feature=autocomplete,team=search".to_owned()]);
    assert_eq!(tags[2], "env=prod/eu-1,team=ads");
}

#[tokio::test]
async fn invalid_tags_are_a_400_that_says_why_before_the_provider_and_without_a_receipt() {
    let h = Harness::start(1 << 20).await;
    let bad = h.post_as("/v1/chat/completions", OPEN_KEY).header("x-recovea-tags", "Team=search");
    let expected =
        Answer::invalid_tags("the key 'Team' must be 1 to 32 characters of a-z, 0-9, '_', '-' and '.'");
    assert_answer(h.send(bad, CHAT_MINI).await, &expected).await;
    let twice = h.anthropic(http::Method::POST, "/v1/messages", OPEN_KEY).header("x-recovea-tags", "a=1,a=2");
    let expected = Answer::invalid_tags("the key 'a' is given twice").shaped(WireShape::Anthropic);
    assert_answer(h.send(twice, MESSAGES).await, &expected).await;
    let many = (0..11).map(|n| format!("k{n}=v")).collect::<Vec<_>>().join(",");
    let too_many = h.post_as("/v1/chat/completions", OPEN_KEY).header("x-recovea-tags", many);
    assert_answer(h.send(too_many, CHAT_MINI).await, &Answer::invalid_tags("at most 10 tags")).await;
    // An unknown key is refused for its key first: tags are read only for an admitted caller.
    let unknown = h.post_as("/v1/chat/completions", UNKNOWN_KEY).header("x-recovea-tags", "Team=x");
    assert_answer(h.send(unknown, CHAT_MINI).await, &Answer::invalid_api_key()).await;
    assert!(h.mock.requests().is_empty(), "a refused request reached the provider");
    ok(h.send(h.post_as("/v1/chat/completions", OPEN_KEY), CHAT_MINI).await).await;
    assert!(h.receipts(1).await[0].tags.is_empty(), "only the admitted request has a receipt");
}

#[tokio::test]
async fn an_armed_cap_that_cannot_confirm_its_spend_is_503_in_anthropics_envelope() {
    let h = Harness::start_confirmed(1 << 20, false).await;
    let response = h.send(h.anthropic(http::Method::POST, "/v1/messages", CAPPED_KEY), MESSAGES).await;
    let expected =
        Answer::budget_unverifiable("organization", "month", "Monthly").shaped(WireShape::Anthropic);
    assert_answer(response, &expected).await;
    let response = h.send(h.post_as("/v1/chat/completions", CAPPED_KEY), CHAT_MINI).await;
    assert_answer(response, &Answer::budget_unverifiable("organization", "month", "Monthly")).await;
    assert!(h.mock.requests().is_empty());
}

/// The issue's body: `stream` twice. Providers read the last (`true`); read otherwise, the
/// gateway would not ask for the usage chunk and would estimate a reasoning model's receipt from
/// its visible text.
const STREAM_TWICE: &str =
    r#"{"model":"o3","stream":false,"messages":[{"role":"user","content":"Hi"}],"stream":true}"#;

#[tokio::test]
async fn a_body_naming_a_member_twice_is_refused_400_naming_it_before_anything_is_reserved_or_sent() {
    let h = Harness::start(1 << 20).await;
    let response = h.send(h.post_as("/v1/chat/completions", OPEN_KEY), STREAM_TWICE).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body = response.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(
        std::str::from_utf8(&body).expect("utf-8"),
        r#"{
  "error": {
    "message": "The request body names the member \"stream\" more than once; send each member once.",
    "type": "invalid_request_error",
    "param": null,
    "code": "invalid_request"
  }
}"#
    );
    // A repeated model is refused for the repeat, before the allowlist reads either (this key's
    // lists allow no model at all).
    let model_twice = r#"{"model":"gpt-4o-mini","messages":[],"model":"o3"}"#;
    let response = h.send(h.post_as("/v1/chat/completions", DISJOINT_KEY), model_twice).await;
    assert_answer(response, &Answer::repeated_member("model")).await;
    // Even under an armed cap at its line: nothing is checked against a body read two ways.
    let response = h.send(h.post_as("/v1/chat/completions", CAPPED_KEY), STREAM_TWICE).await;
    assert_answer(response, &Answer::repeated_member("stream")).await;
    // Inside the objects the gateway reads: stream_options, a tool, its function, generationConfig.
    let options = r#"{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":false,"include_usage":true},"messages":[]}"#;
    let response = h.send(h.post_as("/v1/chat/completions", OPEN_KEY), options).await;
    assert_answer(response, &Answer::repeated_member("stream_options.include_usage")).await;
    let function = r#"{"model":"gpt-4o-mini","messages":[],"tools":[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"b","parameters":{},"name":"c"}}]}"#;
    let response = h.send(h.post_as("/v1/chat/completions", OPEN_KEY), function).await;
    assert_answer(response, &Answer::repeated_member("tools[1].function.name")).await;
    let tool = r#"{"model":"claude-sonnet-4-5","max_tokens":8,"messages":[],"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":1,"max_uses":99}]}"#;
    let response = h.send(h.anthropic(http::Method::POST, "/v1/messages", OPEN_KEY), tool).await;
    assert_answer(response, &Answer::repeated_member("tools[0].max_uses").shaped(WireShape::Anthropic)).await;
    let config = r#"{"contents":[{"parts":[{"text":"Hi"}]}],"generationConfig":{"maxOutputTokens":8,"maxOutputTokens":65536}}"#;
    let gemini = Request::post(format!("{}/v1beta/models/gemini-2.5-flash:generateContent", h.url))
        .header("content-type", "application/json")
        .header("x-goog-api-key", OPEN_KEY);
    let response = h.send(gemini, config).await;
    let expected = Answer::repeated_member("generationConfig.maxOutputTokens").shaped(WireShape::Gemini);
    assert_answer(response, &expected).await;
    assert!(h.mock.requests().is_empty(), "a body read two ways never reaches the provider");

    // A repeat where the gateway reads nothing is the provider's to judge: forwarded as sent.
    let message_twice =
        r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi","content":"Ho"}]}"#;
    ok(h.send(h.post_as("/v1/chat/completions", OPEN_KEY), message_twice).await).await;
    assert_eq!(h.mock.requests()[0].body, message_twice.as_bytes());
    // One receipt, for the one request forwarded: the refused ones wrote none.
    assert_eq!(h.receipts(1).await[0].key_id.to_string(), "key_open");
    assert_eq!(h.metric("recovea_requests_total{outcome=\"invalid_request\"}").await, 7);
}

/// The provider's answer names the account behind the managed key, and may set a cookie on the
/// gateway's domain: those headers never reach the client; the others do.
#[tokio::test]
async fn headers_naming_the_operators_provider_account_never_reach_the_client() {
    let h = Harness::start(1 << 20).await;
    h.mock.script(
        recovea_testkit::Behaviour::default()
            .header("openai-organization", "org-operator")
            .header("openai-project", "proj_operator")
            .header("anthropic-organization-id", "4f0c-operator")
            .header("set-cookie", "__cf_bm=abc; Domain=gateway.example")
            .header("openai-processing-ms", "42"),
    );
    let response = h.send(h.post_as("/v1/chat/completions", OPEN_KEY), CHAT_MINI).await;
    assert_eq!(response.status(), StatusCode::OK);
    for name in recovea_providers::headers::ACCOUNT_HEADERS {
        assert!(response.headers().get(name).is_none(), "{name} reached the client");
    }
    assert_eq!(response.headers()["openai-processing-ms"], "42", "other headers pass");
}

/// A model name is the client's text, and it reaches the receipt, the access log line and the
/// span: one longer than 256 bytes, or holding a line break or an escape sequence, is refused
/// before anything is reserved, sent or metered, wherever the request names it.
#[tokio::test]
async fn a_model_name_too_long_or_holding_control_characters_is_refused_400() {
    let h = Harness::start(1 << 20).await;
    let chat = |model: &str| {
        serde_json::json!({"model": model, "messages": [{"role": "user", "content": "Hi"}]}).to_string()
    };
    let forged =
        "gpt-4o-mini\n2026-12-06T00:00:00Z INFO recovea::access: request org_id=org_VICTIM cost_usd=1234.00";
    for model in
        ["m".repeat(257), forged.to_owned(), "gpt-4o-mini\u{1b}[31m".to_owned(), "gpt\u{7f}".to_owned()]
    {
        let response = h.send(h.post_as("/v1/chat/completions", OPEN_KEY), &chat(&model)).await;
        assert_answer(response, &Answer::invalid_model_name()).await;
    }
    // In Gemini's path too, in Google's envelope.
    let long = "g".repeat(300);
    let gemini = Request::post(format!("{}/v1beta/models/{long}:generateContent", h.url))
        .header("content-type", "application/json")
        .header("x-goog-api-key", OPEN_KEY);
    let response = h.send(gemini, r#"{"contents":[{"parts":[{"text":"Hi"}]}]}"#).await;
    assert_answer(response, &Answer::invalid_model_name().shaped(WireShape::Gemini)).await;
    assert!(h.mock.requests().is_empty(), "nothing reached the provider");
    // 256 bytes is a name like any other.
    let longest = "m".repeat(256);
    let response = h.send(h.post_as("/v1/chat/completions", OPEN_KEY), &chat(&longest)).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(h.receipts(1).await[0].model.as_deref(), Some(longest.as_str()));
    assert_eq!(h.metric("recovea_requests_total{outcome=\"invalid_request\"}").await, 5);
}

#[tokio::test]
async fn a_body_starting_with_a_byte_order_mark_is_refused_400_in_the_routes_envelope() {
    let h = Harness::start(1 << 20).await;
    let with_mark = |body: &str| format!("\u{feff}{body}");
    let response = h.send(h.post_as("/v1/chat/completions", OPEN_KEY), &with_mark(CHAT_MINI)).await;
    assert_answer(response, &Answer::byte_order_mark()).await;
    let response = h.send(h.post_as("/v1/chat/completions", DISJOINT_KEY), &with_mark(CHAT_4O)).await;
    assert_answer(response, &Answer::byte_order_mark()).await;
    let response = h
        .send(
            h.anthropic(http::Method::POST, "/v1/messages", OPEN_KEY),
            &format!("\n{}", with_mark(MESSAGES)),
        )
        .await;
    assert_answer(response, &Answer::byte_order_mark().shaped(WireShape::Anthropic)).await;
    assert!(h.mock.requests().is_empty());
    // The character anywhere else is text like any other.
    let inside = "{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"user\",\"content\":\"\u{feff}Hi\"}]}";
    ok(h.send(h.post_as("/v1/chat/completions", OPEN_KEY), inside).await).await;
    h.receipts(1).await;
    assert_eq!(h.metric("recovea_requests_total{outcome=\"invalid_request\"}").await, 3);
}

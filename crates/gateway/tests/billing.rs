//! Each row of issue 32's table as a request through a gateway node in front of the mock provider:
//! the receipt's cost exact to the nano-dollar, computed from the built-in table's own price of
//! each component the answer (or, where it carries none, the request) says was used, and the
//! receipt recording each quantity it charged.
//!
//! Where the figure and the table's disagree, the table's is asserted and the difference
//! said beside it: the receipt bills the table's prices.

use http::StatusCode;
use http_body_util::BodyExt;
use recovea_core::ids::{KeyId, OrgId};
use recovea_core::keys::hash_secret;
use recovea_core::money::Nanos;
use recovea_core::pricing::{Price, PriceTable, ServiceTier};
use recovea_core::receipt::Receipt;
use recovea_core::snapshot::{ProviderCredential, ProviderKind, SnapshotBuilder};
use recovea_core::usage::UsageSource;
use recovea_counters::InProcess;
use recovea_gateway::{GatewayConfig, GatewaySettings};
use recovea_testkit::{Behaviour, MockProvider};
use serde_json::json;

mod support;

use support::Harness;

const KEY: &str = "rk_billing0000000000000000000000000000000000001";
const BOUNDARY: &str = "recoveaform";

impl Harness {
    /// A node whose organization has OpenAI, Anthropic and Gemini credentials, all at the mock.
    async fn start() -> Self {
        let mock = MockProvider::start().await;
        let settings = GatewaySettings { gemini_base_url: mock.url(), ..support::settings(&mock.url()) };
        let config = GatewayConfig::new(settings).expect("valid config");
        let snapshot = snapshot(&mock.url());
        let h = Self::serve(mock, config, Some(snapshot)).await;
        h.confirm(&InProcess::default()).await;
        h
    }

    /// Sends `body` to `path` with the key, answered 200, and returns the one receipt it made.
    async fn billed(&self, path: &str, content_type: &str, body: &str) -> Receipt {
        let before = self.receipts.all().len();
        let request = http::Request::post(format!("{}{path}", self.url))
            .header("content-type", content_type)
            .header("authorization", format!("Bearer {KEY}"));
        let response = self.send(request, body).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        response.into_body().collect().await.expect("whole answer");
        self.receipts(before + 1).await.pop().expect("a receipt")
    }

    async fn billed_json(&self, path: &str, body: serde_json::Value) -> Receipt {
        self.billed(path, "application/json", &body.to_string()).await
    }
}

fn snapshot(mock_url: &str) -> recovea_core::Snapshot {
    let org = OrgId::parse("org_acme").expect("id");
    let mut b = SnapshotBuilder::new(1);
    b.org(org.clone());
    let credential = |name: &str, kind, base_url: Option<String>| {
        ProviderCredential::new(name.into(), kind, base_url, format!("managed-{name}-0123456789"))
    };
    b.provider(&org, credential("openai", ProviderKind::OpenAi, None));
    b.provider(&org, credential("anthropic", ProviderKind::Anthropic, None));
    b.provider(&org, credential("gemini", ProviderKind::Gemini, Some(mock_url.to_owned())));
    b.key(hash_secret(KEY), KeyId::parse("key_billing").expect("id"), org, None);
    b.build()
}

/// The built-in table's price of `model`.
fn price(model: &str) -> Price {
    PriceTable::builtin().lookup(model).unwrap_or_else(|| panic!("{model} is priced"))
}

/// `units` at `rate` per million, which these figures divide exactly.
fn per_million(units: u64, rate: Option<Nanos>) -> Nanos {
    let exact = i128::from(units) * i128::from(rate.expect("the table has this price").0);
    assert_eq!(exact % 1_000_000, 0, "an exact figure");
    Nanos(i64::try_from(exact / 1_000_000).expect("in range"))
}

fn each(units: u64, fee: Option<Nanos>) -> Nanos {
    Nanos(i64::try_from(units).expect("few") * fee.expect("the table has this fee").0)
}

fn sum(parts: &[Nanos]) -> Nanos {
    Nanos(parts.iter().map(|n| n.0).sum())
}

fn usd(text: &str) -> Nanos {
    Nanos::parse_usd(text).expect("a dollar figure")
}

/// A multipart form of `fields` and an audio `file` of `file_bytes` bytes, as the SDKs send it.
fn form(fields: &[(&str, &str)], file_bytes: usize) -> String {
    let mut form = String::new();
    for (name, value) in fields {
        form.push_str(&format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
        ));
    }
    form.push_str(&format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"talk.mp3\"\r\nContent-Type: audio/mpeg\r\n\r\n"
    ));
    form.push_str(&"a".repeat(file_bytes));
    form.push_str(&format!("\r\n--{BOUNDARY}--\r\n"));
    form
}

fn multipart() -> String {
    format!("multipart/form-data; boundary={BOUNDARY}")
}

#[tokio::test]
async fn gpt_image_1_is_billed_its_text_and_image_tokens() {
    let h = Harness::start().await;
    let usage = json!({"input_tokens": 50, "input_tokens_details": {"text_tokens": 50, "image_tokens": 0},
        "output_tokens": 4160, "total_tokens": 4210});
    h.mock.script(Behaviour::default().usage(usage));
    let body = json!({"model": "gpt-image-1", "prompt": "a cat", "quality": "high", "size": "1024x1024"});
    let receipt = h.billed_json("/v1/images/generations", body).await;
    let p = price("gpt-image-1");
    // 50 x $5 + 4,160 x $40 per million = $0.16665 (the "$0.167": the table's own
    // gpt-image-1#high-1024x1024 per-image figure, which the tokens bill more exactly).
    let expected =
        sum(&[per_million(50, Some(p.input_per_mtok)), per_million(4_160, p.image_output_per_mtok)]);
    assert_eq!(expected, usd("0.16665"));
    assert_eq!(receipt.cost_usd, expected);
    assert_eq!(
        (receipt.input_tokens, receipt.output_tokens, receipt.image_output_tokens),
        (50, 4_160, 4_160)
    );
    assert_eq!(receipt.images, 0, "billed by its tokens, not per image");
    assert_eq!((receipt.usage_source, receipt.priced), (UsageSource::Provider, true));
}

#[tokio::test]
async fn dall_e_3_is_billed_per_image_by_quality_and_size() {
    let h = Harness::start().await;
    // Standard 1024x1024 by default: $0.040 an image.
    let receipt =
        h.billed_json("/v1/images/generations", json!({"model": "dall-e-3", "prompt": "a cat"})).await;
    let standard = PriceTable::builtin().get("dall-e-3#standard-1024x1024").expect("listed").price.per_image;
    assert_eq!(receipt.cost_usd, each(1, standard));
    assert_eq!(receipt.cost_usd, usd("0.04"));
    assert_eq!((receipt.images, receipt.usage_source), (1, UsageSource::Provider));
    // Two HD 1792x1024 images: their own entry, times two.
    let body = json!({"model": "dall-e-3", "prompt": "a cat", "quality": "hd", "size": "1792x1024", "n": 2});
    let receipt = h.billed_json("/v1/images/generations", body).await;
    let hd = PriceTable::builtin().get("dall-e-3#hd-1792x1024").expect("listed").price.per_image;
    assert_eq!((receipt.cost_usd, receipt.images), (each(2, hd), 2));
    assert_eq!(receipt.cost_usd, usd("0.24"));
    // No model named: the API runs DALL-E 2, and so the receipt says and bills.
    let receipt = h.billed_json("/v1/images/generations", json!({"prompt": "a cat"})).await;
    let dall_e_2 = PriceTable::builtin().get("dall-e-2#1024x1024").expect("listed").price.per_image;
    assert_eq!((receipt.model.as_deref(), receipt.cost_usd), (Some("dall-e-2"), each(1, dall_e_2)));
}

#[tokio::test]
async fn tts_1_is_billed_per_character_of_its_input() {
    let h = Harness::start().await;
    let input = "abcd ".repeat(800);
    assert_eq!(input.chars().count(), 4_000);
    let body = json!({"model": "tts-1", "input": input, "voice": "alloy"});
    let receipt = h.billed_json("/v1/audio/speech", body).await;
    // 4,000 characters at $15 per million: $0.060 (not the fallback's per-token $0.150).
    let expected = per_million(4_000, price("tts-1").per_million_characters);
    assert_eq!((receipt.cost_usd, expected), (usd("0.06"), usd("0.06")));
    assert_eq!(receipt.characters, 4_000);
    assert_eq!(receipt.usage_source, UsageSource::Provider, "the characters are the bill's own unit");
}

#[tokio::test]
async fn gpt_4o_mini_tts_is_billed_the_tokens_its_stream_reports() {
    let h = Harness::start().await;
    h.mock.script(
        Behaviour::default().usage(json!({"input_tokens": 14, "output_tokens": 1000, "total_tokens": 1014})),
    );
    let body =
        json!({"model": "gpt-4o-mini-tts", "input": "Hello there", "voice": "alloy", "stream_format": "sse"});
    let receipt = h.billed_json("/v1/audio/speech", body).await;
    let p = price("gpt-4o-mini-tts");
    let expected =
        sum(&[per_million(14, Some(p.input_per_mtok)), per_million(1_000, p.audio_output_per_mtok)]);
    assert_eq!(receipt.cost_usd, expected);
    assert_eq!((receipt.audio_output_tokens, receipt.usage_source), (1_000, UsageSource::Provider));
    // Raw audio carries nothing: the tokens are estimated from the input, and said to be.
    let body = json!({"model": "gpt-4o-mini-tts", "input": "abcd efgh", "voice": "alloy"});
    let receipt = h.billed_json("/v1/audio/speech", body).await;
    assert_eq!(receipt.usage_source, UsageSource::Estimated);
    assert_eq!((receipt.input_tokens, receipt.audio_output_tokens), (3, 14));
}

#[tokio::test]
async fn whisper_1_is_billed_per_second_from_its_multipart_form() {
    let h = Harness::start().await;
    h.mock.script(Behaviour::default().usage(json!({"type": "duration", "seconds": 600})));
    let body = form(&[("model", "whisper-1")], 2_000);
    let receipt = h.billed("/v1/audio/transcriptions", &multipart(), &body).await;
    // 600 seconds at $100 per million seconds ($0.006 a minute): $0.060.
    let expected = per_million(600, price("whisper-1").per_million_seconds);
    assert_eq!((receipt.cost_usd, expected), (usd("0.06"), usd("0.06")));
    assert_eq!((receipt.model.as_deref(), receipt.seconds), (Some("whisper-1"), 600));
    assert_eq!((receipt.usage_source, receipt.priced), (UsageSource::Provider, true));
    // A verbose answer's `duration`: the mock's 32,000-byte file lasts 2 s.
    let body = form(&[("model", "whisper-1"), ("response_format", "verbose_json")], 32_000);
    let receipt = h.billed("/v1/audio/translations", &multipart(), &body).await;
    assert_eq!((receipt.seconds, receipt.usage_source), (2, UsageSource::Provider));
    // A text answer carries nothing: 48,000 bytes at 16,000 a second, 3 s, estimated.
    let body = form(&[("model", "whisper-1"), ("response_format", "text")], 48_000);
    let receipt = h.billed("/v1/audio/transcriptions", &multipart(), &body).await;
    assert_eq!((receipt.seconds, receipt.usage_source), (3, UsageSource::Estimated));
    assert_eq!(receipt.cost_usd, per_million(3, price("whisper-1").per_million_seconds));
}

#[tokio::test]
async fn gpt_4o_transcribe_is_billed_its_audio_and_text_tokens() {
    let h = Harness::start().await;
    let usage = json!({"type": "tokens", "input_tokens": 10000,
        "input_token_details": {"text_tokens": 0, "audio_tokens": 10000}, "output_tokens": 1000, "total_tokens": 11000});
    h.mock.script(Behaviour::default().usage(usage));
    let body = form(&[("model", "gpt-4o-transcribe")], 1_000);
    let receipt = h.billed("/v1/audio/transcriptions", &multipart(), &body).await;
    let p = price("gpt-4o-transcribe");
    // The table prices its audio input at $2.50 per million (the issue's $0.070 took OpenAI's
    // list price of $6): 10,000 x $2.50 + 1,000 x $10 per million = $0.035.
    let expected =
        sum(&[per_million(10_000, p.audio_input_per_mtok), per_million(1_000, Some(p.output_per_mtok))]);
    assert_eq!((receipt.cost_usd, expected), (usd("0.035"), usd("0.035")));
    assert_eq!((receipt.audio_input_tokens, receipt.output_tokens, receipt.seconds), (10_000, 1_000, 0));
}

#[tokio::test]
async fn gpt_audio_chat_is_billed_its_audio_tokens_each_way() {
    let h = Harness::start().await;
    let usage = json!({"prompt_tokens": 9000, "completion_tokens": 9000, "total_tokens": 18000,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 9000},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 9000}});
    h.mock.script(Behaviour::default().usage(usage));
    let body = json!({"model": "gpt-audio", "modalities": ["text", "audio"], "messages": [{"role": "user", "content": "Hi"}]});
    let receipt = h.billed_json("/v1/chat/completions", body).await;
    let p = price("gpt-audio");
    // 9,000 x $32 + 9,000 x $64 per million: $0.864 (the issue's $0.877 counted text tokens
    // beside them; these are all audio).
    let expected =
        sum(&[per_million(9_000, p.audio_input_per_mtok), per_million(9_000, p.audio_output_per_mtok)]);
    assert_eq!((receipt.cost_usd, expected), (usd("0.864"), usd("0.864")));
    assert_eq!((receipt.audio_input_tokens, receipt.audio_output_tokens), (9_000, 9_000));
}

#[tokio::test]
async fn gpt_audio_chat_streamed_is_billed_the_same() {
    let h = Harness::start().await;
    let usage = json!({"prompt_tokens": 9000, "completion_tokens": 9000, "total_tokens": 18000,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 9000},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 9000}});
    h.mock.script(Behaviour::default().usage(usage));
    let body = json!({"model": "gpt-audio", "stream": true, "messages": [{"role": "user", "content": "Hi"}]});
    let receipt = h.billed_json("/v1/chat/completions", body).await;
    assert_eq!(receipt.cost_usd, usd("0.864"));
}

#[tokio::test]
async fn responses_web_search_calls_are_billed_each() {
    let h = Harness::start().await;
    let usage = json!({"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 1000, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 2000});
    h.mock.script(Behaviour::default().usage(usage.clone()).web_search_calls(3));
    let body = json!({"model": "gpt-5", "input": "news?", "tools": [{"type": "web_search"}]});
    let receipt = h.billed_json("/v1/responses", body).await;
    let p = price("gpt-5");
    // 1,000 x $1.25 + 1,000 x $10 per million + 3 x $0.01: $0.04125.
    let expected = sum(&[
        per_million(1_000, Some(p.input_per_mtok)),
        per_million(1_000, Some(p.output_per_mtok)),
        each(3, p.web_search_per_call),
    ]);
    assert_eq!((receipt.cost_usd, expected), (usd("0.04125"), usd("0.04125")));
    assert_eq!(receipt.tool_calls.web_search, 3);
    // Streamed: the calls of the final `response.completed`.
    h.mock.script(Behaviour::default().usage(usage).web_search_calls(3));
    let body = json!({"model": "gpt-5", "input": "news?", "stream": true, "tools": [{"type": "web_search"}]});
    let receipt = h.billed_json("/v1/responses", body).await;
    assert_eq!((receipt.cost_usd, receipt.tool_calls.web_search), (expected, 3));
}

#[tokio::test]
async fn anthropic_web_searches_are_billed_each() {
    let h = Harness::start().await;
    let usage = json!({"input_tokens": 1000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
        "output_tokens": 1000, "server_tool_use": {"web_search_requests": 5}, "service_tier": "standard"});
    h.mock.script(Behaviour::default().usage(usage));
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 2048, "messages": [{"role": "user", "content": "news?"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]});
    let receipt = h.billed_json("/v1/messages", body).await;
    let p = price("claude-sonnet-4-5");
    // 1,000 x $3 + 1,000 x $15 per million + 5 x $0.01: $0.068.
    let expected = sum(&[
        per_million(1_000, Some(p.input_per_mtok)),
        per_million(1_000, Some(p.output_per_mtok)),
        each(5, p.web_search_per_call),
    ]);
    assert_eq!((receipt.cost_usd, expected), (usd("0.068"), usd("0.068")));
    assert_eq!(receipt.tool_calls.web_search, 5);
}

#[tokio::test]
async fn gpt_5_is_billed_at_the_tier_it_was_served() {
    let h = Harness::start().await;
    let usage = json!({"prompt_tokens": 1000, "completion_tokens": 1000, "total_tokens": 2000});
    let p = price("gpt-5");
    for (tier, rates, figure) in [
        ("priority", p.priority.expect("priority rates"), "0.0225"),
        ("flex", p.flex.expect("flex rates"), "0.005625"),
    ] {
        h.mock.script(Behaviour::default().usage(usage.clone()));
        let body =
            json!({"model": "gpt-5", "service_tier": tier, "messages": [{"role": "user", "content": "Hi"}]});
        let receipt = h.billed_json("/v1/chat/completions", body).await;
        let expected = sum(&[
            per_million(1_000, Some(rates.input_per_mtok)),
            per_million(1_000, Some(rates.output_per_mtok)),
        ]);
        assert_eq!((receipt.cost_usd, expected), (usd(figure), usd(figure)), "{tier}");
        assert_eq!(receipt.service_tier, ServiceTier::parse(tier));
    }
}

#[tokio::test]
async fn gemini_2_5_pro_past_200k_is_billed_at_the_long_context_rate() {
    let h = Harness::start().await;
    h.mock
        .script(Behaviour::default().usage(json!({"promptTokenCount": 300000, "candidatesTokenCount": 1000,
        "totalTokenCount": 301000})));
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "a long prompt"}]}]});
    let receipt = h.billed_json("/gemini/v1beta/models/gemini-2.5-pro:generateContent", body).await;
    let long = price("gemini-2.5-pro").long_context.expect("a long-context rate");
    assert_eq!(long.above_input_tokens, 200_000);
    // The whole request at $2.50 and $15 per million: $0.765.
    let expected = sum(&[
        per_million(300_000, Some(long.standard.input_per_mtok)),
        per_million(1_000, Some(long.standard.output_per_mtok)),
    ]);
    assert_eq!((receipt.cost_usd, expected), (usd("0.765"), usd("0.765")));
    assert_eq!(receipt.input_tokens, 300_000);
}

#[tokio::test]
async fn gemini_2_5_grounding_is_billed_once_per_grounded_prompt() {
    let h = Harness::start().await;
    let answer = json!({
        "candidates": [{"content": {"role": "model", "parts": [{"text": "Rain."}]}, "finishReason": "STOP",
            "groundingMetadata": {"webSearchQueries": ["paris weather", "paris rain", "paris weather"]}}],
        "usageMetadata": {"promptTokenCount": 1000, "candidatesTokenCount": 1000, "totalTokenCount": 2000},
        "modelVersion": "gemini-2.5-pro"
    });
    h.mock.script(Behaviour::default().body(answer));
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "weather?"}]}], "tools": [{"google_search": {}}]});
    let receipt = h.billed_json("/gemini/v1beta/models/gemini-2.5-pro:generateContent", body).await;
    let p = price("gemini-2.5-pro");
    assert!(p.web_search_per_prompt, "Gemini 2.x bills grounding per prompt");
    // Two distinct queries, billed as one grounded prompt: $0.035 beside the tokens.
    let expected = sum(&[
        per_million(1_000, Some(p.input_per_mtok)),
        per_million(1_000, Some(p.output_per_mtok)),
        each(1, p.web_search_per_call),
    ]);
    assert_eq!(receipt.cost_usd, expected);
    assert_eq!(receipt.tool_calls.web_search, 2);
}

#[tokio::test]
async fn sonnet_4_5_hour_long_cache_writes_are_billed_at_their_price() {
    let h = Harness::start().await;
    let usage = json!({"input_tokens": 0, "cache_creation_input_tokens": 100000, "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 100000}, "output_tokens": 1000});
    h.mock.script(Behaviour::default().usage(usage));
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 2048, "messages": [{"role": "user", "content": "Hi"}]});
    let receipt = h.billed_json("/v1/messages", body).await;
    let p = price("claude-sonnet-4-5");
    // 100,000 x $6 + 1,000 x $15 per million: $0.615 (not the five-minute $3.75's $0.390).
    let expected =
        sum(&[per_million(100_000, p.cache_write_1h_per_mtok), per_million(1_000, Some(p.output_per_mtok))]);
    assert_eq!((receipt.cost_usd, expected), (usd("0.615"), usd("0.615")));
    assert_eq!((receipt.cache_write_input_tokens, receipt.cache_write_1h_input_tokens), (100_000, 100_000));
}

//! Azure OpenAI and Google Gemini credentials on the request path, in-process over real sockets, in
//! front of the mock provider: what reached the provider (path, query, auth) and the receipts,
//! their usage and cost exact.

use http::{Response, StatusCode};
use http_body_util::BodyExt;
use recovea_core::Answer;
use recovea_core::answer::WireShape;
use recovea_core::ids::{KeyId, OrgId};
use recovea_core::keys::hash_secret;
use recovea_core::models::ModelAllowlist;
use recovea_core::money::Nanos;
use recovea_core::snapshot::{ProviderCredential, ProviderKind, SnapshotBuilder};
use recovea_counters::InProcess;
use recovea_gateway::{GatewayConfig, GatewaySettings};
use recovea_testkit::{Behaviour, MockProvider, RecordedRequest};
use serde_json::json;

mod support;

use support::Harness;

const KEY: &str = "rk_providers000000000000000000000000000000000001";
/// Lists only `gpt-4o-mini`.
const LISTED_KEY: &str = "rk_providers000000000000000000000000000000000002";
/// Lists only `gemini-2.5-flash`.
const FLASH_KEY: &str = "rk_providers000000000000000000000000000000000003";
const MANAGED_AZURE: &str = "azure-managed-0123456789";
const MANAGED_GEMINI: &str = "AIza-managed-0123456789";

/// One word of input: the mock counts 1 + 1 input tokens, and answers 5 output tokens.
const CHAT_MINI: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi"}]}"#;
const GEMINI_BODY: &str = r#"{"contents":[{"role":"user","parts":[{"text":"Hi"}]}]}"#;

impl Harness {
    async fn start() -> Self {
        Self::start_with(true).await
    }

    /// `installed`: whether the node has its state; without it every request fails open. Only
    /// Gemini's default base URL is the mock's: the default OpenAI and Anthropic ones lead nowhere.
    async fn start_with(installed: bool) -> Self {
        let mock = MockProvider::start().await;
        let settings =
            GatewaySettings { gemini_base_url: mock.url(), ..support::settings("http://127.0.0.1:9") };
        let config = GatewayConfig::new(settings).expect("valid config");
        let snapshot = installed.then(|| snapshot(&mock.url()));
        let h = Self::serve(mock, config, snapshot).await;
        h.confirm(&InProcess::default()).await;
        h
    }

    /// POSTs `body` to `path` with the key in the header `auth` names.
    async fn post_with(&self, path: &str, auth: (&str, &str), body: &str) -> Response<hyper::body::Incoming> {
        self.send(self.post(path).header(auth.0, auth.1), body).await
    }

    fn last_request(&self) -> RecordedRequest {
        self.mock.requests().pop().expect("the provider was called")
    }
}

fn snapshot(mock_url: &str) -> recovea_core::Snapshot {
    let org = OrgId::parse("org_acme").expect("id");
    let mut b = SnapshotBuilder::new(1);
    b.org(org.clone());
    let credential = |name: &str, kind, api_key: &str| {
        ProviderCredential::new(name.into(), kind, Some(mock_url.to_owned()), api_key.into())
    };
    b.provider(&org, credential("azure", ProviderKind::AzureOpenAi, MANAGED_AZURE));
    b.provider(&org, credential("gemini", ProviderKind::Gemini, MANAGED_GEMINI));
    b.key(hash_secret(KEY), KeyId::parse("key_one").expect("id"), org.clone(), None);
    b.key(hash_secret(LISTED_KEY), KeyId::parse("key_listed").expect("id"), org.clone(), None);
    b.key(hash_secret(FLASH_KEY), KeyId::parse("key_flash").expect("id"), org, None);
    let listed = ModelAllowlist::parse(vec!["gpt-4o-mini".to_owned()]).expect("list");
    b.key_allowed_models(hash_secret(LISTED_KEY), listed);
    let flash = ModelAllowlist::parse(vec!["gemini-2.5-flash".to_owned()]).expect("list");
    b.key_allowed_models(hash_secret(FLASH_KEY), flash);
    b.build()
}

async fn body_text(response: Response<hyper::body::Incoming>) -> String {
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8(body.to_vec()).expect("utf-8")
}

/// No Recovea key anywhere in what the provider received.
fn carries_no_recovea_key(request: &RecordedRequest) {
    assert!(!request.path.contains("rk_"), "{}", request.path);
    for (name, value) in &request.headers {
        assert!(!value.contains("rk_"), "{name}: {value}");
    }
}

#[tokio::test]
async fn an_azure_deployment_gets_the_managed_key_in_api_key_and_its_api_version() {
    let h = Harness::start().await;
    let path = "/openai/deployments/prod-chat/chat/completions?api-version=2024-10-21";
    let text = body_text(h.post_with(path, ("api-key", KEY), CHAT_MINI).await).await;
    assert!(text.contains("This is a mock response."), "{text}");

    let sent = h.last_request();
    assert_eq!(sent.path, path, "the path and its api-version reach the provider as sent");
    assert_eq!(sent.header("api-key"), Some(MANAGED_AZURE));
    assert_eq!(sent.header("authorization"), None);
    carries_no_recovea_key(&sent);

    let receipt = &h.receipts(1).await[0];
    assert_eq!(receipt.provider, "azure");
    assert_eq!(receipt.endpoint, "/openai/deployments/prod-chat/chat/completions");
    assert_eq!(receipt.model.as_deref(), Some("gpt-4o-mini"));
    assert_eq!((receipt.input_tokens, receipt.output_tokens), (2, 5));
    // Azure's own price of gpt-4o-mini (the credential named `azure` prices in Azure's namespace):
    // $0.15 and $0.60 per million: 2 x 0.15 + 5 x 0.60 = $0.0000033.
    assert_eq!(receipt.cost_usd, Nanos(3_300));
    assert_eq!((receipt.priced, receipt.priced_as.as_deref()), (true, Some("azure/gpt-4o-mini")));
}

#[tokio::test]
async fn an_azure_deployment_is_priced_by_the_model_its_answer_names() {
    let h = Harness::start().await;
    // The body names no model: the deployment's name means nothing to the price table, and the
    // answer names the model the deployment serves (the mock answers with the deployment's name,
    // here a model's).
    let body = r#"{"messages":[{"role":"user","content":"Hi"}]}"#;
    let path = "/azure/openai/deployments/gpt-4o-mini/chat/completions?api-version=2024-10-21";
    body_text(h.post_with(path, ("api-key", KEY), body).await).await;
    assert_eq!(
        h.last_request().path,
        "/openai/deployments/gpt-4o-mini/chat/completions?api-version=2024-10-21"
    );
    let receipt = &h.receipts(1).await[0];
    assert_eq!((receipt.model.as_deref(), receipt.cost_usd), (Some("gpt-4o-mini"), Nanos(3_300)));
}

#[tokio::test]
async fn an_azure_stream_is_metered_and_its_usage_chunk_kept_from_a_client_that_did_not_ask() {
    let h = Harness::start().await;
    let body = r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Hi"}]}"#;
    let path = "/openai/deployments/prod-chat/chat/completions?api-version=2024-10-21";
    let text = body_text(h.post_with(path, ("api-key", KEY), body).await).await;
    assert!(!text.contains("\"usage\":{"), "the usage chunk the gateway asked for is removed: {text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let sent = h.last_request().body_json().expect("json");
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));
    let receipt = &h.receipts(1).await[0];
    assert!(receipt.stream);
    assert_eq!((receipt.input_tokens, receipt.output_tokens, receipt.cost_usd), (2, 5, Nanos(3_300)));
}

#[tokio::test]
async fn azure_v1_paths_are_reached_by_the_credentials_name() {
    let h = Harness::start().await;
    body_text(
        h.post_with(
            "/azure/openai/v1/chat/completions",
            ("authorization", &format!("Bearer {KEY}")),
            CHAT_MINI,
        )
        .await,
    )
    .await;
    let sent = h.last_request();
    assert_eq!(sent.path, "/openai/v1/chat/completions");
    assert_eq!((sent.header("api-key"), sent.header("authorization")), (Some(MANAGED_AZURE), None));
    let receipt = &h.receipts(1).await[0];
    assert_eq!((receipt.endpoint.as_str(), receipt.cost_usd), ("/openai/v1/chat/completions", Nanos(3_300)));
}

#[tokio::test]
async fn gemini_generate_content_gets_the_managed_key_never_the_clients_url_key() {
    let h = Harness::start().await;
    let path = "/v1beta/models/gemini-2.5-flash:generateContent?key=AIza-client-key";
    let text = body_text(h.post_with(path, ("x-goog-api-key", KEY), GEMINI_BODY).await).await;
    assert!(text.contains("\"modelVersion\":\"gemini-2.5-flash\""), "{text}");
    let sent = h.last_request();
    assert_eq!(sent.path, "/v1beta/models/gemini-2.5-flash:generateContent");
    assert_eq!(sent.header("x-goog-api-key"), Some(MANAGED_GEMINI));
    carries_no_recovea_key(&sent);

    let receipt = &h.receipts(1).await[0];
    assert_eq!(receipt.provider, "gemini");
    assert_eq!(receipt.endpoint, "/v1beta/models/gemini-2.5-flash:generateContent");
    assert_eq!(receipt.model.as_deref(), Some("gemini-2.5-flash"));
    assert!(!receipt.stream);
    assert_eq!((receipt.input_tokens, receipt.output_tokens), (2, 5));
    // gemini-2.5-flash: $0.30 and $2.50 per million: 2 x 0.30 + 5 x 2.50 = $0.0000131.
    assert_eq!(receipt.cost_usd, Nanos(13_100));
}

#[tokio::test]
async fn a_gemini_sse_stream_reads_the_last_usage_thoughts_cache_and_tool_prompts_included() {
    let h = Harness::start().await;
    h.mock.script(Behaviour::default().usage(json!({
        "promptTokenCount": 1000,
        "cachedContentTokenCount": 600,
        "candidatesTokenCount": 10,
        "thoughtsTokenCount": 90,
        "toolUsePromptTokenCount": 20,
        "totalTokenCount": 1120
    })));
    let path = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse";
    let text = body_text(h.post_with(path, ("x-goog-api-key", KEY), GEMINI_BODY).await).await;
    assert_eq!(text.matches("data: ").count(), 5, "{text}");
    assert!(h.last_request().path.ends_with("?alt=sse"));
    let receipt = &h.receipts(1).await[0];
    assert!(receipt.stream, "the method asks for the stream, not the body");
    assert_eq!(
        (receipt.input_tokens, receipt.cached_input_tokens, receipt.output_tokens, receipt.reasoning_tokens),
        (1020, 600, 100, 90)
    );
    // 420 plain x $0.30 + 600 cached x $0.03 + 100 out x $2.50, per million = $0.000394.
    assert_eq!(receipt.cost_usd, Nanos(394_000));
    assert_eq!(receipt.usage_source.as_str(), "provider");
}

#[tokio::test]
async fn a_gemini_stream_as_a_json_array_is_metered_too() {
    let h = Harness::start().await;
    let path = "/v1beta/models/gemini-2.5-flash:streamGenerateContent";
    let text = body_text(h.post_with(path, ("x-goog-api-key", KEY), GEMINI_BODY).await).await;
    assert!(text.starts_with('['), "{text}");
    let receipt = &h.receipts(1).await[0];
    assert_eq!((receipt.input_tokens, receipt.output_tokens, receipt.cost_usd), (2, 5, Nanos(13_100)));
}

#[tokio::test]
async fn geminis_openai_compatible_endpoint_takes_an_openai_sdks_bearer_key() {
    let h = Harness::start().await;
    let body = r#"{"model":"gemini-2.5-flash","messages":[{"role":"user","content":"Hi"}]}"#;
    let bearer = format!("Bearer {KEY}");
    body_text(h.post_with("/v1beta/openai/chat/completions", ("authorization", &bearer), body).await).await;
    let sent = h.last_request();
    assert_eq!(sent.path, "/v1beta/openai/chat/completions");
    assert_eq!((sent.header("x-goog-api-key"), sent.header("authorization")), (Some(MANAGED_GEMINI), None));
    let receipt = &h.receipts(1).await[0];
    assert_eq!((receipt.model.as_deref(), receipt.cost_usd), (Some("gemini-2.5-flash"), Nanos(13_100)));
}

#[tokio::test]
async fn a_gemini_model_named_only_in_the_path_is_held_to_the_allowlist() {
    let h = Harness::start().await;
    let path = "/v1beta/models/gemini-2.5-pro:generateContent";
    let response = h.post_with(path, ("x-goog-api-key", LISTED_KEY), GEMINI_BODY).await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let body = response.into_body().collect().await.expect("body").to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("model_not_allowed"));
    assert!(h.mock.requests().is_empty());
    // An admitted request after it: its receipt would come after one the refusal should not have.
    let flash = "/v1beta/models/gemini-2.5-flash:generateContent";
    let admitted = h.post_with(flash, ("x-goog-api-key", FLASH_KEY), GEMINI_BODY).await;
    assert_eq!(admitted.status(), StatusCode::OK);
    let id = admitted.headers()["x-request-id"].to_str().expect("text").to_owned();
    body_text(admitted).await;
    assert_eq!(h.receipts_through(&id).await.len(), 1, "the refused request has no receipt");
}

#[tokio::test]
async fn failing_open_gemini_goes_to_the_nodes_gemini_base_url_and_azure_has_none() {
    let h = Harness::start_with(false).await;
    let path = "/v1beta/models/gemini-2.5-flash:generateContent?key=AIza-client-key";
    body_text(h.post_with(path, ("x-goog-api-key", KEY), GEMINI_BODY).await).await;
    let sent = h.last_request();
    assert_eq!(sent.path, "/v1beta/models/gemini-2.5-flash:generateContent");
    assert_eq!(sent.header("x-goog-api-key"), None, "no managed key, and the Recovea key removed");

    let azure = "/openai/deployments/prod-chat/chat/completions?api-version=2024-10-21";
    let response = h.post_with(azure, ("api-key", KEY), CHAT_MINI).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body = response.into_body().collect().await.expect("body").to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("provider_not_configured"));
    assert_eq!(h.mock.requests().len(), 1, "an Azure request has nowhere to go unadmitted");
    assert!(h.receipts.all().is_empty(), "a fail-open pass is not metered");
}

/// The status and the body byte for byte of `expected`.
async fn assert_refused(response: Response<hyper::body::Incoming>, expected: &Answer) {
    assert_eq!(response.status().as_u16(), expected.status);
    let body = response.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(
        std::str::from_utf8(&body).expect("utf-8"),
        std::str::from_utf8(&expected.body).expect("utf-8")
    );
}

/// Azure runs the deployment its path names and does not read the body's `model`: the allowlist
/// holds the deployment, whatever the body says, either way.
#[tokio::test]
async fn an_azure_deployment_is_held_to_the_allowlist_whatever_the_body_names() {
    let h = Harness::start().await;
    let o3 = "/openai/deployments/o3-deploy/chat/completions?api-version=2024-10-21";
    let response = h.post_with(o3, ("api-key", LISTED_KEY), CHAT_MINI).await;
    assert_refused(response, &Answer::model_not_allowed("o3-deploy")).await;
    let named = "/azure/openai/deployments/o3-deploy/chat/completions?api-version=2024-10-21";
    let response = h.post_with(named, ("api-key", LISTED_KEY), CHAT_MINI).await;
    assert_refused(response, &Answer::model_not_allowed("o3-deploy")).await;
    assert!(h.mock.requests().is_empty(), "a deployment the key may not use is never called");

    // The deployment the list names goes through, whatever model the body names.
    let mini = "/openai/deployments/gpt-4o-mini/chat/completions?api-version=2024-10-21";
    let body = r#"{"model":"o3","messages":[{"role":"user","content":"Hi"}]}"#;
    body_text(h.post_with(mini, ("api-key", LISTED_KEY), body).await).await;
    assert_eq!(h.last_request().path, mini);
    assert_eq!(h.receipts(1).await[0].key_id.to_string(), "key_listed");
}

/// Gemini runs the model of its path: a body naming an allowed model does not open another one,
/// and a body naming a refused one does not close the path's.
#[tokio::test]
async fn a_gemini_path_is_held_to_the_allowlist_whatever_the_body_names() {
    let h = Harness::start().await;
    let pro = "/v1beta/models/gemini-2.5-pro:generateContent";
    let flash_body = r#"{"model":"gemini-2.5-flash","contents":[{"role":"user","parts":[{"text":"Hi"}]}]}"#;
    let response = h.post_with(pro, ("x-goog-api-key", FLASH_KEY), flash_body).await;
    assert_refused(response, &Answer::model_not_allowed("gemini-2.5-pro").shaped(WireShape::Gemini)).await;
    let response = h
        .post_with(
            "/v1/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
            ("x-goog-api-key", FLASH_KEY),
            flash_body,
        )
        .await;
    assert_refused(response, &Answer::model_not_allowed("gemini-2.5-pro").shaped(WireShape::Gemini)).await;
    assert!(h.mock.requests().is_empty());

    let flash = "/v1beta/models/gemini-2.5-flash:generateContent";
    let pro_body = r#"{"model":"gemini-2.5-pro","contents":[{"role":"user","parts":[{"text":"Hi"}]}]}"#;
    body_text(h.post_with(flash, ("x-goog-api-key", FLASH_KEY), pro_body).await).await;
    assert_eq!(h.last_request().path, flash);
    // Gemini's OpenAI-compatible endpoint names the model only in its body.
    let compatible = r#"{"model":"gemini-2.5-pro","messages":[{"role":"user","content":"Hi"}]}"#;
    let bearer = format!("Bearer {FLASH_KEY}");
    let response =
        h.post_with("/v1beta/openai/chat/completions", ("authorization", &bearer), compatible).await;
    assert_refused(response, &Answer::model_not_allowed("gemini-2.5-pro")).await;
    assert_eq!(h.receipts(1).await[0].key_id.to_string(), "key_flash");
}

/// A pass that failed open reads nothing and refuses nothing of the body: what the client sent
/// reaches the provider byte for byte, a repeated member or a byte-order mark included.
#[tokio::test]
async fn failing_open_forwards_a_body_read_two_ways_as_it_was_sent() {
    let h = Harness::start_with(false).await;
    let path = "/v1beta/models/gemini-2.5-flash:generateContent";
    let twice = r#"{"contents":[{"parts":[{"text":"Hi"}]}],"generationConfig":{"maxOutputTokens":8,"maxOutputTokens":9}}"#;
    let marked = format!("\u{feff}{GEMINI_BODY}");
    for body in [twice, marked.as_str()] {
        // The mock judges the body as Gemini would (it refuses the mark): its answer, not the gateway's.
        let answer = h.post_with(path, ("x-goog-api-key", KEY), body).await.into_body().collect().await;
        let answer = answer.expect("body").to_bytes();
        let answer = String::from_utf8_lossy(&answer);
        assert!(!answer.contains("byte-order mark") && !answer.contains("more than once"), "{answer}");
    }
    let sent: Vec<Vec<u8>> = h.mock.requests().iter().map(|r| r.body.to_vec()).collect();
    assert_eq!(sent, [twice.as_bytes().to_vec(), marked.into_bytes()]);
    assert!(h.receipts.all().is_empty(), "a fail-open pass is not metered");
}

/// A file uploaded to Gemini's Files API is the client's document: its byte-order mark or
/// repeated names are not a request read two ways.
#[tokio::test]
async fn a_file_uploaded_to_gemini_is_not_read_as_a_request() {
    let h = Harness::start().await;
    let document = "\u{feff}{\"model\":\"a\",\"model\":\"b\"}";
    let path = "/upload/v1beta/files?uploadType=media";
    let answer = h.post_with(path, ("x-goog-api-key", KEY), document).await.into_body().collect().await;
    let answer = answer.expect("body").to_bytes();
    let answer = String::from_utf8_lossy(&answer);
    assert!(!answer.contains("byte-order mark") && !answer.contains("more than once"), "{answer}");
    assert_eq!(h.last_request().body, document.as_bytes(), "forwarded as sent");
}

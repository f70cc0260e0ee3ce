//! Requests priced as their provider bills them, through the `recovea` binary: a credential prices
//! its models in its own namespace (an OpenAI-compatible provider at its own prices, never another
//! provider's), at its own fallback or its namespace's, and the admin CLI says which.

use std::path::Path;
use std::time::Duration;

use http::{Method, StatusCode};
use recovea_testkit::{Behaviour, MockProvider};
use serde_json::{Value, json};

#[path = "support/harness.rs"]
mod harness;

use harness::{Serve, Tenant, call, temp_dir};

const TOKEN: &str = "pricing-test-token-0123456789abcdef01234";

fn start(data_dir: &Path, mock_url: &str) -> Serve {
    Serve::start(data_dir, mock_url, &["--admin-token", TOKEN])
}

impl Serve {
    async fn ok(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let (status, value) = self.admin_call(TOKEN, method, path, body).await;
        assert!(status.is_success(), "{path}: {status} {value}");
        value
    }

    /// The receipt of request `request_id`, once the ledger has it.
    async fn receipt(&self, org_id: &str, request_id: &str) -> Value {
        harness::eventually(Duration::from_secs(10), "the receipt", || async {
            let page = self.ok(Method::GET, &format!("/orgs/{org_id}/receipts?limit=1000"), None).await;
            page["receipts"].as_array()?.iter().find(|r| r["request_id"] == request_id).cloned()
        })
        .await
    }

    /// A chat of `model` through the credential named `route`, reporting 1,000 tokens each way:
    /// its request id.
    async fn chat(&self, mock: &MockProvider, secret: &str, route: &str, model: &str) -> String {
        mock.script(
            Behaviour::default()
                .usage(json!({"prompt_tokens": 1000, "completion_tokens": 1000, "total_tokens": 2000})),
        );
        let body = json!({"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}]});
        let auth = format!("Bearer {secret}");
        let answer = call(
            Method::POST,
            &format!("{}/{route}/v1/chat/completions", self.gateway),
            &[("authorization", &auth)],
            Some(body),
        )
        .await;
        assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.body);
        answer.headers["x-request-id"].to_str().expect("id").to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_compatible_provider_is_priced_in_its_namespace_with_no_setup() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("namespace");
    let serve = start(&dir, &mock.url());
    let Tenant { org_id, secret, .. } = serve.organization(TOKEN, &[]).await;
    let credential = |namespace: Option<&str>, fallback: Option<(&str, &str)>| {
        let mut body = json!({"kind": "openai", "api_key": "sk-groq-0123456789", "base_url": mock.url()});
        if let Some(namespace) = namespace {
            body["price_namespace"] = json!(namespace);
        }
        if let Some((input, output)) = fallback {
            body["fallback_input_per_mtok_usd"] = json!(input);
            body["fallback_output_per_mtok_usd"] = json!(output);
        }
        body
    };
    serve.ok(Method::PUT, &format!("/orgs/{org_id}/providers/groq"), Some(credential(None, None))).await;

    // Groq's own price, $0.59 and $0.79 per million, not o1-pro's: 1,000 tokens each way.
    let llama = serve.chat(&mock, &secret, "groq", "llama-3.3-70b-versatile").await;
    let receipt = serve.receipt(&org_id, &llama).await;
    assert_eq!(receipt["cost_usd"], "0.00138");
    assert_eq!(
        (&receipt["priced"], &receipt["priced_as"]),
        (&json!(true), &json!("groq/llama-3.3-70b-versatile"))
    );

    // A model Groq's namespace does not know is never another provider's: the namespace's
    // dearest prices, and said so.
    let gpt = serve.chat(&mock, &secret, "groq", "gpt-4o").await;
    let receipt = serve.receipt(&org_id, &gpt).await;
    assert_eq!((&receipt["priced"], &receipt["priced_as"]), (&json!(false), &json!("fallback:groq")));

    // The credential's own fallback (a self-hosted model costs nothing), and the CLI saying which.
    serve
        .ok(Method::PUT, &format!("/orgs/{org_id}/providers/groq"), Some(credential(None, Some(("0", "0")))))
        .await;
    let free = harness::eventually(Duration::from_secs(5), "the new credential in force", || async {
        let id = serve.chat(&mock, &secret, "groq", "my-finetune").await;
        let receipt = serve.receipt(&org_id, &id).await;
        (receipt["priced_as"] == "fallback:credential").then_some(receipt)
    })
    .await;
    assert_eq!((&free["cost_usd"], &free["priced"]), (&json!("0.00"), &json!(false)));
    let said: Value = serde_json::from_str(
        &serve.admin_cli(TOKEN, &["prices", "get", "my-finetune", "--org", &org_id, "--provider", "groq"]),
    )
    .expect("JSON");
    assert_eq!(said["credential"]["price_namespace"], "groq");
    assert_eq!(said["credential"]["fallback"], "credential");
    assert_eq!(
        (&said["priced_as"], &said["input_per_mtok_usd"]),
        (&json!("fallback:credential"), &json!("0.00"))
    );
    let llama: Value = serde_json::from_str(&serve.admin_cli(
        TOKEN,
        &["prices", "get", "llama-3.3-70b-versatile", "--org", &org_id, "--provider", "groq"],
    ))
    .expect("JSON");
    assert_eq!(
        (&llama["entry"]["model"], &llama["input_per_mtok_usd"]),
        (&json!("groq/llama-3.3-70b-versatile"), &json!("0.59"))
    );

    // A namespace set for a credential applies whatever its name; the CLI sets it.
    serve.admin_cli(
        TOKEN,
        &[
            "providers",
            "set",
            "--org",
            &org_id,
            "--name",
            "fast",
            "--kind",
            "openai",
            "--api-key",
            "sk-fast-0123456789",
            "--base-url",
            &mock.url(),
            "--price-namespace",
            "groq",
        ],
    );
    let fast = harness::eventually(Duration::from_secs(5), "the credential in force", || async {
        let id = serve.chat(&mock, &secret, "fast", "llama-3.3-70b-versatile").await;
        let receipt = serve.receipt(&org_id, &id).await;
        (receipt["priced_as"] == "groq/llama-3.3-70b-versatile").then_some(receipt)
    })
    .await;
    assert_eq!(fast["cost_usd"], "0.00138");
    let listed = serve.ok(Method::GET, &format!("/orgs/{org_id}/providers"), None).await;
    let fast = listed["providers"].as_array().expect("list").iter().find(|p| p["name"] == "fast").cloned();
    assert_eq!(fast.expect("fast")["price_namespace"], "groq");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credentials_pricing_is_checked_as_it_is_set() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("namespace-checks");
    let serve = start(&dir, &mock.url());
    let Tenant { org_id, .. } = serve.organization(TOKEN, &[]).await;
    for (body, message) in [
        (
            json!({"kind": "openai", "api_key": "sk-0123456789", "price_namespace": "Bad Name"}),
            "price_namespace: 1 to 64 characters of a-z, 0-9, '-', '_' and '.'",
        ),
        (
            json!({"kind": "openai", "api_key": "sk-0123456789", "fallback_input_per_mtok_usd": "1"}),
            "fallback_input_per_mtok_usd and fallback_output_per_mtok_usd: give both, or neither",
        ),
        (
            json!({"kind": "openai", "api_key": "sk-0123456789", "fallback_input_per_mtok_usd": "-1", "fallback_output_per_mtok_usd": "1"}),
            "fallback_input_per_mtok_usd: expected dollars per million tokens, 0 or more",
        ),
    ] {
        let (status, answer) =
            serve.admin_call(TOKEN, Method::PUT, &format!("/orgs/{org_id}/providers/groq"), Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert_eq!(answer["error"]["message"], message);
    }
}

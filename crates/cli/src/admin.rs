//! `recovea admin`: each subcommand is one call of the admin API, whose JSON answer it prints.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use http::Method;
use recovea_control::client::AdminClient;
use serde_json::{Value, json};

use crate::data_dir;

#[derive(Args)]
pub(crate) struct AdminArgs {
    /// Where the admin API listens.
    #[arg(long, env = "RECOVEA_ADMIN_URL", default_value = "http://127.0.0.1:8081")]
    admin_url: String,
    /// Bearer token of the admin API (the admin token, or an organization token); when not given,
    /// the one saved in the data dir.
    #[arg(long, env = "RECOVEA_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Where `recovea serve` saved its admin token.
    #[arg(long, env = "RECOVEA_DATA_DIR", default_value = "./recovea-data")]
    data_dir: PathBuf,
    #[command(subcommand)]
    resource: Resource,
}

#[derive(Subcommand)]
enum Resource {
    /// Organizations.
    #[command(subcommand)]
    Orgs(Orgs),
    /// Recovea keys.
    #[command(subcommand)]
    Keys(Keys),
    /// Provider credentials.
    #[command(subcommand)]
    Providers(Providers),
    /// Spend caps.
    #[command(subcommand)]
    Caps(Caps),
    /// Each cap's current window and its spend.
    Spend {
        #[arg(long, env = "RECOVEA_ORG")]
        org: String,
    },
    /// Alerts raised by caps.
    Alerts {
        #[arg(long, env = "RECOVEA_ORG")]
        org: String,
    },
    /// Receipts of admitted requests.
    #[command(subcommand)]
    Receipts(Receipts),
    /// Model prices (the built-in table with overrides).
    #[command(subcommand)]
    Prices(Prices),
    /// The nodes that reported to the control plane: feed version, snapshot age, counters
    /// confirmed at, fail-open passes, last seen.
    Nodes,
    /// Node credentials: a token of its own for each node, revocable alone.
    #[command(subcommand)]
    NodeCredentials(NodeCredentials),
    /// Organization tokens: bearers of this API that reach one organization alone, as its admin
    /// or as a viewer.
    #[command(subcommand)]
    OrgTokens(OrgTokens),
    /// The audit log: every admin change, oldest first, as a table or as the API's JSON.
    Audit(AuditArgs),
}

#[derive(Args)]
struct AuditArgs {
    /// RFC 3339 time: changes made at or after it.
    #[arg(long, env = "RECOVEA_FROM")]
    from: Option<String>,
    /// RFC 3339 time: changes made before it.
    #[arg(long, env = "RECOVEA_TO")]
    to: Option<String>,
    /// Only changes to this organization's objects: its own trail, which an organization token
    /// may read.
    #[arg(long, env = "RECOVEA_ORG")]
    org: Option<String>,
    /// Only changes to objects of this kind: org, key, provider, cap, price, fallback_price, prices,
    /// node_credential, org_token.
    #[arg(long, env = "RECOVEA_AUDIT_OBJECT_KIND")]
    object_kind: Option<String>,
    /// Only changes of this action: create, update, revoke, delete, set, import.
    #[arg(long, env = "RECOVEA_AUDIT_ACTION")]
    action: Option<String>,
    /// Entries per page, 1 to 1000 (default 100).
    #[arg(long, env = "RECOVEA_LIMIT")]
    limit: Option<u32>,
    /// The next_cursor of the previous page.
    #[arg(long, env = "RECOVEA_CURSOR")]
    cursor: Option<String>,
    /// Print the API's JSON answer (with each entry's before and after) instead of a table.
    #[arg(long)]
    json: bool,
}

impl AuditArgs {
    /// An organization's own trail (`/orgs/{org}/audit`, which its tokens may read too) with
    /// `--org`, the whole log otherwise.
    fn path(&self) -> String {
        let pairs = [
            ("from", &self.from),
            ("to", &self.to),
            ("object_kind", &self.object_kind),
            ("action", &self.action),
            ("limit", &self.limit.map(|l| l.to_string())),
            ("cursor", &self.cursor),
        ];
        let encoded: Vec<String> = pairs
            .iter()
            .filter_map(|(name, value)| value.as_ref().map(|v| format!("{name}={}", encode(v))))
            .collect();
        let path = self
            .org
            .as_ref()
            .map_or_else(|| "/audit".to_owned(), |org| format!("/orgs/{}/audit", encode(org)));
        if encoded.is_empty() { path } else { format!("{path}?{}", encoded.join("&")) }
    }
}

/// Who made a change, in a table's cell: `operator`, `org_token:ID(NAME)`, `person:EMAIL` (its
/// subject when it has no email).
fn actor_cell(actor: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    match actor["type"].as_str() {
        Some("org_token") => format!("org_token:{}({})", text(&actor["id"]), text(&actor["name"])),
        Some("person") => {
            format!(
                "person:{}",
                actor["email"].as_str().map_or_else(|| text(&actor["subject"]), str::to_owned)
            )
        }
        other => other.unwrap_or("-").to_owned(),
    }
}

/// The audit log's answer as a table: one line per change, then how to get the next page.
fn audit_table(answer: &Value) -> String {
    const HEADER: [&str; 8] = ["AT", "ACTION", "KIND", "OBJECT", "ORG", "ACTOR", "AUTH", "CLIENT"];
    let text = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    let rows: Vec<[String; 8]> = answer["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            [
                text(&e["at"]),
                text(&e["action"]),
                text(&e["object_kind"]),
                text(&e["object_id"]),
                text(&e["org_id"]),
                actor_cell(&e["actor"]),
                text(&e["auth"]),
                text(&e["client"]),
            ]
        })
        .collect();
    let mut widths = HEADER.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let padded: Vec<String> =
            cells.iter().zip(widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        padded.join("  ").trim_end().to_owned() + "\n"
    };
    let mut out = line(&HEADER.map(str::to_owned));
    for row in &rows {
        out.push_str(&line(row));
    }
    if let Some(cursor) = answer["next_cursor"].as_str() {
        out.push_str(&format!("more: --cursor {cursor}\n"));
    }
    out
}

/// A rate limit to set, or `none` to remove it: the JSON of a `PATCH`.
fn limit_or_none(text: &str) -> Result<Value, String> {
    if text == "none" {
        return Ok(Value::Null);
    }
    text.parse::<u32>().map(|n| json!(n)).map_err(|_| format!("{text:?}: expected a number, or none"))
}

/// A webhook URL to set, or `none` to remove it: the JSON of a `PATCH`.
fn url_or_none(text: &str) -> Result<Value, String> {
    Ok(if text == "none" { Value::Null } else { Value::String(text.to_owned()) })
}

#[derive(Args)]
struct ReceiptFilter {
    #[arg(long, env = "RECOVEA_ORG")]
    org: String,
    /// RFC 3339 time: receipts started at or after it.
    #[arg(long, env = "RECOVEA_FROM")]
    from: Option<String>,
    /// RFC 3339 time: receipts started before it.
    #[arg(long, env = "RECOVEA_TO")]
    to: Option<String>,
    #[arg(long, env = "RECOVEA_KEY_ID")]
    key_id: Option<String>,
    /// Only receipts with this attribution tag, as key:value (team:search).
    #[arg(long, env = "RECOVEA_TAG")]
    tag: Option<String>,
    /// Only this model's receipts.
    #[arg(long, env = "RECOVEA_RECEIPT_MODEL")]
    model: Option<String>,
    /// Only receipts with this HTTP status.
    #[arg(long, env = "RECOVEA_RECEIPT_STATUS")]
    status: Option<u16>,
    /// Only receipts whose usage the provider reported (`provider`) or was estimated (`estimated`).
    #[arg(long, env = "RECOVEA_RECEIPT_USAGE_SOURCE", value_parser = ["provider", "estimated", "unmetered"])]
    usage_source: Option<String>,
    /// Only receipts whose provider was paid with the organization's key (`managed`) or the
    /// client's own (`client`).
    #[arg(long, env = "RECOVEA_RECEIPT_PROVIDER_KEY", value_parser = ["managed", "client"])]
    provider_key: Option<String>,
}

impl ReceiptFilter {
    fn query(&self, extra: &[(&str, Option<String>)]) -> String {
        let pairs = [
            ("from", self.from.clone()),
            ("to", self.to.clone()),
            ("key_id", self.key_id.clone()),
            ("tag", self.tag.clone()),
            ("model", self.model.clone()),
            ("status", self.status.map(|s| s.to_string())),
            ("usage_source", self.usage_source.clone()),
            ("provider_key", self.provider_key.clone()),
        ];
        let encoded: Vec<String> = pairs
            .iter()
            .chain(extra)
            .filter_map(|(name, value)| value.as_ref().map(|v| format!("{name}={}", encode(v))))
            .collect();
        if encoded.is_empty() { String::new() } else { format!("?{}", encoded.join("&")) }
    }
}

/// Percent-encodes a query value (RFC 3986 unreserved characters pass).
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[derive(Subcommand)]
enum Receipts {
    /// One page of receipts as JSON; pass the answer's next_cursor as --cursor for the next.
    List {
        #[command(flatten)]
        filter: ReceiptFilter,
        #[arg(long, env = "RECOVEA_LIMIT")]
        limit: Option<u32>,
        #[arg(long, env = "RECOVEA_CURSOR")]
        cursor: Option<String>,
    },
    /// Receipts as CSV on standard output.
    Export {
        #[command(flatten)]
        filter: ReceiptFilter,
    },
    /// Spend by day, key and model; with --group-by tag:KEY, by day and that tag's value.
    Summary {
        #[command(flatten)]
        filter: ReceiptFilter,
        /// tag:KEY (tag:team): sum by the values of that attribution tag.
        #[arg(long, env = "RECOVEA_GROUP_BY")]
        group_by: Option<String>,
    },
}

#[derive(Subcommand)]
enum Caps {
    /// Creates a cap; with --hard-stop it refuses at the line (402), without it only counts and alerts.
    Create {
        #[arg(long, env = "RECOVEA_ORG")]
        org: String,
        #[arg(long, env = "RECOVEA_CAP_SCOPE", value_parser = ["organization", "key"], default_value = "organization")]
        scope: String,
        /// The key a cap of scope `key` covers.
        #[arg(long, env = "RECOVEA_KEY_ID")]
        key_id: Option<String>,
        #[arg(long, env = "RECOVEA_CAP_WINDOW", value_parser = ["day", "week", "month"])]
        window: String,
        /// USD, as a decimal string.
        #[arg(long, env = "RECOVEA_CAP_LIMIT")]
        limit: String,
        /// Refuse at the line (402): `--hard-stop` alone or `--hard-stop=true`; off unless given.
        #[arg(long, env = "RECOVEA_CAP_HARD_STOP", num_args = 0..=1,
              default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
        hard_stop: Option<bool>,
        /// Fractions of the limit, comma-separated (default 0.5,0.8,1.0).
        #[arg(long, env = "RECOVEA_CAP_ALERT_AT", value_delimiter = ',')]
        alert_at: Option<Vec<String>>,
        #[arg(long, env = "RECOVEA_CAP_ALERT_WEBHOOK")]
        alert_webhook: Option<String>,
    },
    List {
        #[arg(long, env = "RECOVEA_ORG")]
        org: String,
    },
    /// One cap.
    Get {
        cap: String,
    },
    /// Changes a cap's limit, hard stop or alerts.
    Update {
        cap: String,
        #[arg(long, env = "RECOVEA_CAP_LIMIT")]
        limit: Option<String>,
        /// `--hard-stop` alone or `=true` turns it on, `--hard-stop=false` off.
        #[arg(long, env = "RECOVEA_CAP_HARD_STOP", num_args = 0..=1, default_missing_value = "true",
              value_parser = clap::builder::BoolishValueParser::new())]
        hard_stop: Option<bool>,
        #[arg(long, env = "RECOVEA_CAP_ALERT_AT", value_delimiter = ',')]
        alert_at: Option<Vec<String>>,
        /// A URL, or `none` to remove the webhook.
        #[arg(long, env = "RECOVEA_CAP_ALERT_WEBHOOK", value_parser = url_or_none)]
        alert_webhook: Option<Value>,
    },
    Delete {
        cap: String,
    },
}

/// Alert thresholds as given on the command line, as JSON numbers.
fn thresholds(values: &[String]) -> Result<Value, String> {
    values
        .iter()
        .map(|v| {
            serde_json::from_str::<serde_json::Number>(v.trim())
                .map_err(|_| format!("--alert-at: {v:?} is not a number"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(|numbers| Value::Array(numbers.into_iter().map(Value::Number).collect()))
}

#[derive(Subcommand)]
enum Prices {
    /// Lists the table in force, each entry's source, and the fallback price per provider kind.
    List,
    /// Resolves a model name as the gateway prices it, and says where the price came from; given
    /// an organization and one of its credentials (`--org`, `--provider`), as a request through
    /// that credential: its price namespace first, then its fallback.
    Get {
        model: String,
        #[arg(long, env = "RECOVEA_ORG", requires = "provider")]
        org: Option<String>,
        #[arg(long, env = "RECOVEA_PROVIDER_NAME", requires = "org")]
        provider: Option<String>,
    },
    /// Removes a model's override: back to the built-in price, as a new revision.
    Delete { model: String },
    /// Imports a price file (the built-in table's format, or LiteLLM's
    /// model_prices_and_context_window.json) as one revision.
    Import { file: std::path::PathBuf },
    /// Sets a provider kind's (openai, anthropic, gemini) fallback price: what a model without a
    /// price costs.
    SetFallback {
        kind: String,
        #[arg(long, env = "RECOVEA_PRICE_INPUT")]
        input: String,
        #[arg(long, env = "RECOVEA_PRICE_OUTPUT")]
        output: String,
    },
    /// Removes a provider kind's fallback price: computed from the table again.
    DeleteFallback { kind: String },
    /// Sets a model's price per million tokens (USD decimal strings): a new revision of the table.
    Set {
        model: String,
        /// The provider kind (openai, anthropic, azure_openai, gemini) that serves the model.
        #[arg(long, env = "RECOVEA_PRICE_KIND")]
        kind: Option<String>,
        #[arg(long, env = "RECOVEA_PRICE_INPUT")]
        input: String,
        #[arg(long, env = "RECOVEA_PRICE_OUTPUT")]
        output: String,
        #[arg(long, env = "RECOVEA_PRICE_CACHED_INPUT")]
        cached_input: Option<String>,
        #[arg(long, env = "RECOVEA_PRICE_CACHE_WRITE")]
        cache_write: Option<String>,
    },
}

#[derive(Subcommand)]
enum Orgs {
    Create {
        #[arg(long, env = "RECOVEA_ORG_NAME")]
        name: String,
        /// Comma-separated models the organization's keys may use: exact names and `prefix*`
        /// (`gpt-4o-mini,claude-*`); left out, every model.
        #[arg(long, env = "RECOVEA_ORG_ALLOWED_MODELS")]
        allowed_models: Option<String>,
        /// Comma-separated provider paths the organization's keys may call: exact paths and
        /// `/prefix*` (`/v1/chat/completions,/v1/embeddings`); left out, every endpoint.
        #[arg(long, env = "RECOVEA_ORG_ALLOWED_ENDPOINTS")]
        allowed_endpoints: Option<String>,
        /// The most requests of the organization's keys in flight at once on each node.
        #[arg(long, env = "RECOVEA_ORG_MAX_CONCURRENT_REQUESTS")]
        max_concurrent_requests: Option<u32>,
    },
    /// Changes an organization's model and endpoint allowlists and its limit of requests in flight.
    Update {
        org: String,
        /// Comma-separated models the organization's keys may use (`""`: none).
        #[arg(long, env = "RECOVEA_ORG_ALLOWED_MODELS", conflicts_with = "allow_all_models")]
        allowed_models: Option<String>,
        /// Removes the allowlist: every model.
        #[arg(long, env = "RECOVEA_ORG_ALLOW_ALL_MODELS")]
        allow_all_models: bool,
        /// Comma-separated provider paths the organization's keys may call (`""`: none).
        #[arg(long, env = "RECOVEA_ORG_ALLOWED_ENDPOINTS", conflicts_with = "allow_all_endpoints")]
        allowed_endpoints: Option<String>,
        /// Removes the endpoint allowlist: every endpoint.
        #[arg(long, env = "RECOVEA_ORG_ALLOW_ALL_ENDPOINTS")]
        allow_all_endpoints: bool,
        /// The most requests in flight at once on each node (`none` removes the limit).
        #[arg(long, env = "RECOVEA_ORG_MAX_CONCURRENT_REQUESTS", value_parser = limit_or_none)]
        max_concurrent_requests: Option<Value>,
    },
    List,
    Get {
        org: String,
    },
}

/// `--allowed-models a,b*` (or `--allowed-endpoints /v1/a,/v1/b*`) as the admin API's list; `""` is
/// the empty list (nothing).
fn model_list(text: &str) -> Value {
    let models: Vec<&str> = text.split(',').map(str::trim).filter(|m| !m.is_empty()).collect();
    json!(models)
}

/// The endpoint allowlist and the limit of requests in flight of a new key or organization.
fn rules_body(body: &mut Value, allowed_endpoints: Option<String>, max_concurrent_requests: Option<u32>) {
    if let Some(text) = allowed_endpoints {
        body["allowed_endpoints"] = model_list(&text);
    }
    if let Some(n) = max_concurrent_requests {
        body["max_concurrent_requests"] = json!(n);
    }
}

/// The rules of a key's or an organization's patch: its model and endpoint allowlists (each a
/// list, or `true` to remove it) and its limit of requests in flight (`null` removes it).
fn rules_patch(
    body: &mut Value,
    (allowed_models, allow_all_models): (Option<String>, bool),
    (allowed_endpoints, allow_all_endpoints): (Option<String>, bool),
    max_concurrent_requests: Option<Value>,
) {
    list_patch(body, "allowed_models", allowed_models, allow_all_models);
    list_patch(body, "allowed_endpoints", allowed_endpoints, allow_all_endpoints);
    if let Some(limit) = max_concurrent_requests {
        body["max_concurrent_requests"] = limit;
    }
}

/// An allowlist member of a patch (`allowed_models`, `allowed_endpoints`): a list, `null`
/// (everything), or left out.
fn list_patch(body: &mut Value, member: &str, list: Option<String>, allow_all: bool) {
    if allow_all {
        body[member] = Value::Null;
    } else if let Some(text) = list {
        body[member] = model_list(&text);
    }
}

#[derive(Subcommand)]
enum Keys {
    /// Creates a key and prints its secret (shown only this once).
    Create {
        #[arg(long, env = "RECOVEA_ORG")]
        org: String,
        #[arg(long, env = "RECOVEA_KEY_NAME")]
        name: String,
        /// RFC 3339 time after which the key is refused.
        #[arg(long, env = "RECOVEA_KEY_EXPIRES_AT")]
        expires_at: Option<String>,
        /// Requests a minute this key may make (a minute's worth may come at once).
        #[arg(long, env = "RECOVEA_KEY_REQUESTS_PER_MINUTE")]
        requests_per_minute: Option<u32>,
        /// Tokens (input and output) a minute this key may use.
        #[arg(long, env = "RECOVEA_KEY_TOKENS_PER_MINUTE")]
        tokens_per_minute: Option<u32>,
        /// Comma-separated models this key may use: exact names and `prefix*`
        /// (`gpt-4o-mini,claude-*`); left out, every model its organization allows.
        #[arg(long, env = "RECOVEA_KEY_ALLOWED_MODELS")]
        allowed_models: Option<String>,
        /// Comma-separated provider paths this key may call: exact paths and `/prefix*`
        /// (`/v1/chat/completions,/v1/embeddings`); left out, every endpoint its organization allows.
        #[arg(long, env = "RECOVEA_KEY_ALLOWED_ENDPOINTS")]
        allowed_endpoints: Option<String>,
        /// The most requests of this key in flight at once on each node.
        #[arg(long, env = "RECOVEA_KEY_MAX_CONCURRENT_REQUESTS")]
        max_concurrent_requests: Option<u32>,
    },
    /// Changes a key's rate limits and limit of requests in flight (`none` removes one) and its
    /// model and endpoint allowlists.
    Update {
        key: String,
        #[arg(long, env = "RECOVEA_KEY_REQUESTS_PER_MINUTE", value_parser = limit_or_none)]
        requests_per_minute: Option<Value>,
        #[arg(long, env = "RECOVEA_KEY_TOKENS_PER_MINUTE", value_parser = limit_or_none)]
        tokens_per_minute: Option<Value>,
        /// Comma-separated models this key may use (`""`: none).
        #[arg(long, env = "RECOVEA_KEY_ALLOWED_MODELS", conflicts_with = "allow_all_models")]
        allowed_models: Option<String>,
        /// Removes the key's allowlist: every model its organization allows.
        #[arg(long, env = "RECOVEA_KEY_ALLOW_ALL_MODELS")]
        allow_all_models: bool,
        /// Comma-separated provider paths this key may call (`""`: none).
        #[arg(long, env = "RECOVEA_KEY_ALLOWED_ENDPOINTS", conflicts_with = "allow_all_endpoints")]
        allowed_endpoints: Option<String>,
        /// Removes the key's endpoint allowlist: every endpoint its organization allows.
        #[arg(long, env = "RECOVEA_KEY_ALLOW_ALL_ENDPOINTS")]
        allow_all_endpoints: bool,
        #[arg(long, env = "RECOVEA_KEY_MAX_CONCURRENT_REQUESTS", value_parser = limit_or_none)]
        max_concurrent_requests: Option<Value>,
    },
    List {
        #[arg(long, env = "RECOVEA_ORG")]
        org: String,
    },
    /// A key (never its secret): its limits, expiry and revocation.
    Get {
        key: String,
    },
    Revoke {
        key: String,
    },
}

#[derive(Subcommand)]
enum NodeCredentials {
    /// Issues a credential and prints its token (shown only this once): give it to one node as
    /// its --node-token.
    Create {
        #[arg(long, env = "RECOVEA_NODE_CREDENTIAL_NAME")]
        name: String,
    },
    /// The credentials, revoked ones included (never their tokens).
    List,
    /// Revokes a credential: every control plane refuses its token from the next call on.
    Revoke { credential: String },
}

#[derive(Subcommand)]
enum OrgTokens {
    /// Issues a token and prints its secret (shown only this once): the organization's bearer of
    /// the admin API, as this command's --admin-token.
    Create {
        #[arg(long, env = "RECOVEA_ORG")]
        org: String,
        #[arg(long, env = "RECOVEA_ORG_TOKEN_NAME")]
        name: String,
        /// admin: everything of its organization that is not the operator's; viewer: reads only.
        #[arg(long, env = "RECOVEA_ORG_TOKEN_ROLE", value_parser = ["admin", "viewer"])]
        role: String,
        /// RFC 3339 time from which the token no longer opens the API.
        #[arg(long, env = "RECOVEA_ORG_TOKEN_EXPIRES_AT")]
        expires_at: Option<String>,
    },
    /// The organization's tokens, revoked ones included (never their secrets).
    List {
        #[arg(long, env = "RECOVEA_ORG")]
        org: String,
    },
    /// Revokes a token: every control plane refuses it from the next call on.
    Revoke { token: String },
}

#[derive(Subcommand)]
enum Providers {
    /// Creates or replaces the organization's credential called NAME.
    Set {
        #[arg(long, env = "RECOVEA_ORG")]
        org: String,
        /// `openai`, `anthropic`, `gemini` and `azure` serve the default routes; other names serve
        /// `/{name}/v1/...` (and `/{name}/v1beta/...`, `/{name}/openai/...`).
        #[arg(long, env = "RECOVEA_PROVIDER_NAME")]
        name: String,
        #[arg(long, env = "RECOVEA_PROVIDER_KIND", value_parser = ["openai", "anthropic", "azure_openai", "gemini"])]
        kind: String,
        #[arg(long, env = "RECOVEA_PROVIDER_API_KEY", hide_env_values = true)]
        api_key: String,
        /// The provider's root, without the version path (for example https://api.groq.com/openai);
        /// for azure_openai, required: the resource endpoint, https://NAME.openai.azure.com.
        #[arg(long, env = "RECOVEA_PROVIDER_BASE_URL")]
        base_url: Option<String>,
        /// The price namespace its models resolve in first (groq, together_ai, mistral...); left
        /// out: its name's, when the price table has one.
        #[arg(long, env = "RECOVEA_PROVIDER_PRICE_NAMESPACE")]
        price_namespace: Option<String>,
        /// Its own fallback price per million input and output tokens (USD), for the models no
        /// entry prices: 0 for a self-hosted model. Both or neither.
        #[arg(long, env = "RECOVEA_PROVIDER_FALLBACK_INPUT", requires = "fallback_output")]
        fallback_input: Option<String>,
        #[arg(long, env = "RECOVEA_PROVIDER_FALLBACK_OUTPUT", requires = "fallback_input")]
        fallback_output: Option<String>,
    },
    List {
        #[arg(long, env = "RECOVEA_ORG")]
        org: String,
    },
}

pub(crate) async fn run(args: AdminArgs) -> Result<(), String> {
    let token = args.admin_token.or_else(|| data_dir::saved_admin_token(&args.data_dir)).ok_or_else(|| {
        format!(
            "no admin token: pass --admin-token (or RECOVEA_ADMIN_TOKEN), or run next to the data dir of `recovea serve` ({})",
            args.data_dir.display()
        )
    })?;
    let client = AdminClient::new(&args.admin_url, &token);
    let (method, path, body): (Method, String, Option<Value>) = match args.resource {
        Resource::Orgs(Orgs::Create { name, allowed_models, allowed_endpoints, max_concurrent_requests }) => {
            let mut body = json!({ "name": name });
            if let Some(text) = allowed_models {
                body["allowed_models"] = model_list(&text);
            }
            rules_body(&mut body, allowed_endpoints, max_concurrent_requests);
            (Method::POST, "/orgs".into(), Some(body))
        }
        Resource::Orgs(Orgs::Update {
            org,
            allowed_models,
            allow_all_models,
            allowed_endpoints,
            allow_all_endpoints,
            max_concurrent_requests,
        }) => {
            let mut body = json!({});
            let (models, endpoints) =
                ((allowed_models, allow_all_models), (allowed_endpoints, allow_all_endpoints));
            rules_patch(&mut body, models, endpoints, max_concurrent_requests);
            (Method::PATCH, format!("/orgs/{org}"), Some(body))
        }
        Resource::Orgs(Orgs::List) => (Method::GET, "/orgs".into(), None),
        Resource::Orgs(Orgs::Get { org }) => (Method::GET, format!("/orgs/{org}"), None),
        Resource::Keys(Keys::Create {
            org,
            name,
            expires_at,
            requests_per_minute,
            tokens_per_minute,
            allowed_models,
            allowed_endpoints,
            max_concurrent_requests,
        }) => {
            let mut body = json!({ "name": name });
            if let Some(at) = expires_at {
                body["expires_at"] = Value::String(at);
            }
            if let Some(n) = requests_per_minute {
                body["requests_per_minute"] = json!(n);
            }
            if let Some(n) = tokens_per_minute {
                body["tokens_per_minute"] = json!(n);
            }
            if let Some(text) = allowed_models {
                body["allowed_models"] = model_list(&text);
            }
            rules_body(&mut body, allowed_endpoints, max_concurrent_requests);
            (Method::POST, format!("/orgs/{org}/keys"), Some(body))
        }
        Resource::Keys(Keys::List { org }) => (Method::GET, format!("/orgs/{org}/keys"), None),
        Resource::Keys(Keys::Update {
            key,
            requests_per_minute,
            tokens_per_minute,
            allowed_models,
            allow_all_models,
            allowed_endpoints,
            allow_all_endpoints,
            max_concurrent_requests,
        }) => {
            let mut body = json!({});
            if let Some(limit) = requests_per_minute {
                body["requests_per_minute"] = limit;
            }
            if let Some(limit) = tokens_per_minute {
                body["tokens_per_minute"] = limit;
            }
            let (models, endpoints) =
                ((allowed_models, allow_all_models), (allowed_endpoints, allow_all_endpoints));
            rules_patch(&mut body, models, endpoints, max_concurrent_requests);
            (Method::PATCH, format!("/keys/{key}"), Some(body))
        }
        Resource::Keys(Keys::Get { key }) => (Method::GET, format!("/keys/{key}"), None),
        Resource::Keys(Keys::Revoke { key }) => (Method::POST, format!("/keys/{key}/revoke"), None),
        Resource::Providers(Providers::Set {
            org,
            name,
            kind,
            api_key,
            base_url,
            price_namespace,
            fallback_input,
            fallback_output,
        }) => {
            let mut body = json!({ "kind": kind, "api_key": api_key });
            for (field, value) in [
                ("base_url", base_url),
                ("price_namespace", price_namespace),
                ("fallback_input_per_mtok_usd", fallback_input),
                ("fallback_output_per_mtok_usd", fallback_output),
            ] {
                if let Some(value) = value {
                    body[field] = Value::String(value);
                }
            }
            (Method::PUT, format!("/orgs/{org}/providers/{name}"), Some(body))
        }
        Resource::Providers(Providers::List { org }) => (Method::GET, format!("/orgs/{org}/providers"), None),
        Resource::Receipts(Receipts::List { filter, limit, cursor }) => {
            let query = filter.query(&[("limit", limit.map(|l| l.to_string())), ("cursor", cursor)]);
            (Method::GET, format!("/orgs/{}/receipts{query}", filter.org), None)
        }
        Resource::Receipts(Receipts::Export { filter }) => {
            let query = filter.query(&[("format", Some("csv".into()))]);
            let csv = client
                .call_raw(Method::GET, &format!("/orgs/{}/receipts{query}", filter.org), None)
                .await
                .map_err(|e| e.to_string())?;
            print!("{}", String::from_utf8_lossy(&csv));
            return Ok(());
        }
        Resource::Receipts(Receipts::Summary { filter, group_by }) => {
            let query = filter.query(&[("group_by", group_by)]);
            (Method::GET, format!("/orgs/{}/receipts/summary{query}", filter.org), None)
        }
        Resource::Caps(Caps::Create {
            org,
            scope,
            key_id,
            window,
            limit,
            hard_stop,
            alert_at,
            alert_webhook,
        }) => {
            let hard_stop = hard_stop.unwrap_or(false);
            let mut body =
                json!({ "scope": scope, "window": window, "limit_usd": limit, "hard_stop": hard_stop });
            if let Some(key) = key_id {
                body["key_id"] = Value::String(key);
            }
            if let Some(values) = alert_at {
                body["alert_at"] = thresholds(&values)?;
            }
            if let Some(url) = alert_webhook {
                body["alert_webhook"] = Value::String(url);
            }
            (Method::POST, format!("/orgs/{org}/caps"), Some(body))
        }
        Resource::Caps(Caps::List { org }) => (Method::GET, format!("/orgs/{org}/caps"), None),
        Resource::Caps(Caps::Get { cap }) => (Method::GET, format!("/caps/{cap}"), None),
        Resource::Caps(Caps::Update { cap, limit, hard_stop, alert_at, alert_webhook }) => {
            let mut body = json!({});
            if let Some(limit) = limit {
                body["limit_usd"] = Value::String(limit);
            }
            if let Some(hard_stop) = hard_stop {
                body["hard_stop"] = Value::Bool(hard_stop);
            }
            if let Some(values) = alert_at {
                body["alert_at"] = thresholds(&values)?;
            }
            if let Some(url) = alert_webhook {
                body["alert_webhook"] = url;
            }
            (Method::PATCH, format!("/caps/{cap}"), Some(body))
        }
        Resource::Caps(Caps::Delete { cap }) => (Method::DELETE, format!("/caps/{cap}"), None),
        Resource::Spend { org } => (Method::GET, format!("/orgs/{org}/spend"), None),
        Resource::Nodes => (Method::GET, "/nodes".into(), None),
        Resource::NodeCredentials(NodeCredentials::Create { name }) => {
            (Method::POST, "/node-credentials".into(), Some(json!({ "name": name })))
        }
        Resource::NodeCredentials(NodeCredentials::List) => (Method::GET, "/node-credentials".into(), None),
        Resource::NodeCredentials(NodeCredentials::Revoke { credential }) => {
            (Method::DELETE, format!("/node-credentials/{}", encode(&credential)), None)
        }
        Resource::OrgTokens(OrgTokens::Create { org, name, role, expires_at }) => {
            let mut body = json!({ "name": name, "role": role });
            if let Some(at) = expires_at {
                body["expires_at"] = Value::String(at);
            }
            (Method::POST, format!("/orgs/{}/tokens", encode(&org)), Some(body))
        }
        Resource::OrgTokens(OrgTokens::List { org }) => {
            (Method::GET, format!("/orgs/{}/tokens", encode(&org)), None)
        }
        Resource::OrgTokens(OrgTokens::Revoke { token }) => {
            (Method::POST, format!("/tokens/{}/revoke", encode(&token)), None)
        }
        Resource::Audit(audit) => {
            let answer = client.call(Method::GET, &audit.path(), None).await.map_err(|e| e.to_string())?;
            if audit.json {
                println!("{}", serde_json::to_string_pretty(&answer).unwrap_or_default());
            } else {
                print!("{}", audit_table(&answer));
            }
            return Ok(());
        }
        Resource::Alerts { org } => (Method::GET, format!("/orgs/{org}/alerts"), None),
        Resource::Prices(Prices::List) => (Method::GET, "/prices".into(), None),
        Resource::Prices(Prices::Get { model, org, provider }) => {
            let query = match (org, provider) {
                (Some(org), Some(provider)) => {
                    format!("?org={}&provider={}", encode(&org), encode(&provider))
                }
                _ => String::new(),
            };
            (Method::GET, format!("/prices/{}{query}", encode(&model)), None)
        }
        Resource::Prices(Prices::Delete { model }) => {
            (Method::DELETE, format!("/prices/{}", encode(&model)), None)
        }
        Resource::Prices(Prices::Import { file }) => {
            let text = std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            let answer = client
                .call_with_text(Method::POST, "/price-imports", text.into())
                .await
                .map_err(|e| e.to_string())?;
            println!("{}", serde_json::to_string_pretty(&answer).unwrap_or_default());
            return Ok(());
        }
        Resource::Prices(Prices::SetFallback { kind, input, output }) => {
            let body = json!({ "input_per_mtok_usd": input, "output_per_mtok_usd": output });
            (Method::PUT, format!("/fallback-prices/{}", encode(&kind)), Some(body))
        }
        Resource::Prices(Prices::DeleteFallback { kind }) => {
            (Method::DELETE, format!("/fallback-prices/{}", encode(&kind)), None)
        }
        Resource::Prices(Prices::Set { model, kind, input, output, cached_input, cache_write }) => {
            let mut body = json!({ "input_per_mtok_usd": input, "output_per_mtok_usd": output });
            if let Some(kind) = kind {
                body["kind"] = Value::String(kind);
            }
            if let Some(price) = cached_input {
                body["cached_input_per_mtok_usd"] = Value::String(price);
            }
            if let Some(price) = cache_write {
                body["cache_write_per_mtok_usd"] = Value::String(price);
            }
            (Method::PUT, format!("/prices/{}", encode(&model)), Some(body))
        }
    };
    let answer = client.call(method, &path, body).await.map_err(|e| e.to_string())?;
    println!("{}", serde_json::to_string_pretty(&answer).unwrap_or_default());
    Ok(())
}

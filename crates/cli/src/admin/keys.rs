//! `recovea admin keys`: Recovea keys, their limits and allowlists.

use clap::Subcommand;
use http::Method;
use recovea_control::requests::{Change, KeyPatch, NewKey};

use super::Call;
use super::rules::{limit_or_none, list, list_change};

#[derive(Subcommand)]
pub(super) enum Keys {
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
        requests_per_minute: Option<Change<u32>>,
        #[arg(long, env = "RECOVEA_KEY_TOKENS_PER_MINUTE", value_parser = limit_or_none)]
        tokens_per_minute: Option<Change<u32>>,
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
        max_concurrent_requests: Option<Change<u32>>,
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

impl Keys {
    pub(super) fn call(self) -> Result<Call, String> {
        Ok(match self {
            Self::Create {
                org,
                name,
                expires_at,
                requests_per_minute,
                tokens_per_minute,
                allowed_models,
                allowed_endpoints,
                max_concurrent_requests,
            } => {
                let body: NewKey = NewKey {
                    name,
                    expires_at,
                    requests_per_minute,
                    tokens_per_minute,
                    allowed_models: allowed_models.as_deref().map(list),
                    allowed_endpoints: allowed_endpoints.as_deref().map(list),
                    max_concurrent_requests,
                };
                Call::new(Method::POST, format!("/orgs/{org}/keys")).json(&body)?
            }
            Self::List { org } => Call::new(Method::GET, format!("/orgs/{org}/keys")),
            Self::Update {
                key,
                requests_per_minute,
                tokens_per_minute,
                allowed_models,
                allow_all_models,
                allowed_endpoints,
                allow_all_endpoints,
                max_concurrent_requests,
            } => {
                let body: KeyPatch = KeyPatch {
                    requests_per_minute,
                    tokens_per_minute,
                    allowed_models: list_change(allowed_models, allow_all_models),
                    allowed_endpoints: list_change(allowed_endpoints, allow_all_endpoints),
                    max_concurrent_requests,
                };
                Call::new(Method::PATCH, format!("/keys/{key}")).json(&body)?
            }
            Self::Get { key } => Call::new(Method::GET, format!("/keys/{key}")),
            Self::Revoke { key } => Call::new(Method::POST, format!("/keys/{key}/revoke")),
        })
    }
}

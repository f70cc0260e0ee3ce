//! `recovea admin orgs`: organizations, their allowlists and their limit of requests in flight.

use clap::Subcommand;
use http::Method;
use recovea_control::requests::{Change, NewOrg, OrgPatch};

use super::Call;
use super::rules::{limit_or_none, list, list_change};

#[derive(Subcommand)]
pub(super) enum Orgs {
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
        max_concurrent_requests: Option<Change<u32>>,
    },
    List,
    Get {
        org: String,
    },
}

impl Orgs {
    pub(super) fn call(self) -> Result<Call, String> {
        Ok(match self {
            Self::Create { name, allowed_models, allowed_endpoints, max_concurrent_requests } => {
                let body = NewOrg {
                    name,
                    allowed_models: allowed_models.as_deref().map(list),
                    allowed_endpoints: allowed_endpoints.as_deref().map(list),
                    max_concurrent_requests,
                };
                Call::new(Method::POST, "/orgs").json(&body)?
            }
            Self::Update {
                org,
                allowed_models,
                allow_all_models,
                allowed_endpoints,
                allow_all_endpoints,
                max_concurrent_requests,
            } => {
                let body: OrgPatch = OrgPatch {
                    allowed_models: list_change(allowed_models, allow_all_models),
                    allowed_endpoints: list_change(allowed_endpoints, allow_all_endpoints),
                    max_concurrent_requests,
                };
                Call::new(Method::PATCH, format!("/orgs/{org}")).json(&body)?
            }
            Self::List => Call::new(Method::GET, "/orgs"),
            Self::Get { org } => Call::new(Method::GET, format!("/orgs/{org}")),
        })
    }
}

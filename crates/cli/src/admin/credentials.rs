//! `recovea admin providers`, `node-credentials` and `org-tokens`: the credentials the gateway
//! holds for an organization, and the tokens that reach the control plane.

use clap::Subcommand;
use http::Method;
use recovea_control::requests::{NewNodeCredential, NewOrgToken, ProviderBody};

use super::{Call, encode};

#[derive(Subcommand)]
pub(super) enum NodeCredentials {
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
pub(super) enum OrgTokens {
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
pub(super) enum Providers {
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

impl Providers {
    pub(super) fn call(self) -> Result<Call, String> {
        Ok(match self {
            Self::Set {
                org,
                name,
                kind,
                api_key,
                base_url,
                price_namespace,
                fallback_input,
                fallback_output,
            } => {
                let body = ProviderBody {
                    kind,
                    base_url,
                    api_key,
                    price_namespace,
                    fallback_input_per_mtok_usd: fallback_input,
                    fallback_output_per_mtok_usd: fallback_output,
                };
                Call::new(Method::PUT, format!("/orgs/{org}/providers/{name}")).json(&body)?
            }
            Self::List { org } => Call::new(Method::GET, format!("/orgs/{org}/providers")),
        })
    }
}

impl NodeCredentials {
    pub(super) fn call(self) -> Result<Call, String> {
        Ok(match self {
            Self::Create { name } => {
                Call::new(Method::POST, "/node-credentials").json(&NewNodeCredential { name })?
            }
            Self::List => Call::new(Method::GET, "/node-credentials"),
            Self::Revoke { credential } => {
                Call::new(Method::DELETE, format!("/node-credentials/{}", encode(&credential)))
            }
        })
    }
}

impl OrgTokens {
    pub(super) fn call(self) -> Result<Call, String> {
        Ok(match self {
            Self::Create { org, name, role, expires_at } => {
                let body = NewOrgToken { name, role, expires_at };
                Call::new(Method::POST, format!("/orgs/{}/tokens", encode(&org))).json(&body)?
            }
            Self::List { org } => Call::new(Method::GET, format!("/orgs/{}/tokens", encode(&org))),
            Self::Revoke { token } => Call::new(Method::POST, format!("/tokens/{}/revoke", encode(&token))),
        })
    }
}

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
    /// Bearer token of the admin API; when not given, the one saved in the data dir.
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
}

#[derive(Subcommand)]
enum Orgs {
    Create {
        #[arg(long, env = "RECOVEA_ORG_NAME")]
        name: String,
    },
    List,
    Get {
        org: String,
    },
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
    },
    List {
        #[arg(long, env = "RECOVEA_ORG")]
        org: String,
    },
    Revoke {
        key: String,
    },
}

#[derive(Subcommand)]
enum Providers {
    /// Creates or replaces the organization's credential called NAME.
    Set {
        #[arg(long, env = "RECOVEA_ORG")]
        org: String,
        /// `openai` and `anthropic` serve the default routes; other names serve `/{name}/v1/...`.
        #[arg(long, env = "RECOVEA_PROVIDER_NAME")]
        name: String,
        #[arg(long, env = "RECOVEA_PROVIDER_KIND", value_parser = ["openai", "anthropic"])]
        kind: String,
        #[arg(long, env = "RECOVEA_PROVIDER_API_KEY", hide_env_values = true)]
        api_key: String,
        /// The provider's root, without the version path (for example https://api.groq.com/openai).
        #[arg(long, env = "RECOVEA_PROVIDER_BASE_URL")]
        base_url: Option<String>,
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
        Resource::Orgs(Orgs::Create { name }) => {
            (Method::POST, "/orgs".into(), Some(json!({ "name": name })))
        }
        Resource::Orgs(Orgs::List) => (Method::GET, "/orgs".into(), None),
        Resource::Orgs(Orgs::Get { org }) => (Method::GET, format!("/orgs/{org}"), None),
        Resource::Keys(Keys::Create { org, name, expires_at }) => {
            let mut body = json!({ "name": name });
            if let Some(at) = expires_at {
                body["expires_at"] = Value::String(at);
            }
            (Method::POST, format!("/orgs/{org}/keys"), Some(body))
        }
        Resource::Keys(Keys::List { org }) => (Method::GET, format!("/orgs/{org}/keys"), None),
        Resource::Keys(Keys::Revoke { key }) => (Method::POST, format!("/keys/{key}/revoke"), None),
        Resource::Providers(Providers::Set { org, name, kind, api_key, base_url }) => {
            let mut body = json!({ "kind": kind, "api_key": api_key });
            if let Some(url) = base_url {
                body["base_url"] = Value::String(url);
            }
            (Method::PUT, format!("/orgs/{org}/providers/{name}"), Some(body))
        }
        Resource::Providers(Providers::List { org }) => (Method::GET, format!("/orgs/{org}/providers"), None),
    };
    let answer = client.call(method, &path, body).await.map_err(|e| e.to_string())?;
    println!("{}", serde_json::to_string_pretty(&answer).unwrap_or_default());
    Ok(())
}

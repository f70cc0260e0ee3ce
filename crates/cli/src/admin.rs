//! `recovea admin`: each subcommand is one call of the admin API, whose JSON answer it prints.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use http::Method;
use recovea_control::client::AdminClient;
use serde_json::Value;

use crate::data_dir;
use audit::AuditArgs;
use caps::Caps;
use credentials::{NodeCredentials, OrgTokens, Providers};
use keys::Keys;
use orgs::Orgs;
use prices::Prices;
use receipts::Receipts;

mod audit;
mod caps;
mod credentials;
mod keys;
mod orgs;
mod prices;
mod receipts;
mod rules;

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

/// One call of the admin API: what it sends, and how its answer is printed.
pub(super) struct Call {
    method: Method,
    path: String,
    body: Vec<u8>,
    shown: Shown,
}

enum Shown {
    /// The JSON answer, pretty-printed.
    Json,
    /// The answer's bytes as they are (a CSV export).
    Raw,
    /// The JSON answer as this function writes it.
    Table(fn(&Value) -> String),
}

impl Call {
    pub(super) fn new(method: Method, path: impl Into<String>) -> Self {
        Self { method, path: path.into(), body: Vec::new(), shown: Shown::Json }
    }

    /// With `body`, one of the API's request types (`recovea_control::requests`).
    pub(super) fn json(self, body: &impl serde::Serialize) -> Result<Self, String> {
        let body = serde_json::to_vec(body).map_err(|e| format!("the request body: {e}"))?;
        Ok(Self { body, ..self })
    }

    /// With a file as its body, sent as it is: a price file, whose numbers must reach the server as
    /// written rather than through a JSON value's floats.
    pub(super) fn file(self, bytes: Vec<u8>) -> Self {
        Self { body: bytes, ..self }
    }

    pub(super) fn csv(self) -> Self {
        Self { shown: Shown::Raw, ..self }
    }

    pub(super) fn shown_as(self, table: fn(&Value) -> String) -> Self {
        Self { shown: Shown::Table(table), ..self }
    }

    async fn send(self, client: &AdminClient) -> Result<(), String> {
        let answer = client.call(self.method, &self.path, self.body).await.map_err(|e| e.to_string())?;
        let json = || serde_json::from_slice(&answer).unwrap_or(Value::Null);
        match self.shown {
            Shown::Raw => print!("{}", String::from_utf8_lossy(&answer)),
            Shown::Table(table) => print!("{}", table(&json())),
            Shown::Json => println!("{}", serde_json::to_string_pretty(&json()).unwrap_or_default()),
        }
        Ok(())
    }
}

pub(crate) async fn run(args: AdminArgs) -> Result<(), String> {
    let token = args.admin_token.or_else(|| data_dir::saved_admin_token(&args.data_dir)).ok_or_else(|| {
        format!(
            "no admin token: pass --admin-token (or RECOVEA_ADMIN_TOKEN), or run next to the data dir of `recovea serve` ({})",
            args.data_dir.display()
        )
    })?;
    let client = AdminClient::new(&args.admin_url, &token);
    let call = match args.resource {
        Resource::Orgs(orgs) => orgs.call()?,
        Resource::Keys(keys) => keys.call()?,
        Resource::Providers(providers) => providers.call()?,
        Resource::Caps(caps) => caps.call()?,
        Resource::Spend { org } => Call::new(Method::GET, format!("/orgs/{org}/spend")),
        Resource::Alerts { org } => Call::new(Method::GET, format!("/orgs/{org}/alerts")),
        Resource::Receipts(receipts) => receipts.call(),
        Resource::Prices(prices) => prices.call()?,
        Resource::Nodes => Call::new(Method::GET, "/nodes"),
        Resource::NodeCredentials(credentials) => credentials.call()?,
        Resource::OrgTokens(tokens) => tokens.call()?,
        Resource::Audit(audit) => audit.into(),
    };
    call.send(&client).await
}

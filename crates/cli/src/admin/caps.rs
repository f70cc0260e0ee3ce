//! `recovea admin caps`: spend caps, created, changed and deleted.

use clap::Subcommand;
use http::Method;
use recovea_control::requests::{CapPatch, Change, NewCap};
use serde_json::Number;

use super::Call;

#[derive(Subcommand)]
pub(super) enum Caps {
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
        alert_webhook: Option<Change<String>>,
    },
    Delete {
        cap: String,
    },
}

impl Caps {
    pub(super) fn call(self) -> Result<Call, String> {
        Ok(match self {
            Self::Create { org, scope, key_id, window, limit, hard_stop, alert_at, alert_webhook } => {
                let body: NewCap = NewCap {
                    scope,
                    key_id,
                    window,
                    limit_usd: limit,
                    hard_stop: hard_stop.unwrap_or(false),
                    alert_at: alert_at.as_deref().map(thresholds).transpose()?,
                    alert_webhook,
                };
                Call::new(Method::POST, format!("/orgs/{org}/caps")).json(&body)?
            }
            Self::List { org } => Call::new(Method::GET, format!("/orgs/{org}/caps")),
            Self::Get { cap } => Call::new(Method::GET, format!("/caps/{cap}")),
            Self::Update { cap, limit, hard_stop, alert_at, alert_webhook } => {
                let body: CapPatch = CapPatch {
                    limit_usd: limit,
                    hard_stop,
                    alert_at: alert_at.as_deref().map(thresholds).transpose()?,
                    alert_webhook,
                };
                Call::new(Method::PATCH, format!("/caps/{cap}")).json(&body)?
            }
            Self::Delete { cap } => Call::new(Method::DELETE, format!("/caps/{cap}")),
        })
    }
}

/// A webhook URL to set, or `none` to remove it.
fn url_or_none(text: &str) -> Result<Change<String>, String> {
    Ok(if text == "none" { Change::Remove } else { Change::Set(text.to_owned()) })
}

/// Alert thresholds as given on the command line, as JSON numbers.
fn thresholds(values: &[String]) -> Result<Vec<Number>, String> {
    values
        .iter()
        .map(|v| {
            serde_json::from_str::<Number>(v.trim()).map_err(|_| format!("--alert-at: {v:?} is not a number"))
        })
        .collect()
}

//! `recovea admin receipts`: pages of receipts, their CSV export and the spend summary.

use clap::{Args, Subcommand};
use http::Method;

use super::{Call, encode};

#[derive(Args)]
pub(super) struct ReceiptFilter {
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

#[derive(Subcommand)]
pub(super) enum Receipts {
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

impl Receipts {
    pub(super) fn call(self) -> Call {
        match self {
            Self::List { filter, limit, cursor } => {
                let query = filter.query(&[("limit", limit.map(|l| l.to_string())), ("cursor", cursor)]);
                Call::new(Method::GET, format!("/orgs/{}/receipts{query}", filter.org))
            }
            Self::Export { filter } => {
                let query = filter.query(&[("format", Some("csv".into()))]);
                Call::new(Method::GET, format!("/orgs/{}/receipts{query}", filter.org)).csv()
            }
            Self::Summary { filter, group_by } => {
                let query = filter.query(&[("group_by", group_by)]);
                Call::new(Method::GET, format!("/orgs/{}/receipts/summary{query}", filter.org))
            }
        }
    }
}

//! `recovea admin audit`: the audit log, as a table or as the API's JSON.

use clap::Args;
use http::Method;
use serde_json::Value;

use super::{Call, encode};

#[derive(Args)]
pub(super) struct AuditArgs {
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

/// The call, its answer printed as a table unless `--json` asks for the API's JSON.
impl From<AuditArgs> for Call {
    fn from(audit: AuditArgs) -> Self {
        let call = Call::new(Method::GET, audit.path());
        if audit.json { call } else { call.shown_as(audit_table) }
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

//! The audit log: who changed what, when, and the object before and after, one row per admin
//! change, written in the transaction of the change itself.
//!
//! The objects are recorded in the admin API's own shape (what `GET` answers for them), which
//! holds no secret: a key without its hash, a provider credential with its hint only. The shapes
//! are made here, from the store's records, so that a change and its row cannot disagree.

use recovea_core::endpoints::EndpointAllowlist;
use recovea_core::ids::{OrgId, OrgTokenId};
use recovea_core::models::ModelAllowlist;
use recovea_core::pricing::PriceWire;
use recovea_core::snapshot::ProviderKind;
use recovea_core::timestamp::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::rows::{Columns, corrupt};
use crate::{
    CapRecord, KeyRecord, NodeCredentialRecord, OrgRecord, OrgTokenRecord, PriceChange, PriceOverride,
    PriceTarget, ProviderRecord, Result,
};

/// How the author of a change proved who they are: which secret they presented. Who they are is
/// the [`AuditActor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditAuth {
    AdminToken,
    NodeToken,
    /// A console session, opened with a token or through single sign-on.
    ConsoleSession,
    /// An organization token, as a bearer of the admin API.
    OrgToken,
}

impl AuditAuth {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AdminToken => "admin_token",
            Self::NodeToken => "node_token",
            Self::ConsoleSession => "console_session",
            Self::OrgToken => "org_token",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "admin_token" => Some(Self::AdminToken),
            "node_token" => Some(Self::NodeToken),
            "console_session" => Some(Self::ConsoleSession),
            "org_token" => Some(Self::OrgToken),
            _ => None,
        }
    }
}

/// Who made a change, as every audit entry names them (the contract's `actor`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum AuditActor {
    /// The operator: the admin token, or a console session opened with it. Every change recorded
    /// before actors were is the operator's: there was no other identity.
    Operator,
    /// An organization token, by its id and its name when the change was made.
    OrgToken { id: OrgTokenId, name: String },
    /// A person signed in through single sign-on: the identity provider's subject, and the email
    /// it gave, if any.
    Person { subject: String, email: Option<String> },
}

impl AuditActor {
    /// As the API shows it and the `actor` column keeps it: `{"type": "operator"}`,
    /// `{"type": "org_token", "id", "name"}` or `{"type": "person", "subject", "email"}`.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|_| json!({ "type": "operator" }))
    }

    /// The `actor` column's text.
    pub(crate) fn to_text(&self) -> String {
        self.to_json().to_string()
    }

    /// From the `actor` column's text; `None` for text no writer of ours makes.
    pub(crate) fn from_text(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }
}

/// Who makes a change and when: given with every change, recorded in its audit row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditContext {
    /// The row's id, unique (the control plane mints `aud_` + a time-ordered token).
    pub id: String,
    pub at: Timestamp,
    pub auth: AuditAuth,
    pub actor: AuditActor,
    /// The address the change came from (`ip:port`), when known.
    pub client: Option<String>,
}

/// One row of the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    pub id: String,
    /// The state version the change made: rows are in the order their changes were committed, and
    /// a node serving this version or a later one serves the change.
    pub version: u64,
    pub at: Timestamp,
    pub auth: AuditAuth,
    pub actor: AuditActor,
    pub client: Option<String>,
    /// `create`, `update`, `revoke`, `delete`, `set` (a credential or price put), `import`.
    pub action: String,
    /// `org`, `key`, `provider`, `cap`, `price`, `fallback_price`, `prices` (an import),
    /// `node_credential`, `org_token`.
    pub object_kind: String,
    /// The object's id (a provider's and a price's name, a fallback price's kind, `import`).
    pub object_id: String,
    pub org_id: Option<OrgId>,
    /// The object before and after the change as JSON text; `None` where it did not exist.
    pub before: Option<String>,
    pub after: Option<String>,
}

/// Which rows to read, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    /// `at` at or after this.
    pub from: Option<Timestamp>,
    /// `at` before this.
    pub to: Option<Timestamp>,
    pub org_id: Option<OrgId>,
    pub object_kind: Option<String>,
    pub action: Option<String>,
    pub limit: u32,
    /// Continue after the row of this version.
    pub after_version: Option<u64>,
}

/// The columns of the `audit_log` table, in the order [`AuditEntry`] is read from them.
pub(crate) const AUDIT_COLUMNS: &str =
    "id, version, at, auth, client, action, object_kind, object_id, org_id, before_json, after_json, actor";

/// What a change did to one object, made into its row once the change is known.
pub(crate) struct Change {
    pub(crate) action: &'static str,
    pub(crate) object_kind: &'static str,
    pub(crate) object_id: String,
    pub(crate) org_id: Option<OrgId>,
    pub(crate) before: Option<Value>,
    pub(crate) after: Option<Value>,
}

impl Change {
    /// The row of this change, made by `context` as state `version`.
    pub(crate) fn entry(self, context: &AuditContext, version: u64) -> AuditEntry {
        AuditEntry {
            id: context.id.clone(),
            version,
            at: context.at,
            auth: context.auth,
            actor: context.actor.clone(),
            client: context.client.clone(),
            action: self.action.to_owned(),
            object_kind: self.object_kind.to_owned(),
            object_id: self.object_id,
            org_id: self.org_id,
            before: self.before.map(|v| v.to_string()),
            after: self.after.map(|v| v.to_string()),
        }
    }
}

/// Logs a committed change at `info`, on one line: what and who, never the object itself.
pub(crate) fn log(entry: &AuditEntry) {
    tracing::info!(
        audit_id = %entry.id,
        version = entry.version,
        action = %entry.action,
        object_kind = %entry.object_kind,
        object_id = %entry.object_id,
        org_id = entry.org_id.as_ref().map(tracing::field::display),
        auth = %entry.auth.as_str(),
        actor = %entry.actor.to_text(),
        client = entry.client.as_deref().map(tracing::field::display),
        "admin change"
    );
}

pub fn org_json(org: &OrgRecord) -> Value {
    json!({
        "id": org.id,
        "name": org.name,
        "created_at": org.created_at,
        "allowed_models": org.allowed_models.as_ref().map(ModelAllowlist::patterns),
        "allowed_endpoints": org.allowed_endpoints.as_ref().map(EndpointAllowlist::patterns),
        "max_concurrent_requests": org.max_concurrent_requests,
    })
}

/// A key as the admin API shows it: never its hash (the store has no secret to leak).
pub fn key_json(key: &KeyRecord) -> Value {
    json!({
        "requests_per_minute": key.limits.requests_per_minute,
        "tokens_per_minute": key.limits.tokens_per_minute,
        "id": key.id,
        "org_id": key.org_id,
        "name": key.name,
        "prefix": key.prefix,
        "created_at": key.created_at,
        "expires_at": key.expires_at,
        "revoked_at": key.revoked_at,
        "allowed_models": key.allowed_models.as_ref().map(ModelAllowlist::patterns),
        "allowed_endpoints": key.allowed_endpoints.as_ref().map(EndpointAllowlist::patterns),
        "max_concurrent_requests": key.max_concurrent_requests,
    })
}

/// A provider credential as the admin API shows it: the key's hint, never the sealed key, and its
/// base URL without the credentials it may carry.
pub fn provider_json(p: &ProviderRecord) -> Value {
    json!({
        "name": p.name,
        "kind": p.kind.as_str(),
        "base_url": p.base_url.as_deref().map(recovea_core::crypto::url_shown),
        "key_hint": p.key_hint,
        "price_namespace": p.price_namespace,
        "fallback_input_per_mtok_usd": p.fallback_price.map(|(input, _)| input.to_usd_string()),
        "fallback_output_per_mtok_usd": p.fallback_price.map(|(_, output)| output.to_usd_string()),
    })
}

/// A node credential as the admin API shows it: never its token nor the token's hash.
pub fn node_credential_json(credential: &NodeCredentialRecord) -> Value {
    json!({
        "id": credential.id,
        "name": credential.name,
        "created_at": credential.created_at,
        "revoked_at": credential.revoked_at,
    })
}

/// An organization token as the admin API shows it: never its secret nor the secret's hash.
pub fn org_token_json(token: &OrgTokenRecord) -> Value {
    json!({
        "id": token.id,
        "org_id": token.org_id,
        "name": token.name,
        "role": token.role.as_str(),
        "prefix": token.prefix,
        "created_at": token.created_at,
        "expires_at": token.expires_at,
        "revoked_at": token.revoked_at,
    })
}

/// Thousandths as an exact decimal fraction (`500` is `0.500`), as the admin API gives them.
pub fn permille_number(permille: u32) -> Value {
    serde_json::from_str(&format!("{}.{:03}", permille / 1000, permille % 1000)).unwrap_or(Value::Null)
}

pub fn cap_json(record: &CapRecord) -> Value {
    let cap = &record.cap;
    json!({
        "id": cap.id,
        "org_id": cap.org_id,
        "scope": cap.scope.as_str(),
        "key_id": cap.key_id,
        "window": cap.window.as_str(),
        "limit_usd": cap.limit,
        "hard_stop": cap.hard_stop,
        "alert_at": cap.alert_at_permille.iter().map(|p| permille_number(*p)).collect::<Vec<_>>(),
        "alert_webhook": cap.alert_webhook,
        "created_at": record.created_at,
    })
}

fn price_json(price: &PriceWire, kind: Option<ProviderKind>, revision: u64) -> Value {
    let mut body = serde_json::to_value(price).unwrap_or_else(|_| json!({}));
    body["kind"] = json!(kind.map(ProviderKind::as_str));
    body["revision"] = json!(revision);
    body
}

/// The audit row of a price table revision: one change is recorded as that price (`price` or
/// `fallback_price`, `set` or `delete`), several (an import) as one `prices` row whose before and
/// after map each target (`model:NAME`, `fallback:KIND`) to its price or `null`.
pub(crate) fn price_change(changes: &[PriceChange], in_force: &[PriceOverride], revision: u64) -> Change {
    let before_of = |target: &PriceTarget| {
        in_force
            .iter()
            .find(|set| &set.target == target)
            .map_or(Value::Null, |set| price_json(&set.price, set.kind, set.revision))
    };
    let after_of = |change: &PriceChange| {
        change.price.as_ref().map_or(Value::Null, |price| price_json(price, change.kind, revision))
    };
    if let [change] = changes {
        let (object_kind, object_id) = match &change.target {
            PriceTarget::Model(model) => ("price", model.clone()),
            PriceTarget::Fallback(kind) => ("fallback_price", kind.as_str().to_owned()),
        };
        let (before, after) = (before_of(&change.target), after_of(change));
        return Change {
            action: if change.price.is_some() { "set" } else { "delete" },
            object_kind,
            object_id,
            org_id: None,
            before: Some(before).filter(|v| !v.is_null()),
            after: Some(after).filter(|v| !v.is_null()),
        };
    }
    let name = |target: &PriceTarget| match target {
        PriceTarget::Model(model) => format!("model:{model}"),
        PriceTarget::Fallback(kind) => format!("fallback:{}", kind.as_str()),
    };
    let mut before = serde_json::Map::new();
    let mut after = serde_json::Map::new();
    for change in changes {
        before.insert(name(&change.target), before_of(&change.target));
        after.insert(name(&change.target), after_of(change));
    }
    Change {
        action: "import",
        object_kind: "prices",
        object_id: "import".to_owned(),
        org_id: None,
        before: Some(Value::Object(before)),
        after: Some(Value::Object(after)),
    }
}

pub(crate) fn org_created(org: &OrgRecord) -> Change {
    Change {
        action: "create",
        object_kind: "org",
        object_id: org.id.as_str().to_owned(),
        org_id: Some(org.id.clone()),
        before: None,
        after: Some(org_json(org)),
    }
}

pub(crate) fn org_updated(before: &OrgRecord, after: &OrgRecord) -> Change {
    Change {
        action: "update",
        object_kind: "org",
        object_id: after.id.as_str().to_owned(),
        org_id: Some(after.id.clone()),
        before: Some(org_json(before)),
        after: Some(org_json(after)),
    }
}

/// A key created (`before` is `None`), or changed by `action` (`update`, `revoke`).
pub(crate) fn key_change(action: &'static str, before: Option<&KeyRecord>, after: &KeyRecord) -> Change {
    Change {
        action,
        object_kind: "key",
        object_id: after.id.as_str().to_owned(),
        org_id: Some(after.org_id.clone()),
        before: before.map(key_json),
        after: Some(key_json(after)),
    }
}

/// A credential created or replaced.
pub(crate) fn provider_set(before: Option<&ProviderRecord>, after: &ProviderRecord) -> Change {
    Change {
        action: "set",
        object_kind: "provider",
        object_id: after.name.clone(),
        org_id: Some(after.org_id.clone()),
        before: before.map(provider_json),
        after: Some(provider_json(after)),
    }
}

/// A cap created (`after` only), changed (both) or deleted (`before` only).
pub(crate) fn cap_change(before: Option<&CapRecord>, after: Option<&CapRecord>) -> Option<Change> {
    let (action, record) = match (before, after) {
        (None, Some(after)) => ("create", after),
        (Some(_), Some(after)) => ("update", after),
        (Some(before), None) => ("delete", before),
        (None, None) => return None,
    };
    Some(Change {
        action,
        object_kind: "cap",
        object_id: record.cap.id.as_str().to_owned(),
        org_id: Some(record.cap.org_id.clone()),
        before: before.map(cap_json),
        after: after.map(cap_json),
    })
}

/// A node credential created (`before` is `None`) or revoked.
pub(crate) fn node_credential_change(
    action: &'static str,
    before: Option<&NodeCredentialRecord>,
    after: &NodeCredentialRecord,
) -> Change {
    Change {
        action,
        object_kind: "node_credential",
        object_id: after.id.as_str().to_owned(),
        org_id: None,
        before: before.map(node_credential_json),
        after: Some(node_credential_json(after)),
    }
}

/// An organization token created (`before` is `None`) or revoked.
pub(crate) fn org_token_change(
    action: &'static str,
    before: Option<&OrgTokenRecord>,
    after: &OrgTokenRecord,
) -> Change {
    Change {
        action,
        object_kind: "org_token",
        object_id: after.id.as_str().to_owned(),
        org_id: Some(after.org_id.clone()),
        before: before.map(org_token_json),
        after: Some(org_token_json(after)),
    }
}

/// A row of the audit log, from its [`AUDIT_COLUMNS`].
pub(crate) fn entry(row: &dyn Columns) -> Result<AuditEntry> {
    let auth = row.text(3)?;
    let actor = row.text(11)?;
    let org_id = row
        .optional_text(8)?
        .map(|text| OrgId::parse(text).ok_or_else(|| corrupt(format!("audit row: bad org id {text:?}"))))
        .transpose()?;
    Ok(AuditEntry {
        id: row.string(0)?,
        version: row.count(1)?,
        at: row.timestamp(2)?,
        auth: AuditAuth::parse(auth).ok_or_else(|| corrupt(format!("audit row: bad auth {auth:?}")))?,
        actor: AuditActor::from_text(actor)
            .ok_or_else(|| corrupt(format!("audit row: bad actor {actor:?}")))?,
        client: row.optional_string(4)?,
        action: row.string(5)?,
        object_kind: row.string(6)?,
        object_id: row.string(7)?,
        org_id,
        before: row.optional_string(9)?,
        after: row.optional_string(10)?,
    })
}

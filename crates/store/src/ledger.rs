//! The receipt ledger, the source of truth for spend, and what its reads select and give.

use recovea_core::ids::{KeyId, OrgId};
use recovea_core::money::Nanos;
use recovea_core::receipt::{Receipt, SerializedReceipt};
use recovea_core::timestamp::Timestamp;

use crate::Result;

/// What [`JobStore::counted_spend`] and [`ReceiptLedger::spend_uncounted`] read, in one read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UncountedSpend {
    pub spend: Nanos,
    /// The latest start of a receipt in `[from, to)`, counted or not: no receipt that started
    /// after it is in `spend`. `None`: the window has no receipt yet.
    pub last_start: Option<Timestamp>,
}

/// Which receipts to read, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptQuery {
    pub org_id: OrgId,
    /// `started_at` at or after this.
    pub from: Option<Timestamp>,
    /// `started_at` before this.
    pub to: Option<Timestamp>,
    pub key_id: Option<KeyId>,
    /// Only receipts of this model (`None` there: any).
    pub model: Option<String>,
    /// Only receipts with this HTTP status.
    pub status: Option<u16>,
    /// Only receipts whose usage came from here (`Estimated`: the provider reported none).
    pub usage_source: Option<recovea_core::usage::UsageSource>,
    /// Only receipts whose provider was paid with this key (`managed` or the `client`'s own).
    pub provider_key: Option<recovea_core::receipt::ProviderKey>,
    pub limit: u32,
    /// Continue after this receipt: its `started_at` and id.
    pub after: Option<(Timestamp, String)>,
    /// Only receipts tagged with this key and value.
    pub tag: Option<(String, String)>,
}

/// One row of the spend summary by tag: what the receipts with one value of a tag key (`None`:
/// without that key) spent on one (UTC) day.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagSpendRow {
    /// `YYYY-MM-DD`, UTC.
    pub day: String,
    pub value: Option<String>,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost: Nanos,
}

/// One row of the spend summary: what a key spent on a model on one (UTC) day.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendRow {
    /// `YYYY-MM-DD`, UTC.
    pub day: String,
    pub key_id: String,
    pub model: Option<String>,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost: Nanos,
}

/// The receipt ledger: the source of truth for spend. Inserts are idempotent by receipt id.
pub trait ReceiptLedger: Send + Sync + 'static {
    /// Inserts the receipts not already present, each with its JSON text as it came; returns how
    /// many were new.
    fn insert_receipts(&self, receipts: &[SerializedReceipt]) -> Result<usize>;
    fn receipts(&self, query: &ReceiptQuery) -> Result<Vec<Receipt>>;
    /// The organization's receipt with this id, if any (another organization's is `None`).
    fn receipt(&self, org: &OrgId, id: &str) -> Result<Option<Receipt>>;
    /// Spend by day, key and model; only `key`'s rows when given.
    fn spend_summary(
        &self,
        org: &OrgId,
        key: Option<&KeyId>,
        from: Option<Timestamp>,
        to: Option<Timestamp>,
    ) -> Result<Vec<SpendRow>>;
    /// The spend summary by the values of the tag `key`, by day and value (untagged receipts under
    /// `None`, first), from `[from, to)`, of one key's receipts when `key_id` is given.
    fn spend_by_tag(
        &self,
        org: &OrgId,
        key_id: Option<&KeyId>,
        from: Option<Timestamp>,
        to: Option<Timestamp>,
        key: &str,
    ) -> Result<Vec<TagSpendRow>>;
    /// The spend of an organization (or one of its keys) in `[from, to)`: the sum of its receipts' costs.
    fn spend(&self, org: &OrgId, key: Option<&KeyId>, from: Timestamp, to: Timestamp) -> Result<Nanos>;
    /// [`spend`](Self::spend) less each `counted` node's receipts that started at or after its
    /// time, in one read (see [`JobStore::counted_spend`]).
    fn spend_uncounted(
        &self,
        org: &OrgId,
        key: Option<&KeyId>,
        from: Timestamp,
        to: Timestamp,
        counted: &[(&str, Timestamp)],
    ) -> Result<UncountedSpend>;
}

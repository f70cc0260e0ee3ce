//! Receipts: what one admitted request used and cost, settled from the provider's usage or an estimate.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;

use serde::{Deserialize, Deserializer, Serialize};

use crate::money::Nanos;
use crate::pricing::{self, PriceSource, Resolution, ServiceTier};
use crate::tags::Tags;
use crate::timestamp::Timestamp;
use crate::usage::{Usage, UsageSource};

/// The record of one admitted request, as the ledger stores it and the admin API shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    /// Minted once per request, from its request id: replays and retries insert it only once.
    pub id: String,
    pub request_id: String,
    pub org_id: String,
    pub key_id: String,
    /// The name of the credential the request went through (`openai`, `anthropic`, `groq`...).
    pub provider: String,
    /// Who paid the provider: the organization's key held by Recovea, or the client's own. Left
    /// out only on receipts written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_key: Option<ProviderKey>,
    pub model: Option<String>,
    /// The provider path without its query, such as `/v1/chat/completions`.
    pub endpoint: String,
    pub status: u16,
    pub stream: bool,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_input_tokens: u64,
    pub cache_write_input_tokens: u64,
    pub reasoning_tokens: u64,
    /// The audio parts of `input_tokens` (and of its cached part) and of `output_tokens`, each
    /// billed at its audio price; left out when zero, as on every receipt without audio.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub audio_input_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_audio_input_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub audio_output_tokens: u64,
    /// The other quantities the provider bills, each left out when zero (or standard): the part of
    /// the cache writes kept an hour, the image parts of the tokens, the characters, seconds and
    /// images of models priced per unit, the built-in tools' calls, and the tier it was served at.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_1h_input_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub image_input_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_image_input_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub image_output_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub characters: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub seconds: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub images: u64,
    #[serde(default, skip_serializing_if = "ToolCalls::is_empty")]
    pub tool_calls: ToolCalls,
    #[serde(default, skip_serializing_if = "ServiceTier::is_standard", with = "service_tier")]
    pub service_tier: ServiceTier,
    #[serde(deserialize_with = "usd")]
    pub cost_usd: Nanos,
    #[serde(with = "usage_source")]
    pub usage_source: UsageSource,
    /// False when the model had no price: the cost is its provider kind's fallback price, an upper
    /// bound rather than the model's own price.
    pub priced: bool,
    /// The price table revision the cost was computed with.
    pub price_revision: u64,
    /// The price used: the table entry's model name, or `fallback:<kind>`; `None` when no price
    /// was needed (no tokens). Defaulted, as receipts of nodes built before it do not carry it.
    #[serde(default)]
    pub priced_as: Option<String>,
    #[serde(deserialize_with = "rfc3339")]
    pub started_at: Timestamp,
    #[serde(deserialize_with = "rfc3339")]
    pub finished_at: Timestamp,
    pub node_id: String,
    /// The provider's id of the deferred job this receipt is about: the job its request created
    /// (with `held_usd`), or the job it settles (without). Left out otherwise, as are the next two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// What the job this request created holds on every cap covering it until it settles.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "optional_usd")]
    pub held_usd: Option<Nanos>,
    /// The batch input file this request uploaded, and the estimate of its lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_input: Option<BatchFile>,
    /// The request's attribution tags (`x-recovea-tags`). Left out when there are none, so that a
    /// receipt without tags reads as it did before them, and defaulted, so that older ones read.
    #[serde(default, skip_serializing_if = "Tags::is_empty")]
    pub tags: Tags,
}

/// Whose provider key a request went with, and so whose provider account it was billed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKey {
    /// The organization's credential, held by Recovea and swapped in by the gateway.
    Managed,
    /// A provider key the client sent itself, beside its Recovea key in `x-recovea-key`.
    Client,
}

impl ProviderKey {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Managed => "managed",
            Self::Client => "client",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "managed" => Some(Self::Managed),
            "client" => Some(Self::Client),
            _ => None,
        }
    }
}

/// The built-in tools' calls a receipt charged, by tool; left out when none ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCalls {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub web_search: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub file_search: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub code_interpreter: u64,
}

impl ToolCalls {
    pub fn is_empty(&self) -> bool {
        *self == ToolCalls::default()
    }
}

/// A service tier as a receipt writes it: `flex`, `priority` (the standard tier is left out).
mod service_tier {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::pricing::ServiceTier;

    pub(super) fn serialize<S: Serializer>(tier: &ServiceTier, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(tier.as_str())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ServiceTier, D::Error> {
        let name = <std::borrow::Cow<'_, str>>::deserialize(deserializer)?;
        Ok(ServiceTier::parse(&name))
    }
}

impl Receipt {
    /// What the receipt counts.
    pub fn usage(&self) -> Usage {
        Usage {
            input_tokens: self.input_tokens,
            cached_input_tokens: self.cached_input_tokens,
            cache_write_input_tokens: self.cache_write_input_tokens,
            cache_write_1h_input_tokens: self.cache_write_1h_input_tokens,
            output_tokens: self.output_tokens,
            reasoning_tokens: self.reasoning_tokens,
            audio_input_tokens: self.audio_input_tokens,
            cached_audio_input_tokens: self.cached_audio_input_tokens,
            audio_output_tokens: self.audio_output_tokens,
            image_input_tokens: self.image_input_tokens,
            cached_image_input_tokens: self.cached_image_input_tokens,
            image_output_tokens: self.image_output_tokens,
            characters: self.characters,
            seconds: self.seconds,
            images: self.images,
            web_search_calls: self.tool_calls.web_search,
            file_search_calls: self.tool_calls.file_search,
            code_interpreter_sessions: self.tool_calls.code_interpreter,
            service_tier: self.service_tier,
        }
    }

    /// Makes the receipt count `usage`: each of its quantities in the receipt's field.
    pub fn set_usage(&mut self, usage: &Usage) {
        self.input_tokens = usage.input_tokens;
        self.cached_input_tokens = usage.cached_input_tokens;
        self.cache_write_input_tokens = usage.cache_write_input_tokens;
        self.cache_write_1h_input_tokens = usage.cache_write_1h_input_tokens;
        self.output_tokens = usage.output_tokens;
        self.reasoning_tokens = usage.reasoning_tokens;
        self.audio_input_tokens = usage.audio_input_tokens;
        self.cached_audio_input_tokens = usage.cached_audio_input_tokens;
        self.audio_output_tokens = usage.audio_output_tokens;
        self.image_input_tokens = usage.image_input_tokens;
        self.cached_image_input_tokens = usage.cached_image_input_tokens;
        self.image_output_tokens = usage.image_output_tokens;
        self.characters = usage.characters;
        self.seconds = usage.seconds;
        self.images = usage.images;
        self.tool_calls = ToolCalls {
            web_search: usage.web_search_calls,
            file_search: usage.file_search_calls,
            code_interpreter: usage.code_interpreter_sessions,
        };
        self.service_tier = usage.service_tier;
    }

    /// The receipt's JSON text, byte for byte what `serde_json::to_string` writes (a property test
    /// holds them equal). Written by hand because every request writes one: serde escapes each of
    /// the 21 keys and formats each number through its general machinery, which made a tenth of a
    /// request's instructions.
    pub fn to_json(&self) -> String {
        // Most receipts are 550 to 650 bytes.
        let mut out = String::with_capacity(768);
        let number = |out: &mut String, key: &str, value: u64| {
            out.push_str(key);
            push_decimal(out, value);
        };
        out.push_str(r#"{"id":"#);
        push_json_str(&mut out, &self.id);
        out.push_str(r#","request_id":"#);
        push_json_str(&mut out, &self.request_id);
        out.push_str(r#","org_id":"#);
        push_json_str(&mut out, &self.org_id);
        out.push_str(r#","key_id":"#);
        push_json_str(&mut out, &self.key_id);
        out.push_str(r#","provider":"#);
        push_json_str(&mut out, &self.provider);
        if let Some(key) = self.provider_key {
            out.push_str(r#","provider_key":"#);
            push_json_str(&mut out, key.as_str());
        }
        out.push_str(r#","model":"#);
        match &self.model {
            Some(model) => push_json_str(&mut out, model),
            None => out.push_str("null"),
        }
        out.push_str(r#","endpoint":"#);
        push_json_str(&mut out, &self.endpoint);
        number(&mut out, r#","status":"#, u64::from(self.status));
        out.push_str(if self.stream { r#","stream":true"# } else { r#","stream":false"# });
        number(&mut out, r#","input_tokens":"#, self.input_tokens);
        number(&mut out, r#","output_tokens":"#, self.output_tokens);
        number(&mut out, r#","cached_input_tokens":"#, self.cached_input_tokens);
        number(&mut out, r#","cache_write_input_tokens":"#, self.cache_write_input_tokens);
        number(&mut out, r#","reasoning_tokens":"#, self.reasoning_tokens);
        for (key, count) in [
            (r#","audio_input_tokens":"#, self.audio_input_tokens),
            (r#","cached_audio_input_tokens":"#, self.cached_audio_input_tokens),
            (r#","audio_output_tokens":"#, self.audio_output_tokens),
            (r#","cache_write_1h_input_tokens":"#, self.cache_write_1h_input_tokens),
            (r#","image_input_tokens":"#, self.image_input_tokens),
            (r#","cached_image_input_tokens":"#, self.cached_image_input_tokens),
            (r#","image_output_tokens":"#, self.image_output_tokens),
            (r#","characters":"#, self.characters),
            (r#","seconds":"#, self.seconds),
            (r#","images":"#, self.images),
        ] {
            if count != 0 {
                number(&mut out, key, count);
            }
        }
        if !self.tool_calls.is_empty() {
            out.push_str(r#","tool_calls":{"#);
            let mut first = true;
            for (key, count) in [
                (r#""web_search":"#, self.tool_calls.web_search),
                (r#""file_search":"#, self.tool_calls.file_search),
                (r#""code_interpreter":"#, self.tool_calls.code_interpreter),
            ] {
                if count != 0 {
                    if !first {
                        out.push(',');
                    }
                    first = false;
                    number(&mut out, key, count);
                }
            }
            out.push('}');
        }
        if !self.service_tier.is_standard() {
            out.push_str(r#","service_tier":"#);
            push_json_str(&mut out, self.service_tier.as_str());
        }
        // Amounts and times are digits and punctuation: nothing in them needs escaping.
        out.push_str(r#","cost_usd":""#);
        self.cost_usd.push_usd(&mut out);
        out.push('"');
        out.push_str(r#","usage_source":"#);
        push_json_str(&mut out, self.usage_source.as_str());
        out.push_str(if self.priced { r#","priced":true"# } else { r#","priced":false"# });
        number(&mut out, r#","price_revision":"#, self.price_revision);
        out.push_str(r#","priced_as":"#);
        match &self.priced_as {
            Some(priced_as) => push_json_str(&mut out, priced_as),
            None => out.push_str("null"),
        }
        out.push_str(r#","started_at":""#);
        self.started_at.push_rfc3339(&mut out);
        out.push_str(r#"","finished_at":""#);
        self.finished_at.push_rfc3339(&mut out);
        out.push('"');
        out.push_str(r#","node_id":"#);
        push_json_str(&mut out, &self.node_id);
        if let Some(job_id) = &self.job_id {
            out.push_str(r#","job_id":"#);
            push_json_str(&mut out, job_id);
        }
        if let Some(held) = self.held_usd {
            out.push_str(r#","held_usd":""#);
            held.push_usd(&mut out);
            out.push('"');
        }
        if let Some(batch) = &self.batch_input {
            // Rare (a batch file's upload), and its model names are the client's: serde writes it.
            out.push_str(r#","batch_input":"#);
            out.push_str(&serde_json::to_string(batch).unwrap_or_else(|_| "null".to_owned()));
        }
        if !self.tags.is_empty() {
            out.push_str(r#","tags":{"#);
            for (n, (key, value)) in self.tags.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                push_json_str(&mut out, key);
                out.push(':');
                push_json_str(&mut out, value);
            }
            out.push('}');
        }
        out.push('}');
        out
    }
}

#[cfg(any(test, feature = "test-util"))]
impl Receipt {
    /// A receipt for tests: `id` (`rcpt_...`) of request `req_...`, a priced 200 answer of
    /// `gpt-4o` on chat completions, one input and one output token, costing nothing, in `org_a`
    /// through `key_a`, from 1 ms to 2 ms after the epoch on `node`. Tests set what they look at.
    pub fn example(id: &str) -> Receipt {
        Receipt {
            id: id.into(),
            request_id: id.replace("rcpt_", "req_"),
            org_id: "org_a".into(),
            key_id: "key_a".into(),
            provider: "openai".into(),
            provider_key: None,
            model: Some("gpt-4o".into()),
            endpoint: "/v1/chat/completions".into(),
            status: 200,
            stream: false,
            input_tokens: 1,
            output_tokens: 1,
            cached_input_tokens: 0,
            cache_write_input_tokens: 0,
            reasoning_tokens: 0,
            audio_input_tokens: 0,
            cached_audio_input_tokens: 0,
            audio_output_tokens: 0,
            cache_write_1h_input_tokens: 0,
            image_input_tokens: 0,
            cached_image_input_tokens: 0,
            image_output_tokens: 0,
            characters: 0,
            seconds: 0,
            images: 0,
            tool_calls: ToolCalls::default(),
            service_tier: ServiceTier::Standard,
            cost_usd: Nanos(0),
            usage_source: UsageSource::Provider,
            priced: true,
            price_revision: 0,
            priced_as: Some("gpt-4o".into()),
            started_at: Timestamp(1),
            finished_at: Timestamp(2),
            node_id: "node".into(),
            job_id: None,
            held_usd: None,
            batch_input: None,
            tags: Tags::new(),
        }
    }
}

/// A batch input file uploaded through the gateway: the provider's id and its lines' estimate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchFile {
    pub file_id: String,
    pub input: crate::jobs::BatchInput,
}

/// A JSON string: as is between quotes when nothing in it needs escaping (ids, names, amounts,
/// times: nearly always), else as serde_json escapes it.
fn push_json_str(out: &mut String, text: &str) {
    // A fold rather than `all`: without the early exit the loop is vectorized.
    let needs_escape = text.bytes().fold(false, |any, b| any | (b < 0x20) | (b == b'"') | (b == b'\\'));
    if !needs_escape {
        out.push('"');
        out.push_str(text);
        out.push('"');
    } else {
        out.push_str(&serde_json::Value::from(text).to_string());
    }
}

fn push_decimal(out: &mut String, mut value: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend(digits[at..].iter().map(|&d| char::from(d)));
}

/// The receipt id of a request: its request id with the receipt prefix, so it is minted once.
pub fn receipt_id(request_id: &str) -> String {
    let suffix = request_id.strip_prefix("req_").unwrap_or(request_id);
    let mut id = String::with_capacity("rcpt_".len() + suffix.len());
    id.push_str("rcpt_");
    id.push_str(suffix);
    id
}

/// Usage and cost as a receipt records them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    pub usage: Usage,
    pub source: UsageSource,
    pub cost: Nanos,
    pub priced: bool,
    /// What the receipt's `priced_as` says.
    pub priced_as: Option<String>,
}

impl Settlement {
    /// A receipt that costs nothing and counts no tokens: a request that cannot spend, or one
    /// billed where the gateway cannot see it (`source` says which).
    pub fn nothing(source: UsageSource) -> Self {
        Self { usage: Usage::default(), source, cost: Nanos::ZERO, priced: true, priced_as: None }
    }
}

/// Settles a request: the provider's usage when it reported one, else the estimate, at the price
/// `price` resolved to (`PriceTable::price_for`). A fallback price costs the usage all the same,
/// with `priced: false`: an unknown model is never free.
pub fn settle(reported: Option<Usage>, estimate: Usage, price: &Resolution<'_>) -> Settlement {
    let (usage, source) = match reported {
        Some(usage) => (usage, UsageSource::Provider),
        None => (estimate, UsageSource::Estimated),
    };
    let fallback = price.source == PriceSource::Fallback;
    // No tokens cost nothing at any price (a model listing, an error without usage): no price was
    // needed, so none was missing.
    if usage == Usage::default() && fallback {
        return Settlement { usage, source, cost: Nanos::ZERO, priced: true, priced_as: None };
    }
    Settlement {
        usage,
        source,
        cost: pricing::cost(&usage, &price.price),
        priced: !fallback,
        priced_as: Some(price.priced_as.to_string()),
    }
}

/// A receipt with its JSON text, carried together from the spool (which had to write the text) to
/// the ledger (which stores it), so that no step in between serializes the receipt again. The text
/// always parses back to the receipt.
#[derive(Debug, Clone)]
pub struct SerializedReceipt {
    json: Box<str>,
    /// The receipt, kept beside its text or read from it when first asked for.
    receipt: OnceLock<Receipt>,
}

impl SerializedReceipt {
    pub fn new(receipt: Receipt) -> Self {
        let json = receipt.to_json().into_boxed_str();
        Self { json, receipt: OnceLock::from(receipt) }
    }

    /// The text alone, for where only the text travels on (a node's spool, whose batches go to
    /// the control plane as text): the receipt's fields are freed by the thread that made them,
    /// not by the one that ships the text.
    pub fn text_of(receipt: &Receipt) -> Self {
        Self { json: receipt.to_json().into_boxed_str(), receipt: OnceLock::new() }
    }

    /// A receipt's JSON text, as a spool line or a node's batch carries it.
    pub fn parse(json: &str) -> serde_json::Result<Self> {
        Ok(Self { receipt: OnceLock::from(serde_json::from_str::<Receipt>(json)?), json: json.into() })
    }

    pub fn receipt(&self) -> &Receipt {
        self.receipt.get_or_init(|| self.read_back())
    }

    pub fn json(&self) -> &str {
        &self.json
    }

    pub fn into_receipt(mut self) -> Receipt {
        self.receipt.take().unwrap_or_else(|| self.read_back())
    }

    fn read_back(&self) -> Receipt {
        serde_json::from_str(&self.json).expect("a receipt's own JSON text reads back (see to_json)")
    }
}

/// The same text is the same receipt, whether or not it was read yet.
impl PartialEq for SerializedReceipt {
    fn eq(&self, other: &Self) -> bool {
        self.json == other.json
    }
}

impl Eq for SerializedReceipt {}

/// Where receipts go once they leave a node's spool: the ledger in `serve`, the control plane's
/// ingest from a node. Delivery is idempotent by receipt id, so a batch may be sent again.
pub trait ReceiptSink: Send + Sync + 'static {
    fn deliver(
        &self,
        batch: Vec<SerializedReceipt>,
    ) -> Pin<Box<dyn Future<Output = Result<(), DeliveryError>> + Send + '_>>;
}

/// A batch was not delivered. The text is for operators' logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryError {
    /// The sink could not take it (down, slow, failing): it is sent again later.
    Failed(String),
    /// The sink refused it as invalid: the same batch would be refused again. It comes back, so
    /// that its receipts are tried one by one and the one refused alone is set aside rather than
    /// holding up every later receipt.
    Refused { why: String, batch: Vec<SerializedReceipt> },
}

impl std::fmt::Display for DeliveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Failed(why) => write!(f, "receipt delivery failed: {why}"),
            Self::Refused { why, .. } => write!(f, "receipts refused as invalid: {why}"),
        }
    }
}

impl std::error::Error for DeliveryError {}

fn usd<'de, D: Deserializer<'de>>(d: D) -> Result<Nanos, D::Error> {
    let text = String::deserialize(d)?;
    Nanos::parse_usd(&text).map_err(serde::de::Error::custom)
}

fn is_zero(count: &u64) -> bool {
    *count == 0
}

fn optional_usd<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Nanos>, D::Error> {
    usd(d).map(Some)
}

fn rfc3339<'de, D: Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
    let text = String::deserialize(d)?;
    Timestamp::parse_rfc3339(&text).ok_or_else(|| serde::de::Error::custom("expected an RFC 3339 time"))
}

mod usage_source {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::usage::UsageSource;

    pub(super) fn serialize<S: Serializer>(source: &UsageSource, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(source.as_str())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<UsageSource, D::Error> {
        let text = String::deserialize(d)?;
        UsageSource::parse(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown usage source {text:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pricing::{Price, PriceTable};
    use crate::provider_kind::ProviderKind;
    use proptest::prelude::*;

    fn table() -> PriceTable {
        PriceTable::from_kinded([(
            "gpt-4o".to_owned(),
            Some(ProviderKind::OpenAi),
            Price {
                input_per_mtok: Nanos(2_500_000_000),
                output_per_mtok: Nanos(10_000_000_000),
                cached_input_per_mtok: Some(Nanos(1_250_000_000)),
                ..Price::default()
            },
        )])
    }

    fn sample() -> Receipt {
        Receipt {
            stream: true,
            input_tokens: 1000,
            output_tokens: 200,
            cached_input_tokens: 400,
            reasoning_tokens: 50,
            cost_usd: Nanos(3_500_000),
            price_revision: 3,
            started_at: Timestamp(1_764_460_800_000),
            finished_at: Timestamp(1_764_460_801_250),
            node_id: "node_a".into(),
            ..Receipt::example(&receipt_id("req_abc"))
        }
    }

    const OPENAI: ProviderKind = ProviderKind::OpenAi;

    #[test]
    fn reported_usage_is_priced_exactly() {
        let usage =
            Usage { input_tokens: 1000, cached_input_tokens: 400, output_tokens: 200, ..Usage::default() };
        let table = table();
        let s = settle(Some(usage), Usage::default(), &table.price_for(Some("gpt-4o-2024-08-06"), OPENAI));
        // 600 x 2.50 + 400 x 1.25 + 200 x 10.00 per Mtok = 0.0015 + 0.0005 + 0.002 USD.
        assert_eq!(
            s,
            Settlement {
                usage,
                source: UsageSource::Provider,
                cost: Nanos(4_000_000),
                priced: true,
                priced_as: Some("gpt-4o".into()),
            }
        );
    }

    #[test]
    fn missing_usage_falls_back_to_the_estimate_and_unknown_models_cost_the_fallback() {
        let estimate = Usage { input_tokens: 10, output_tokens: 3, ..Usage::default() };
        let table = table();
        let s = settle(None, estimate, &table.price_for(Some("mystery-model"), OPENAI));
        // The kind's fallback is gpt-4o's input and output prices: 10 x 2.50 + 3 x 10.00 per Mtok.
        assert_eq!(
            s,
            Settlement {
                usage: estimate,
                source: UsageSource::Estimated,
                cost: Nanos(55_000),
                priced: false,
                priced_as: Some("fallback:openai".into()),
            }
        );
        let unnamed = settle(None, estimate, &table.price_for(None, OPENAI));
        assert_eq!((unnamed.priced, unnamed.cost), (false, Nanos(55_000)));
        let nothing = settle(Some(Usage::default()), Usage::default(), &table.price_for(None, OPENAI));
        assert_eq!(
            (nothing.cost, nothing.priced, nothing.priced_as),
            (Nanos::ZERO, true, None),
            "no tokens cost nothing at any price"
        );
    }

    #[test]
    fn receipts_without_priced_as_still_parse() {
        let mut text = serde_json::to_string(&sample()).expect("serialises");
        text = text.replace(r#","priced_as":"gpt-4o""#, "");
        assert!(!text.contains("priced_as"), "{text}");
        let parsed = serde_json::from_str::<Receipt>(&text).expect("an older node's receipt parses");
        assert_eq!(parsed, Receipt { priced_as: None, ..sample() });
    }

    #[test]
    fn receipts_round_trip_through_json() {
        let receipt = sample();
        let text = serde_json::to_string(&receipt).expect("serialises");
        assert!(text.contains(r#""cost_usd":"0.0035""#), "{text}");
        assert!(text.contains(r#""started_at":"2025-11-30T00:00:00Z""#), "{text}");
        assert_eq!(serde_json::from_str::<Receipt>(&text).expect("parses"), receipt);
    }

    fn any_text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z_0-9]{0,12}",
            any::<String>(),
            proptest::collection::vec(
                prop_oneof![Just('"'), Just('\\'), Just('\n'), Just('\u{1}'), Just('\u{7f}'), Just('é')],
                0..6
            )
            .prop_map(|chars| chars.into_iter().collect()),
        ]
    }

    prop_compose! {
        fn any_receipt()(
            texts in proptest::collection::vec(any_text(), 8),
            model in proptest::option::of(any_text()),
            status in any::<u16>(),
            flags in any::<(bool, bool, bool)>(),
            counts in any::<[u64; 6]>(),
            audio in prop_oneof![Just([0u64; 3]), any::<[u64; 3]>()],
            priced_as in proptest::option::of(any_text()),
            cost in prop_oneof![any::<i64>(), -10_000_000_000i64..10_000_000_000],
            times in prop_oneof![any::<[i64; 2]>(), proptest::array::uniform2(0i64..300_000_000_000_000)],
            tags in proptest::collection::btree_map(any_text(), any_text(), 0..3),
            job in proptest::option::of((any_text(), proptest::option::of(any::<i64>()))),
            batch in proptest::option::of((any_text(), any_text(), any::<[u64; 4]>())),
            more in prop_oneof![Just([0u64; 10]), any::<[u64; 10]>()],
            tier in 0_u8..3,
            provider_key in proptest::option::of(prop_oneof![Just(ProviderKey::Managed), Just(ProviderKey::Client)]),
        ) -> Receipt {
            let mut text = texts.into_iter();
            let mut next = || text.next().unwrap_or_default();
            Receipt {
                id: next(),
                request_id: next(),
                org_id: next(),
                key_id: next(),
                provider: next(),
                provider_key,
                model,
                endpoint: next(),
                status,
                stream: flags.0,
                input_tokens: counts[0],
                output_tokens: counts[1],
                cached_input_tokens: counts[2],
                cache_write_input_tokens: counts[3],
                reasoning_tokens: counts[4],
                audio_input_tokens: audio[0],
                cached_audio_input_tokens: audio[1],
                audio_output_tokens: audio[2],
                cache_write_1h_input_tokens: more[0],
                image_input_tokens: more[1],
                cached_image_input_tokens: more[2],
                image_output_tokens: more[3],
                characters: more[4],
                seconds: more[5],
                images: more[6],
                tool_calls: ToolCalls { web_search: more[7], file_search: more[8], code_interpreter: more[9] },
                service_tier: [ServiceTier::Standard, ServiceTier::Flex, ServiceTier::Priority][usize::from(tier)],
                cost_usd: Nanos(cost),
                usage_source: match (flags.1, counts[5] % 3) {
                    (true, _) => UsageSource::Provider,
                    (false, 0) => UsageSource::Unmetered,
                    (false, _) => UsageSource::Estimated,
                },
                priced: flags.2,
                price_revision: counts[5],
                priced_as,
                started_at: Timestamp(times[0]),
                finished_at: Timestamp(times[1]),
                node_id: next(),
                job_id: job.as_ref().map(|(id, _)| id.clone()),
                held_usd: job.and_then(|(_, held)| held).map(Nanos),
                batch_input: batch.map(|(file_id, model, [requests, input_tokens, output_tokens, uncapped])| {
                    let lines = crate::jobs::ModelLines { requests, input_tokens, output_tokens, uncapped };
                    BatchFile { file_id, input: crate::jobs::BatchInput { models: [(model, lines)].into() } }
                }),
                tags,
            }
        }
    }

    proptest! {
        #[test]
        fn receipts_are_written_as_serde_writes_them(receipt in any_receipt()) {
            prop_assert_eq!(receipt.to_json(), serde_json::to_string(&receipt).expect("serialises"));
        }
    }

    #[test]
    fn a_serialized_receipt_keeps_the_text_it_was_parsed_from() {
        let written = SerializedReceipt::new(sample());
        assert_eq!(written.json(), serde_json::to_string(&sample()).expect("serialises"));
        let read = SerializedReceipt::parse(written.json()).expect("parses");
        assert_eq!(read, written);
        assert_eq!(read.into_receipt(), sample());
        assert!(SerializedReceipt::parse(r#"{"id":"rcpt_a"}"#).is_err(), "a partial receipt is refused");
    }

    #[test]
    fn a_receipt_kept_as_text_alone_reads_back_as_itself() {
        let text = SerializedReceipt::text_of(&sample());
        assert_eq!(text, SerializedReceipt::new(sample()));
        assert_eq!(text.receipt(), &sample());
        assert_eq!(SerializedReceipt::text_of(&sample()).into_receipt(), sample());
    }

    /// A receipt spooled before tags existed still reads, without tags; one with tags keeps them.
    #[test]
    fn receipts_without_tags_read_and_tags_round_trip() {
        let old = sample().to_json();
        assert!(!old.contains("tags"), "no tags, no member: {old}");
        assert_eq!(SerializedReceipt::parse(&old).expect("an old receipt reads").into_receipt(), sample());
        let tagged = Receipt {
            tags: [("team".to_owned(), "search".to_owned()), ("feature".to_owned(), "ac".to_owned())].into(),
            ..sample()
        };
        let text = tagged.to_json();
        assert!(text.ends_with(r#","tags":{"feature":"ac","team":"search"}}"#), "{text}");
        assert_eq!(SerializedReceipt::parse(&text).expect("reads").into_receipt(), tagged);
    }

    /// A job's receipts say which job, and what its creation held; older receipts read without.
    #[test]
    fn job_fields_are_left_out_unless_set_and_round_trip() {
        let plain = sample().to_json();
        assert!(!plain.contains("job_id") && !plain.contains("held_usd") && !plain.contains("batch_input"));
        let created =
            Receipt { job_id: Some("batch_abc".into()), held_usd: Some(Nanos(6_250_000_000)), ..sample() };
        let text = created.to_json();
        assert!(text.contains(r#","job_id":"batch_abc","held_usd":"6.25""#), "{text}");
        assert_eq!(SerializedReceipt::parse(&text).expect("reads").into_receipt(), created);
        let mut input = crate::jobs::BatchInput::default();
        input.add(Some("gpt-4o"), 100, None);
        let uploaded =
            Receipt { batch_input: Some(BatchFile { file_id: "file-1".into(), input }), ..sample() };
        let text = uploaded.to_json();
        assert!(text.contains(r#""batch_input":{"file_id":"file-1","input":{"models":{"gpt-4o":"#), "{text}");
        assert_eq!(SerializedReceipt::parse(&text).expect("reads").into_receipt(), uploaded);
    }

    /// Who paid the provider is said on every new receipt; older receipts read without it.
    #[test]
    fn the_provider_key_is_said_and_round_trips() {
        let plain = sample().to_json();
        assert!(!plain.contains("provider_key"), "{plain}");
        for (key, text) in [(ProviderKey::Managed, "managed"), (ProviderKey::Client, "client")] {
            let receipt = Receipt { provider_key: Some(key), ..sample() };
            let json = receipt.to_json();
            assert!(json.contains(&format!(r#""provider":"openai","provider_key":"{text}","#)), "{json}");
            assert_eq!(SerializedReceipt::parse(&json).expect("reads").into_receipt(), receipt);
            assert_eq!(ProviderKey::parse(key.as_str()), Some(key));
        }
        assert_eq!(ProviderKey::parse("own"), None);
    }

    #[test]
    fn receipt_ids_follow_request_ids() {
        assert_eq!(receipt_id("req_XyZ"), "rcpt_XyZ");
    }
}

//! What a receipt's row keeps beyond its plain columns: its tags as text, and (on SQLite) the
//! quantities few receipts have, in one JSON column.

use recovea_core::tags::{self, Tags};

use super::{Columns, corrupt};
use crate::Result;

/// A receipt's tags from their stored text; `NULL` or empty: none.
pub(crate) fn tags(row: &dyn Columns, index: usize) -> Result<Tags> {
    match row.optional_text(index)? {
        None => Ok(Tags::new()),
        Some(text) => tags::parse([text.as_bytes()]).map_err(|e| corrupt(format!("bad tags {text:?}: {e}"))),
    }
}

/// The stored text of a receipt's tags: `NULL` for none.
pub(crate) fn tags_text(tags: &Tags) -> Option<String> {
    (!tags.is_empty()).then(|| tags::to_text(tags))
}

/// What a tags filter looks for in `',' || tags || ','`: the pair whole, between commas.
pub(crate) fn tag_needle(tag: &Option<(String, String)>) -> Option<String> {
    tag.as_ref().map(|(key, value)| format!(",{key}={value},"))
}

/// The quantities of a receipt a SQLite row keeps in one JSON column (`quantities`): those most
/// receipts do not have (hour-long cache writes, image tokens, characters, seconds, images, tool
/// calls, a tier), as the receipt's own JSON writes them. `None` when the receipt has none.
pub(crate) fn quantities_text(receipt: &recovea_core::receipt::Receipt) -> Option<String> {
    let quantities = Quantities {
        cache_write_1h_input_tokens: receipt.cache_write_1h_input_tokens,
        image_input_tokens: receipt.image_input_tokens,
        cached_image_input_tokens: receipt.cached_image_input_tokens,
        image_output_tokens: receipt.image_output_tokens,
        characters: receipt.characters,
        seconds: receipt.seconds,
        images: receipt.images,
        tool_calls: receipt.tool_calls,
        service_tier: (!receipt.service_tier.is_standard()).then(|| receipt.service_tier.as_str().to_owned()),
    };
    (quantities != Quantities::default()).then(|| serde_json::to_string(&quantities).unwrap_or_default())
}

/// Sets the quantities a `quantities` column holds on `receipt`.
pub(crate) fn read_quantities(text: &str, receipt: &mut recovea_core::receipt::Receipt) -> Result<()> {
    let q: Quantities =
        serde_json::from_str(text).map_err(|e| corrupt(format!("bad receipt quantities: {e}")))?;
    receipt.cache_write_1h_input_tokens = q.cache_write_1h_input_tokens;
    receipt.image_input_tokens = q.image_input_tokens;
    receipt.cached_image_input_tokens = q.cached_image_input_tokens;
    receipt.image_output_tokens = q.image_output_tokens;
    receipt.characters = q.characters;
    receipt.seconds = q.seconds;
    receipt.images = q.images;
    receipt.tool_calls = q.tool_calls;
    receipt.service_tier = q
        .service_tier
        .as_deref()
        .map_or(recovea_core::pricing::ServiceTier::Standard, recovea_core::pricing::ServiceTier::parse);
    Ok(())
}

#[derive(Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Quantities {
    #[serde(default, skip_serializing_if = "is_zero")]
    cache_write_1h_input_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    image_input_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    cached_image_input_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    image_output_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    characters: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    seconds: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    images: u64,
    #[serde(default, skip_serializing_if = "recovea_core::receipt::ToolCalls::is_empty")]
    tool_calls: recovea_core::receipt::ToolCalls,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    service_tier: Option<String>,
}

fn is_zero(count: &u64) -> bool {
    *count == 0
}

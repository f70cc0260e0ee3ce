//! The wire form of a price, in US dollars as decimal strings, and of the price table's file.

use std::collections::BTreeMap;
use std::fmt;

use super::{LongContext, Price, Rates};
use crate::money::{MoneyError, Nanos};
use crate::provider_kind::ProviderKind;

/// The wire form of a price (the admin API's, the table file's, the feed's and the store's), in US
/// dollars as decimal strings: per million tokens, characters or seconds, or per image, call or
/// session. `kind`, where given, is the provider kind that serves the model (an entry of the table
/// file, the body of `PUT /prices/{model}`); a price alone carries none.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceWire {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub input_per_mtok_usd: String,
    pub output_per_mtok_usd: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_per_mtok_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_per_mtok_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_1h_per_mtok_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_input_per_mtok_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_output_per_mtok_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio_input_per_mtok_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio_output_per_mtok_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_audio_input_per_mtok_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_input_per_mtok_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_output_per_mtok_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_image_input_per_mtok_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_image_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_million_characters_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_million_seconds_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_search_per_call_usd: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub web_search_per_prompt: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_search_per_call_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_interpreter_per_session_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flex: Option<RatesWire>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<RatesWire>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub long_context: Option<LongContextWire>,
    /// The most output tokens one request to the model can produce.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
}

/// The wire form of [`Rates`].
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RatesWire {
    pub input_per_mtok_usd: String,
    pub output_per_mtok_usd: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_per_mtok_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_per_mtok_usd: Option<String>,
}

/// The wire form of [`LongContext`].
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LongContextWire {
    pub above_input_tokens: u64,
    pub standard: RatesWire,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flex: Option<RatesWire>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<RatesWire>,
}

/// Parses the wire's dollar amounts, each error naming its field (`priority.input_per_mtok_usd`).
struct Amounts;

impl Amounts {
    fn required(field: &'static str, usd: &str) -> Result<Nanos, PriceError> {
        Nanos::parse_usd(usd).map_err(|error| PriceError { field, error: Some(error) })
    }

    fn optional(field: &'static str, usd: &Option<String>) -> Result<Option<Nanos>, PriceError> {
        usd.as_deref().map(|usd| Amounts::required(field, usd)).transpose()
    }

    /// Rates under `prefix` (their fields' names, for errors, are static per place).
    fn rates(wire: &RatesWire, fields: [&'static str; 4]) -> Result<Rates, PriceError> {
        Ok(Rates {
            input_per_mtok: Amounts::required(fields[0], &wire.input_per_mtok_usd)?,
            output_per_mtok: Amounts::required(fields[1], &wire.output_per_mtok_usd)?,
            cached_input_per_mtok: Amounts::optional(fields[2], &wire.cached_input_per_mtok_usd)?,
            cache_write_per_mtok: Amounts::optional(fields[3], &wire.cache_write_per_mtok_usd)?,
        })
    }
}

/// The fields of each place rates sit in, for errors.
macro_rules! rate_fields {
    ($prefix:literal) => {
        [
            concat!($prefix, "input_per_mtok_usd"),
            concat!($prefix, "output_per_mtok_usd"),
            concat!($prefix, "cached_input_per_mtok_usd"),
            concat!($prefix, "cache_write_per_mtok_usd"),
        ]
    };
}

impl TryFrom<&PriceWire> for Price {
    type Error = PriceError;

    fn try_from(wire: &PriceWire) -> Result<Price, PriceError> {
        let optional = Amounts::optional;
        let rates =
            |wire: &Option<RatesWire>, fields| wire.as_ref().map(|w| Amounts::rates(w, fields)).transpose();
        let long_context = match &wire.long_context {
            None => None,
            Some(long) => Some(LongContext {
                above_input_tokens: long.above_input_tokens,
                standard: Amounts::rates(&long.standard, rate_fields!("long_context.standard."))?,
                flex: rates(&long.flex, rate_fields!("long_context.flex."))?,
                priority: rates(&long.priority, rate_fields!("long_context.priority."))?,
            }),
        };
        Ok(Price {
            input_per_mtok: Amounts::required("input_per_mtok_usd", &wire.input_per_mtok_usd)?,
            output_per_mtok: Amounts::required("output_per_mtok_usd", &wire.output_per_mtok_usd)?,
            cached_input_per_mtok: optional("cached_input_per_mtok_usd", &wire.cached_input_per_mtok_usd)?,
            cache_write_per_mtok: optional("cache_write_per_mtok_usd", &wire.cache_write_per_mtok_usd)?,
            cache_write_1h_per_mtok: optional(
                "cache_write_1h_per_mtok_usd",
                &wire.cache_write_1h_per_mtok_usd,
            )?,
            batch_input_per_mtok: optional("batch_input_per_mtok_usd", &wire.batch_input_per_mtok_usd)?,
            batch_output_per_mtok: optional("batch_output_per_mtok_usd", &wire.batch_output_per_mtok_usd)?,
            audio_input_per_mtok: optional("audio_input_per_mtok_usd", &wire.audio_input_per_mtok_usd)?,
            audio_output_per_mtok: optional("audio_output_per_mtok_usd", &wire.audio_output_per_mtok_usd)?,
            cached_audio_input_per_mtok: optional(
                "cached_audio_input_per_mtok_usd",
                &wire.cached_audio_input_per_mtok_usd,
            )?,
            image_input_per_mtok: optional("image_input_per_mtok_usd", &wire.image_input_per_mtok_usd)?,
            image_output_per_mtok: optional("image_output_per_mtok_usd", &wire.image_output_per_mtok_usd)?,
            cached_image_input_per_mtok: optional(
                "cached_image_input_per_mtok_usd",
                &wire.cached_image_input_per_mtok_usd,
            )?,
            per_image: optional("per_image_usd", &wire.per_image_usd)?,
            per_million_characters: optional("per_million_characters_usd", &wire.per_million_characters_usd)?,
            per_million_seconds: optional("per_million_seconds_usd", &wire.per_million_seconds_usd)?,
            web_search_per_call: optional("web_search_per_call_usd", &wire.web_search_per_call_usd)?,
            web_search_per_prompt: wire.web_search_per_prompt,
            file_search_per_call: optional("file_search_per_call_usd", &wire.file_search_per_call_usd)?,
            code_interpreter_per_session: optional(
                "code_interpreter_per_session_usd",
                &wire.code_interpreter_per_session_usd,
            )?,
            flex: rates(&wire.flex, rate_fields!("flex."))?,
            priority: rates(&wire.priority, rate_fields!("priority."))?,
            long_context,
            max_output_tokens: wire.max_output_tokens,
        })
    }
}

impl From<&Rates> for RatesWire {
    fn from(rates: &Rates) -> RatesWire {
        RatesWire {
            input_per_mtok_usd: rates.input_per_mtok.to_usd_string(),
            output_per_mtok_usd: rates.output_per_mtok.to_usd_string(),
            cached_input_per_mtok_usd: rates.cached_input_per_mtok.map(Nanos::to_usd_string),
            cache_write_per_mtok_usd: rates.cache_write_per_mtok.map(Nanos::to_usd_string),
        }
    }
}

impl From<&Price> for PriceWire {
    fn from(price: &Price) -> PriceWire {
        let usd = |n: Option<Nanos>| n.map(Nanos::to_usd_string);
        PriceWire {
            kind: None,
            input_per_mtok_usd: price.input_per_mtok.to_usd_string(),
            output_per_mtok_usd: price.output_per_mtok.to_usd_string(),
            cached_input_per_mtok_usd: usd(price.cached_input_per_mtok),
            cache_write_per_mtok_usd: usd(price.cache_write_per_mtok),
            cache_write_1h_per_mtok_usd: usd(price.cache_write_1h_per_mtok),
            batch_input_per_mtok_usd: usd(price.batch_input_per_mtok),
            batch_output_per_mtok_usd: usd(price.batch_output_per_mtok),
            audio_input_per_mtok_usd: usd(price.audio_input_per_mtok),
            audio_output_per_mtok_usd: usd(price.audio_output_per_mtok),
            cached_audio_input_per_mtok_usd: usd(price.cached_audio_input_per_mtok),
            image_input_per_mtok_usd: usd(price.image_input_per_mtok),
            image_output_per_mtok_usd: usd(price.image_output_per_mtok),
            cached_image_input_per_mtok_usd: usd(price.cached_image_input_per_mtok),
            per_image_usd: usd(price.per_image),
            per_million_characters_usd: usd(price.per_million_characters),
            per_million_seconds_usd: usd(price.per_million_seconds),
            web_search_per_call_usd: usd(price.web_search_per_call),
            web_search_per_prompt: price.web_search_per_prompt,
            file_search_per_call_usd: usd(price.file_search_per_call),
            code_interpreter_per_session_usd: usd(price.code_interpreter_per_session),
            flex: price.flex.as_ref().map(RatesWire::from),
            priority: price.priority.as_ref().map(RatesWire::from),
            long_context: price.long_context.as_ref().map(|long| LongContextWire {
                above_input_tokens: long.above_input_tokens,
                standard: RatesWire::from(&long.standard),
                flex: long.flex.as_ref().map(RatesWire::from),
                priority: long.priority.as_ref().map(RatesWire::from),
            }),
            max_output_tokens: price.max_output_tokens,
        }
    }
}

impl PriceWire {
    /// The wire form of `price`, served by `kind`.
    pub fn of(kind: Option<ProviderKind>, price: &Price) -> PriceWire {
        PriceWire { kind: kind.map(|kind| kind.as_str().to_owned()), ..PriceWire::from(price) }
    }

    /// The kind and the price; the error names the offending field.
    pub fn parse(&self) -> Result<(Option<ProviderKind>, Price), PriceError> {
        let kind = self
            .kind
            .as_deref()
            .map(|kind| ProviderKind::parse(kind).ok_or(PriceError { field: "kind", error: None }))
            .transpose()?;
        Ok((kind, Price::try_from(self)?))
    }

    /// The price alone, as the feed and the store carry it.
    pub fn without_kind(&self) -> PriceWire {
        PriceWire { kind: None, ..self.clone() }
    }
}

/// A [`PriceWire`] field that is not an amount of US dollars (or, for `kind`, not
/// a provider kind); `field` is its wire name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceError {
    field: &'static str,
    /// `None` for `kind`.
    error: Option<MoneyError>,
}

impl PriceError {
    /// The wire name of the offending field, e.g. `cached_input_per_mtok_usd`.
    pub fn field(&self) -> &'static str {
        self.field
    }

    pub fn money_error(&self) -> Option<&MoneyError> {
        self.error.as_ref()
    }
}

impl fmt::Display for PriceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.error {
            Some(error) => write!(f, "{}: {}", self.field, error),
            None => write!(
                f,
                "{}: expected \"openai\", \"anthropic\", \"azure_openai\" or \"gemini\"",
                self.field
            ),
        }
    }
}

impl std::error::Error for PriceError {}

/// A price table file that does not parse; the message names the place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceTableError(pub(super) String);

impl fmt::Display for PriceTableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "price table: {}", self.0)
    }
}

impl std::error::Error for PriceTableError {}

/// The file format written by `scripts/update-prices`, also accepted by the admin API's import.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TableFile {
    // Provenance for people reading the file; the table itself needs only the models.
    #[serde(default, rename = "source")]
    _source: Option<String>,
    #[serde(default, rename = "license")]
    _license: Option<String>,
    pub(crate) models: BTreeMap<String, PriceWire>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pricing::PriceTable;
    use crate::pricing::tests::{any_full_price, price};
    use proptest::prelude::*;

    #[test]
    fn builtin_prices_survive_the_wire_form() {
        for (model, entry) in PriceTable::builtin().iter() {
            let wire = PriceWire::of(entry.kind, &entry.price);
            assert_eq!(wire.parse(), Ok((entry.kind, entry.price)), "{model}");
        }
    }

    #[test]
    fn wire_form_is_decimal_strings_and_names_the_bad_field() {
        let wire: PriceWire =
            serde_json::from_str(r#"{"input_per_mtok_usd": "2.50", "output_per_mtok_usd": "10"}"#)
                .expect("wire");
        let parsed = Price::try_from(&wire).expect("valid");
        assert_eq!(parsed, price("2.5", "10", None, None));
        assert_eq!(
            serde_json::to_string(&PriceWire::from(&parsed)).expect("json"),
            r#"{"input_per_mtok_usd":"2.50","output_per_mtok_usd":"10.00"}"#
        );
        let with_cache = price("3", "15", Some("0.3"), Some("3.75"));
        assert_eq!(
            serde_json::to_value(PriceWire::from(&with_cache)).expect("json"),
            serde_json::json!({"input_per_mtok_usd": "3.00", "output_per_mtok_usd": "15.00",
                "cached_input_per_mtok_usd": "0.30", "cache_write_per_mtok_usd": "3.75"})
        );

        let bad = PriceWire { cached_input_per_mtok_usd: Some("-1".to_owned()), ..wire.clone() };
        let error = Price::try_from(&bad).expect_err("negative");
        assert_eq!(error.field(), "cached_input_per_mtok_usd");
        assert!(error.to_string().starts_with("cached_input_per_mtok_usd: "), "{error}");
        let bad = PriceWire { output_per_mtok_usd: "1e3".to_owned(), ..wire };
        assert_eq!(Price::try_from(&bad).map_err(|e| e.field()), Err("output_per_mtok_usd"));

        let unknown = r#"{"input_per_mtok_usd": "1", "output_per_mtok_usd": "1", "batch_per_mtok_usd": "1"}"#;
        assert!(serde_json::from_str::<PriceWire>(unknown).is_err());
        assert!(
            serde_json::from_str::<PriceWire>(r#"{"input_per_mtok_usd": 1, "output_per_mtok_usd": "1"}"#)
                .is_err()
        );
    }

    proptest! {
        /// The wire form carries every component, both ways.
        #[test]
        fn every_component_survives_the_wire_form(price in any_full_price()) {
            let wire = PriceWire::from(&price);
            prop_assert_eq!(Price::try_from(&wire), Ok(price));
        }
    }
}

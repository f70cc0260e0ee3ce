//! Price files an operator imports in bulk: the built-in table's own format, or LiteLLM's
//! `model_prices_and_context_window.json` (the public list the built-in table is made from). Money
//! is read from each number's text, never through a float.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{PriceTableError, PriceWire, TableFile};
use crate::money::Nanos;

/// LiteLLM's providers whose models the gateway serves, and the kind that serves them.
const PROVIDERS: [(&str, &str); 4] = [
    ("openai", "openai"),
    ("text-completion-openai", "openai"),
    ("anthropic", "anthropic"),
    ("gemini", "gemini"),
];
/// LiteLLM names Gemini's models `gemini/<model>`; Gemini's own API names them `<model>`.
const NAME_PREFIXES: [(&str, &str); 1] = [("gemini", "gemini/")];
/// LiteLLM's modes priced per token; the others (images, speech...) are billed otherwise. An import
/// of LiteLLM's list takes these per-token prices only: `scripts/update-prices` rebuilds the
/// built-in table with every component (tiers, long context, images, characters, seconds, tools)
/// and every provider's namespace, in the table's own format, which an import takes whole.
const MODES: [&str; 5] = ["chat", "completion", "responses", "embedding", "realtime"];

/// What an import file holds: every entry it prices, validated, and the names of the entries of a
/// served provider that were passed over for lacking an input or output price.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    pub entries: Vec<(String, PriceWire)>,
    pub skipped: Vec<String>,
}

/// Reads an import file in either format. The built-in table's format is recognized by its
/// `models` object beside nothing but `source` and `license`; anything else is read as LiteLLM's,
/// of which only entries of the `openai`, `text-completion-openai`, `anthropic` and `gemini` providers
/// in a per-token mode are taken (a `gemini/` name without its prefix). Every price is checked; the error names the model and field.
pub fn parse(text: &str) -> Result<Import, PriceTableError> {
    let top: BTreeMap<String, &RawValue> =
        serde_json::from_str(text).map_err(|e| PriceTableError(e.to_string()))?;
    let own = top.contains_key("models")
        && top.keys().all(|key| ["source", "license", "models"].contains(&key.as_str()));
    if !own {
        return litellm(&top);
    }
    let file: TableFile = serde_json::from_str(text).map_err(|e| PriceTableError(e.to_string()))?;
    let entries: Vec<(String, PriceWire)> = file.models.into_iter().collect();
    check(&entries)?;
    Ok(Import { entries, skipped: Vec::new() })
}

fn check(entries: &[(String, PriceWire)]) -> Result<(), PriceTableError> {
    for (model, entry) in entries {
        entry.parse().map_err(|e| PriceTableError(format!("models.{model}.{e}")))?;
    }
    Ok(())
}

/// The fields of a LiteLLM entry that matter here; the many others are ignored.
#[derive(Deserialize)]
struct LiteEntry<'a> {
    #[serde(default, borrow)]
    input_cost_per_token: Option<&'a RawValue>,
    #[serde(default, borrow)]
    output_cost_per_token: Option<&'a RawValue>,
    #[serde(default, borrow)]
    cache_read_input_token_cost: Option<&'a RawValue>,
    #[serde(default, borrow)]
    cache_creation_input_token_cost: Option<&'a RawValue>,
    #[serde(default, borrow)]
    input_cost_per_token_batches: Option<&'a RawValue>,
    #[serde(default, borrow)]
    output_cost_per_token_batches: Option<&'a RawValue>,
    #[serde(default, borrow)]
    input_cost_per_audio_token: Option<&'a RawValue>,
    #[serde(default, borrow)]
    output_cost_per_audio_token: Option<&'a RawValue>,
    #[serde(default, borrow)]
    cache_read_input_audio_token_cost: Option<&'a RawValue>,
    /// On LiteLLM's Realtime entries this misnamed field holds the price of cached audio input.
    #[serde(default, borrow)]
    cache_creation_input_audio_token_cost: Option<&'a RawValue>,
    #[serde(default, borrow)]
    max_output_tokens: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Classified {
    #[serde(default)]
    litellm_provider: Option<serde_json::Value>,
    #[serde(default)]
    mode: Option<serde_json::Value>,
}

fn litellm(top: &BTreeMap<String, &RawValue>) -> Result<Import, PriceTableError> {
    let mut import = Import { entries: Vec::new(), skipped: Vec::new() };
    for (model, raw) in top {
        // Entries that are not objects, or of other providers, are not ours to read.
        let Ok(classified) = serde_json::from_str::<Classified>(raw.get()) else { continue };
        let provider = classified.litellm_provider.as_ref().and_then(serde_json::Value::as_str);
        let Some(kind) = PROVIDERS.iter().find(|(name, _)| Some(*name) == provider).map(|(_, kind)| *kind)
        else {
            continue;
        };
        if !classified
            .mode
            .as_ref()
            .and_then(serde_json::Value::as_str)
            .is_some_and(|mode| MODES.contains(&mode))
        {
            continue;
        }
        let entry: LiteEntry<'_> =
            serde_json::from_str(raw.get()).map_err(|e| PriceTableError(format!("{model}: {e}")))?;
        let (Some(input), Some(output)) = (entry.input_cost_per_token, entry.output_cost_per_token) else {
            import.skipped.push(model.clone());
            continue;
        };
        let usd = |field: &str, raw: &RawValue| {
            per_mtok_from_per_token(raw.get())
                .map(Nanos::to_usd_string)
                .map_err(|e| PriceTableError(format!("{model}.{field}: {e}")))
        };
        let optional = |field: &str, raw: Option<&RawValue>| raw.map(|raw| usd(field, raw)).transpose();
        let prefix = NAME_PREFIXES.iter().find(|(name, _)| Some(*name) == provider).map_or("", |(_, p)| *p);
        import.entries.push((
            model.strip_prefix(prefix).unwrap_or(model).to_owned(),
            PriceWire {
                kind: Some(kind.to_owned()),
                input_per_mtok_usd: usd("input_cost_per_token", input)?,
                output_per_mtok_usd: usd("output_cost_per_token", output)?,
                cached_input_per_mtok_usd: optional(
                    "cache_read_input_token_cost",
                    entry.cache_read_input_token_cost,
                )?,
                cache_write_per_mtok_usd: optional(
                    "cache_creation_input_token_cost",
                    entry.cache_creation_input_token_cost,
                )?,
                batch_input_per_mtok_usd: optional(
                    "input_cost_per_token_batches",
                    entry.input_cost_per_token_batches,
                )?,
                batch_output_per_mtok_usd: optional(
                    "output_cost_per_token_batches",
                    entry.output_cost_per_token_batches,
                )?,
                audio_input_per_mtok_usd: optional(
                    "input_cost_per_audio_token",
                    entry.input_cost_per_audio_token,
                )?,
                audio_output_per_mtok_usd: optional(
                    "output_cost_per_audio_token",
                    entry.output_cost_per_audio_token,
                )?,
                cached_audio_input_per_mtok_usd: match entry.cache_read_input_audio_token_cost {
                    Some(raw) => Some(usd("cache_read_input_audio_token_cost", raw)?),
                    None => optional(
                        "cache_creation_input_audio_token_cost",
                        entry.cache_creation_input_audio_token_cost,
                    )?,
                },
                // A count, not money: a float in the file (`16384.0`) is read as the integer it is.
                max_output_tokens: entry.max_output_tokens.and_then(|raw| token_count(raw.get())),
                ..PriceWire::default()
            },
        ));
    }
    Ok(import)
}

/// A whole, positive number of tokens as JSON writes it (`16384`, or `16384.0`); anything else
/// (a fraction, an exponent, a string) is unknown.
fn token_count(text: &str) -> Option<u64> {
    let whole = match text.split_once('.') {
        Some((whole, fraction)) if fraction.bytes().all(|b| b == b'0') => whole,
        Some(_) => return None,
        None => text,
    };
    whole.parse::<u64>().ok().filter(|&n| n > 0)
}

/// A JSON number of US dollars per token (`3e-06`, `0.000003`, `1.5E-7`, `0`) as nano-dollars per
/// million tokens, exactly: the digits are scaled by their exponent as integers, and an amount that
/// needs a fraction of a nano-dollar per million tokens, is negative or does not fit is refused.
pub fn per_mtok_from_per_token(text: &str) -> Result<Nanos, String> {
    let not_a_number = || format!("not a JSON number: {text:?}");
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    if mantissa.starts_with('-') {
        return Err(format!("a negative price is not allowed: {text}"));
    }
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty()
        || !digits(whole)
        || !digits(fraction)
        || (mantissa.contains('.') && fraction.is_empty())
    {
        return Err(not_a_number());
    }
    let exponent: i64 = match exponent {
        None => 0,
        Some(exp) => {
            let unsigned = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if unsigned.is_empty() || !digits(unsigned) || unsigned.len() > 6 {
                return Err(not_a_number());
            }
            exp.parse().map_err(|_| not_a_number())?
        }
    };
    let significant = format!("{whole}{fraction}");
    let significant = significant.trim_start_matches('0');
    // value = significant x 10^(exponent - fraction digits); nano-dollars per Mtok = value x 10^15.
    let fraction_len = i64::try_from(fraction.len()).map_err(|_| not_a_number())?;
    let mut scale = exponent - fraction_len + 15;
    let mut significant = significant.to_owned();
    while scale < 0 && significant.ends_with('0') {
        significant.pop();
        scale += 1;
    }
    if significant.is_empty() {
        return Ok(Nanos::ZERO);
    }
    if scale < 0 {
        return Err(format!("{text} per token needs more than 9 decimals of a dollar per Mtok"));
    }
    let too_large = || format!("{text} per token is too large");
    let mut nanos: i64 = significant.parse().map_err(|_| too_large())?;
    for _ in 0..scale {
        nanos = nanos.checked_mul(10).ok_or_else(too_large)?;
    }
    Ok(Nanos(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nanos(usd: &str) -> Nanos {
        Nanos::parse_usd(usd).expect("amount")
    }

    #[test]
    fn per_token_numbers_scale_exactly() {
        for (text, per_mtok) in [
            ("3e-06", "3"),
            ("3E-6", "3"),
            ("0.000003", "3"),
            ("1.5e-07", "0.15"),
            ("2.5e-6", "2.5"),
            ("0", "0"),
            ("0.0", "0"),
            ("1", "1000000"),
            ("1e+0", "1000000"),
            ("7.5e-08", "0.075"),
            ("1e-15", "0.000000001"),
            ("10e-16", "0.000000001"),
            ("0.000000000000001000", "0.000000001"),
        ] {
            assert_eq!(per_mtok_from_per_token(text), Ok(nanos(per_mtok)), "{text}");
        }
        for refused in
            ["1e-16", "-3e-06", "3e-", ".5", "1.", "0x10", "", "1e9999999", "1e20", "\"3e-06\"", "NaN"]
        {
            assert!(per_mtok_from_per_token(refused).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn litellm_files_give_the_served_providers_entries() {
        let text = r#"{
            "sample_spec": {"litellm_provider": "one of the providers", "mode": "one of: chat", "input_cost_per_token": 0.0},
            "gpt-x": {"litellm_provider": "openai", "mode": "chat", "input_cost_per_token": 2.5e-06,
                "output_cost_per_token": 1e-05, "cache_read_input_token_cost": 1.25e-06, "max_tokens": 4096},
            "claude-x": {"litellm_provider": "anthropic", "mode": "chat", "input_cost_per_token": 3e-06,
                "output_cost_per_token": 1.5e-05, "cache_creation_input_token_cost": 3.75e-06,
                "cache_read_input_token_cost": 3e-07},
            "davinci-x": {"litellm_provider": "text-completion-openai", "mode": "completion",
                "input_cost_per_token": 2e-06, "output_cost_per_token": 2e-06},
            "dall-e-x": {"litellm_provider": "openai", "mode": "image_generation", "input_cost_per_pixel": 1e-08},
            "gemini/gemini-x": {"litellm_provider": "gemini", "mode": "chat", "input_cost_per_token": 3e-07,
                "output_cost_per_token": 2.5e-06, "cache_read_input_token_cost": 3e-08},
            "groq/llama": {"litellm_provider": "groq", "mode": "chat", "input_cost_per_token": 1e-07, "output_cost_per_token": 1e-07},
            "gpt-free": {"litellm_provider": "openai", "mode": "chat", "input_cost_per_token": 0},
            "gpt-rt": {"litellm_provider": "openai", "mode": "realtime", "input_cost_per_token": 4e-06,
                "output_cost_per_token": 1.6e-05, "input_cost_per_audio_token": 3.2e-05,
                "output_cost_per_audio_token": 6.4e-05, "cache_creation_input_audio_token_cost": 4e-07,
                "input_cost_per_token_batches": 2e-06, "max_output_tokens": 4096.0},
            "odd": [1, 2]
        }"#;
        let import = parse(text).expect("parses");
        let names: Vec<&str> = import.entries.iter().map(|(model, _)| model.as_str()).collect();
        assert_eq!(names, ["claude-x", "davinci-x", "gemini-x", "gpt-rt", "gpt-x"]);
        let realtime = &import.entries[3].1;
        assert_eq!(
            (
                realtime.audio_input_per_mtok_usd.as_deref(),
                realtime.audio_output_per_mtok_usd.as_deref(),
                realtime.cached_audio_input_per_mtok_usd.as_deref(),
                realtime.batch_input_per_mtok_usd.as_deref(),
                realtime.max_output_tokens,
            ),
            (Some("32.00"), Some("64.00"), Some("0.40"), Some("2.00"), Some(4096))
        );
        assert_eq!(
            import.entries[4].1.max_output_tokens, None,
            "LiteLLM's max_tokens is not an output limit"
        );
        assert_eq!(import.entries[2].1.kind.as_deref(), Some("gemini"));
        assert_eq!(import.entries[2].1.cached_input_per_mtok_usd.as_deref(), Some("0.03"));
        assert_eq!(import.skipped, ["gpt-free"]);
        let (_, claude) = &import.entries[0];
        assert_eq!(claude.kind.as_deref(), Some("anthropic"));
        assert_eq!(
            (claude.input_per_mtok_usd.as_str(), claude.output_per_mtok_usd.as_str()),
            ("3.00", "15.00")
        );
        assert_eq!(claude.cached_input_per_mtok_usd.as_deref(), Some("0.30"));
        assert_eq!(claude.cache_write_per_mtok_usd.as_deref(), Some("3.75"));
        assert_eq!(import.entries[1].1.kind.as_deref(), Some("openai"));

        let bad = r#"{"gpt-x": {"litellm_provider": "openai", "mode": "chat", "input_cost_per_token": "3e-06", "output_cost_per_token": 1}}"#;
        let error = parse(bad).expect_err("a string is not a price").to_string();
        assert!(error.contains("gpt-x.input_cost_per_token"), "{error}");
    }

    #[test]
    fn token_counts_are_whole_and_positive() {
        for (text, count) in [("16384", Some(16384)), ("16384.0", Some(16384)), ("4096.00", Some(4096))] {
            assert_eq!(token_count(text), count, "{text}");
        }
        for refused in ["0", "-1", "1.5", "1e4", "\"4096\"", "", "."] {
            assert_eq!(token_count(refused), None, "{refused}");
        }
    }

    #[test]
    fn the_builtin_format_is_read_and_checked() {
        let text = r#"{"source": "ours", "models": {"m": {"kind": "openai", "input_per_mtok_usd": "1", "output_per_mtok_usd": "2"}}}"#;
        let import = parse(text).expect("parses");
        assert_eq!(import.entries.len(), 1);
        assert_eq!(import.entries[0].1.kind.as_deref(), Some("openai"));
        let bad = r#"{"models": {"m": {"input_per_mtok_usd": "-1", "output_per_mtok_usd": "2"}}}"#;
        assert!(parse(bad).expect_err("negative").to_string().contains("models.m.input_per_mtok_usd"));
        let unknown =
            r#"{"models": {"m": {"input_per_mtok_usd": "1", "output_per_mtok_usd": "2", "batch": "1"}}}"#;
        assert!(parse(unknown).is_err());
        assert!(
            parse(include_str!("../../prices/builtin.json")).is_ok_and(|import| import.entries.len() > 100)
        );
        assert!(parse("[]").is_err());
    }

    proptest! {
        #[test]
        fn any_nano_amount_survives_every_spelling(nanos in 0_i64..1_000_000_000_000_000, shift in 0_u32..6) {
            // n nano-dollars per Mtok is n x 10^-15 dollars per token.
            prop_assert_eq!(per_mtok_from_per_token(&format!("{nanos}e-15")), Ok(Nanos(nanos)));
            let decimal = format!("{}.{:015}", nanos / 10_i64.pow(15), nanos % 10_i64.pow(15));
            prop_assert_eq!(per_mtok_from_per_token(&decimal), Ok(Nanos(nanos)));
            let divisor = 10_i64.pow(shift);
            let smaller = per_mtok_from_per_token(&format!("{nanos}e-{}", 15 + shift));
            if nanos % divisor == 0 {
                prop_assert_eq!(smaller, Ok(Nanos(nanos / divisor)));
            } else {
                prop_assert!(smaller.is_err(), "a fraction of a nano-dollar is refused");
            }
        }
    }
}

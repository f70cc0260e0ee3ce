//! The price table: prices by model name, the rule a model's name resolves by, and the fallback
//! prices of a provider kind, a namespace or a credential for a model no entry prices.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use super::Price;
use super::resolution::{Fallback, PriceScope, PriceSource, PricedAs, Resolution, TableEntry};
use super::wire::{PriceTableError, TableFile};
use crate::money::Nanos;
use crate::provider_kind::ProviderKind;

const BUILTIN_JSON: &str = include_str!("../../prices/builtin.json");

/// The kinds with a fallback price of their own: Azure OpenAI is priced like OpenAI
/// ([`ProviderKind::priced_like`]), and shares its fallback.
pub const KINDS: [ProviderKind; 3] = [ProviderKind::OpenAi, ProviderKind::Anthropic, ProviderKind::Gemini];

fn kind_index(kind: ProviderKind) -> usize {
    match kind.priced_like() {
        ProviderKind::OpenAi | ProviderKind::AzureOpenAi => 0,
        ProviderKind::Anthropic => 1,
        ProviderKind::Gemini => 2,
    }
}

/// Prices by model name, and a fallback price per provider kind; immutable once built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceTable {
    /// Sorted by name. Each entry is held once: the built-in table's 4,687 are most of a node's
    /// price memory.
    entries: Vec<(String, TableEntry)>,
    /// The index in `entries` of each name: every request looks its model up, and most find it
    /// as named.
    by_name: foldhash::HashMap<String, u32>,
    /// The operators' fallback price per kind, by [`kind_index`].
    fallback_overrides: [Option<Price>; 3],
    /// Computed when the table is built, so that pricing an unknown model reads one value.
    fallback: [Price; 3],
    /// Each price namespace's fallback: the most expensive input and output among its entries.
    namespaces: foldhash::HashMap<String, Price>,
}

impl Default for PriceTable {
    fn default() -> PriceTable {
        PriceTable::new(BTreeMap::new(), [None, None, None])
    }
}

impl PriceTable {
    /// The table shipped in the binary, parsed on first use.
    pub fn builtin() -> &'static PriceTable {
        Self::builtin_shared()
    }

    /// The built-in table, shared: one copy for the whole process however many states use it.
    pub fn builtin_shared() -> &'static Arc<PriceTable> {
        static BUILTIN: OnceLock<Arc<PriceTable>> = OnceLock::new();
        BUILTIN.get_or_init(|| {
            Arc::new(
                PriceTable::from_json(BUILTIN_JSON)
                    .expect("the built-in price table parses, as a test checks"),
            )
        })
    }

    /// The built-in table with `overrides` over it and the kinds' fallbacks set: the built-in
    /// table itself, shared, when there is nothing to change (most deployments), so that the
    /// table's few megabytes are held once, not once per state.
    pub fn builtin_with(
        overrides: &PriceTable,
        fallback_overrides: Vec<(ProviderKind, Price)>,
    ) -> Arc<PriceTable> {
        if overrides.entries.is_empty() && fallback_overrides.is_empty() {
            return Arc::clone(Self::builtin_shared());
        }
        Arc::new(Self::builtin().overlay(overrides, fallback_overrides))
    }

    fn new(entries: BTreeMap<String, TableEntry>, fallback_overrides: [Option<Price>; 3]) -> PriceTable {
        let fallback = KINDS.map(|kind| {
            fallback_overrides[kind_index(kind)].unwrap_or_else(|| most_expensive(&entries, kind))
        });
        let namespaces = namespace_fallbacks(&entries);
        let entries: Vec<(String, TableEntry)> = entries.into_iter().collect();
        let by_name = entries
            .iter()
            .enumerate()
            .map(|(index, (name, _))| (name.clone(), u32::try_from(index).unwrap_or(u32::MAX)))
            .collect();
        PriceTable { entries, by_name, fallback_overrides, fallback, namespaces }
    }

    /// A table of these prices, of no known kind; of two entries for one model, the later wins.
    pub fn from_entries(entries: impl IntoIterator<Item = (String, Price)>) -> PriceTable {
        PriceTable::from_kinded(entries.into_iter().map(|(model, price)| (model, None, price)))
    }

    /// A table of these prices served by these kinds; of two entries for one model, the later wins.
    pub fn from_kinded(
        entries: impl IntoIterator<Item = (String, Option<ProviderKind>, Price)>,
    ) -> PriceTable {
        let entries = entries
            .into_iter()
            .map(|(model, kind, price)| (model, TableEntry { price, kind, source: PriceSource::Builtin }))
            .collect();
        PriceTable::new(entries, [None, None, None])
    }

    /// Parses the built-in table's format: `{"source"?, "license"?, "models": {name: PriceWire}}`.
    pub fn from_json(text: &str) -> Result<PriceTable, PriceTableError> {
        let file: TableFile = serde_json::from_str(text).map_err(|e| PriceTableError(e.to_string()))?;
        let mut entries = Vec::with_capacity(file.models.len());
        for (model, wire) in &file.models {
            let (kind, price) = wire.parse().map_err(|e| PriceTableError(format!("models.{model}.{e}")))?;
            entries.push((model.clone(), kind, price));
        }
        Ok(PriceTable::from_kinded(entries))
    }

    /// The entry a model name resolves to, by this rule:
    /// 1. the exact name;
    /// 2. the name without a `provider/` prefix (everything up to the first `/`; one prefix only);
    /// 3. the family stem of that name: without a trailing `-YYYY-MM-DD`, `-YYYYMMDD` or `-latest`
    ///    (the name itself when it has none), then the stem's undated entry, else the entry of the
    ///    stem with the latest date (`claude-3-7-sonnet-latest` → `claude-3-7-sonnet-20250219`).
    ///
    /// An exact entry always wins, so a dated snapshot priced differently from its alias keeps its
    /// own price. A date is a whole suffix after the stem, so no step crosses families:
    /// `claude-sonnet-4-…` never reaches `claude-sonnet-4-5`. `None` when nothing resolves.
    pub fn resolve(&self, model: &str) -> Option<Resolution<'_>> {
        if let Some((name, entry)) = self.named(model) {
            return Some(Resolution {
                price: entry.price,
                source: entry.source,
                priced_as: PricedAs::Entry(name),
            });
        }
        let unprefixed = model.split_once('/').map_or(model, |(_, rest)| rest);
        let stem = strip_version_suffix(unprefixed).unwrap_or(unprefixed);
        let (name, entry) = [unprefixed, stem]
            .into_iter()
            .find_map(|name| self.named(name))
            .or_else(|| self.newest_dated(stem))?;
        Some(Resolution { price: entry.price, source: PriceSource::Alias, priced_as: PricedAs::Entry(name) })
    }

    /// The price a request for `model` (if it names one) through a `kind` credential is costed at:
    /// its entry's, else the kind's fallback price. Never nothing, so never free by omission.
    pub fn price_for(&self, model: Option<&str>, kind: ProviderKind) -> Resolution<'_> {
        model.and_then(|m| self.resolve(m)).unwrap_or_else(|| self.kind_fallback(kind))
    }

    /// The price a request for `model` through a credential of `scope` is costed at:
    /// 1. in the credential's namespace (`{namespace}/{model}`, by [`PriceTable::resolve`]'s rule
    ///    less its prefix step: the namespace is the prefix), when it has one (its name is one when
    ///    the table has entries under it);
    /// 2. else by the bare name, for a credential without a namespace, and for Azure OpenAI, whose
    ///    resources serve OpenAI's models at OpenAI's prices;
    /// 3. else the credential's own fallback price, the namespace's (its most expensive input and
    ///    output), or the kind's.
    ///
    /// A model one provider serves is never priced at another's: a namespace's credential does not
    /// reach bare names (Azure excepted).
    pub fn price_in(&self, model: Option<&str>, scope: &PriceScope) -> Resolution<'_> {
        let namespace = self.namespace_of(scope);
        let found = model.and_then(|model| match namespace {
            Some(namespace) => self
                .resolve_in(namespace, model)
                .or_else(|| (scope.kind == ProviderKind::AzureOpenAi).then(|| self.resolve(model)).flatten()),
            None => self.resolve(model),
        });
        found.unwrap_or_else(|| {
            if let Some(price) = &scope.fallback {
                return Resolution {
                    price: **price,
                    source: PriceSource::Fallback,
                    priced_as: PricedAs::CredentialFallback,
                };
            }
            match namespace.and_then(|namespace| self.namespaces.get_key_value(namespace)) {
                Some((namespace, price)) => Resolution {
                    price: *price,
                    source: PriceSource::Fallback,
                    priced_as: PricedAs::NamespaceFallback(namespace),
                },
                None => self.kind_fallback(scope.kind),
            }
        })
    }

    /// The namespace a credential's models resolve in, if any.
    pub fn namespace_of<'s>(&self, scope: &'s PriceScope) -> Option<&'s str> {
        scope
            .namespace
            .as_deref()
            .filter(|namespace| !scope.namespace_is_name || self.has_namespace(namespace))
    }

    /// Whether any entry is under `namespace`.
    pub fn has_namespace(&self, namespace: &str) -> bool {
        self.namespaces.contains_key(namespace)
    }

    /// The namespaces of the table, with their fallback prices, by name.
    pub fn namespaces(&self) -> impl Iterator<Item = (&str, &Price)> {
        let mut all: Vec<_> = self.namespaces.iter().map(|(name, price)| (name.as_str(), price)).collect();
        all.sort_unstable_by_key(|(name, _)| *name);
        all.into_iter()
    }

    /// `model` within `namespace`: the exact `{namespace}/{model}`, else its family stem's entry,
    /// else the stem's newest dated one. A model the client names with the namespace already
    /// (`groq/llama-3.3-70b-versatile`) is found as named.
    fn resolve_in(&self, namespace: &str, model: &str) -> Option<Resolution<'_>> {
        let named = model.strip_prefix(namespace).is_some_and(|rest| rest.starts_with('/'));
        let full = if named { model.to_owned() } else { format!("{namespace}/{model}") };
        if let Some((name, entry)) = self.named(&full) {
            return Some(Resolution {
                price: entry.price,
                source: entry.source,
                priced_as: PricedAs::Entry(name),
            });
        }
        let stem = strip_version_suffix(&full).unwrap_or(&full);
        let (name, entry) = self.named(stem).or_else(|| self.newest_dated(stem))?;
        Some(Resolution { price: entry.price, source: PriceSource::Alias, priced_as: PricedAs::Entry(name) })
    }

    fn kind_fallback(&self, kind: ProviderKind) -> Resolution<'_> {
        Resolution {
            price: self.fallback[kind_index(kind)],
            source: PriceSource::Fallback,
            priced_as: PricedAs::Fallback(kind.priced_like()),
        }
    }

    /// The price of one generated image of `model` at `quality` and `size` (`1024x1792`), in
    /// `scope`: the entry `{model}#{quality}-{size}`, else `{model}#{size}`, else `None` (the model's
    /// own entry prices its default image).
    pub fn image_price(
        &self,
        model: &str,
        quality: Option<&str>,
        size: &str,
        scope: &PriceScope,
    ) -> Option<Nanos> {
        let namespace = self.namespace_of(scope);
        let prefixed = |name: String| match namespace {
            Some(namespace) if !name.starts_with(&format!("{namespace}/")) => format!("{namespace}/{name}"),
            _ => name,
        };
        let mut names = Vec::with_capacity(2);
        if let Some(quality) = quality {
            names.push(prefixed(format!("{model}#{quality}-{size}")));
        }
        names.push(prefixed(format!("{model}#{size}")));
        names.into_iter().find_map(|name| self.named(&name).and_then(|(_, entry)| entry.price.per_image))
    }

    /// The price of `model` by [`PriceTable::resolve`]'s rule; `None` when the model is unpriced.
    pub fn lookup(&self, model: &str) -> Option<Price> {
        self.resolve(model).map(|resolution| resolution.price)
    }

    /// `kind`'s fallback price: the operators' when they set one, else the most expensive input
    /// price and the most expensive output price among the entries of that kind (each on its own;
    /// no cache prices, so cached input costs the input price). Zero only for a table with no
    /// entry of that kind and no override, which the built-in table is not.
    pub fn fallback(&self, kind: ProviderKind) -> Fallback {
        let index = kind_index(kind);
        let source = if self.fallback_overrides[index].is_some() {
            PriceSource::Override
        } else {
            PriceSource::Builtin
        };
        Fallback { price: self.fallback[index], source }
    }

    /// This table with `overrides` laid over it: a model in both takes the override's price, and
    /// every entry of `overrides` is marked [`PriceSource::Override`]. An override of no known kind
    /// takes the kind of the entry its name resolves to in this table, so that raising a model's
    /// price also raises its kind's fallback. `fallback_overrides` are the operators' fallback prices.
    pub fn overlay(
        &self,
        overrides: &PriceTable,
        fallback_overrides: impl IntoIterator<Item = (ProviderKind, Price)>,
    ) -> PriceTable {
        let mut entries: BTreeMap<String, TableEntry> = self.entries.iter().cloned().collect();
        for (model, entry) in &overrides.entries {
            let kind = entry.kind.or_else(|| {
                let resolution = self.resolve(model)?;
                match resolution.priced_as {
                    PricedAs::Entry(name) => self.get(name)?.kind,
                    PricedAs::Fallback(kind) => Some(kind),
                    PricedAs::NamespaceFallback(_) | PricedAs::CredentialFallback => None,
                }
            });
            entries.insert(
                model.clone(),
                TableEntry { price: entry.price, kind, source: PriceSource::Override },
            );
        }
        let mut fallback = self.fallback_overrides;
        for (kind, price) in fallback_overrides {
            fallback[kind_index(kind)] = Some(price);
        }
        PriceTable::new(entries, fallback)
    }

    /// The entry of a model name exactly as listed.
    pub fn get(&self, model: &str) -> Option<&TableEntry> {
        self.named(model).map(|(_, entry)| entry)
    }

    /// The entry listed under exactly this name, with the name as the table holds it.
    fn named(&self, name: &str) -> Option<(&String, &TableEntry)> {
        let index = usize::try_from(*self.by_name.get(name)?).ok()?;
        self.entries.get(index).map(|(name, entry)| (name, entry))
    }

    /// Every entry, sorted by model name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &TableEntry)> {
        self.entries.iter().map(|(model, entry)| (model.as_str(), entry))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry named `stem` plus a date suffix with the latest date, if any.
    fn newest_dated(&self, stem: &str) -> Option<(&String, &TableEntry)> {
        // Every name that starts with `stem` sorts right after it.
        let after = self.entries.partition_point(|(name, _)| name.as_str() <= stem);
        self.entries[after..]
            .iter()
            .map(|(name, entry)| (name, entry))
            .take_while(|(name, _)| name.starts_with(stem))
            .filter(|(name, _)| strip_date_suffix(name) == Some(stem))
            .max_by_key(|(name, _)| name.get(stem.len()..).map_or(0, date_number))
    }
}

/// The most expensive input and output prices (each on its own) among `kind`'s entries.
fn most_expensive(entries: &BTreeMap<String, TableEntry>, kind: ProviderKind) -> Price {
    let of_kind = || {
        entries
            .values()
            .filter(|entry| entry.kind.map(ProviderKind::priced_like) == Some(kind))
            .map(|entry| entry.price)
    };
    let most = |component: fn(&Price) -> Option<Nanos>| of_kind().filter_map(|p| component(&p)).max();
    Price {
        input_per_mtok: of_kind().map(|p| p.input_per_mtok).max().unwrap_or(Nanos::ZERO),
        output_per_mtok: of_kind().map(|p| p.output_per_mtok).max().unwrap_or(Nanos::ZERO),
        audio_input_per_mtok: most(|p| p.audio_input_per_mtok),
        audio_output_per_mtok: most(|p| p.audio_output_per_mtok),
        max_output_tokens: of_kind().filter_map(|p| p.max_output_tokens).max(),
        ..Price::default()
    }
}

/// Each namespace's most expensive input and output prices (each on its own) among its entries;
/// the entries of one generated image (`model#quality-size`) price images, not tokens, and are left
/// out.
fn namespace_fallbacks(entries: &BTreeMap<String, TableEntry>) -> foldhash::HashMap<String, Price> {
    let mut namespaces: foldhash::HashMap<String, Price> = foldhash::HashMap::default();
    for (name, entry) in entries {
        let Some((namespace, _)) = name.split_once('/') else { continue };
        if name.contains('#') {
            continue;
        }
        let most = namespaces.entry(namespace.to_owned()).or_default();
        most.input_per_mtok = most.input_per_mtok.max(entry.price.input_per_mtok);
        most.output_per_mtok = most.output_per_mtok.max(entry.price.output_per_mtok);
        most.max_output_tokens = most.max_output_tokens.max(entry.price.max_output_tokens);
    }
    namespaces
}

/// A date suffix's digits as one number, `YYYYMMDD`, which orders dates of either shape.
fn date_number(suffix: &str) -> u32 {
    suffix
        .bytes()
        .filter(u8::is_ascii_digit)
        .fold(0, |n, d| n.saturating_mul(10).saturating_add(u32::from(d - b'0')))
}

/// `name` without a trailing date suffix or `-latest`, if it has one and something precedes it.
fn strip_version_suffix(name: &str) -> Option<&str> {
    strip_date_suffix(name).or_else(|| name.strip_suffix("-latest").filter(|stem| !stem.is_empty()))
}

/// `name` without a trailing `-YYYY-MM-DD` or `-YYYYMMDD`, if it has one and something precedes it.
fn strip_date_suffix(name: &str) -> Option<&str> {
    // Byte positions of the dashes within each suffix; every other byte is a digit.
    const SHAPES: [(usize, &[usize]); 2] = [(11, &[0, 5, 8]), (9, &[0])];
    SHAPES.iter().find_map(|&(len, dashes)| {
        let stem = name.get(..name.len().checked_sub(len)?)?;
        let suffix = name.get(stem.len()..)?;
        let fits = suffix
            .bytes()
            .enumerate()
            .all(|(i, b)| if dashes.contains(&i) { b == b'-' } else { b.is_ascii_digit() });
        (fits && !stem.is_empty()).then_some(stem)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pricing::Rates;
    use crate::pricing::tests::{price, usd};
    use proptest::prelude::*;

    #[test]
    fn builtin_table_parses_and_prices_the_common_models() {
        let table = PriceTable::builtin();
        assert!(table.len() > 4000, "only {} models", table.len());
        let get = |model: &str| table.get(model).unwrap_or_else(|| panic!("{model} missing")).price;
        let gpt_4o = Price {
            batch_input_per_mtok: Some(usd("1.25")),
            batch_output_per_mtok: Some(usd("5")),
            file_search_per_call: Some(usd("0.0025")),
            code_interpreter_per_session: Some(usd("0.03")),
            priority: Some(Rates {
                input_per_mtok: usd("4.25"),
                output_per_mtok: usd("17"),
                cached_input_per_mtok: Some(usd("2.125")),
                cache_write_per_mtok: None,
            }),
            max_output_tokens: Some(16384),
            ..price("2.5", "10", Some("1.25"), None)
        };
        assert_eq!(get("gpt-4o"), gpt_4o);
        assert_eq!(
            (get("gpt-4o-mini").input_per_mtok, get("gpt-4o-mini").cached_input_per_mtok),
            (usd("0.15"), Some(usd("0.075")))
        );
        assert_eq!(get("o3").input_per_mtok, usd("2"));
        assert!(table.get("o4-mini").is_some());
        let sonnet = Price {
            cache_write_1h_per_mtok: Some(usd("6")),
            batch_input_per_mtok: Some(usd("1.5")),
            batch_output_per_mtok: Some(usd("7.5")),
            web_search_per_call: Some(usd("0.01")),
            max_output_tokens: Some(64000),
            ..price("3", "15", Some("0.3"), Some("3.75"))
        };
        assert_eq!(get("claude-sonnet-4-5"), sonnet);
        assert_eq!(get("claude-haiku-4-5").cache_write_per_mtok, Some(usd("1.25")));
        assert_eq!(get("text-embedding-3-small").input_per_mtok, usd("0.02"));
        // Realtime models price audio apart, and cached audio from LiteLLM's misnamed field.
        let realtime = get("gpt-realtime");
        assert_eq!(
            (
                realtime.audio_input_per_mtok,
                realtime.audio_output_per_mtok,
                realtime.cached_audio_input_per_mtok
            ),
            (Some(usd("32")), Some(usd("64")), Some(usd("0.4")))
        );
        // Dated Anthropic snapshots resolve to their alias's price when not listed themselves.
        assert_eq!(table.lookup("claude-sonnet-4-5-20990101"), Some(get("claude-sonnet-4-5")));
        // The kinds' own entries are named bare and carry their kind; every other provider's sit
        // under its namespace, with none.
        assert!(table.iter().all(|(name, entry)| {
            let namespaced = name.split('#').next().is_some_and(|model| model.contains('/'));
            entry.source == PriceSource::Builtin && (entry.kind.is_some() != namespaced || name.contains('#'))
        }));
    }

    /// A sample of every component the generator reads from LiteLLM 1.110.2's list, against the
    /// list's own values (`input_cost_per_token_flex` 6.25e-07 is $0.625 per million).
    #[test]
    fn builtin_components_are_litellms() {
        let table = PriceTable::builtin();
        let get = |model: &str| table.get(model).unwrap_or_else(|| panic!("{model} missing")).price;
        let rates = |input: &str, output: &str, cached: Option<&str>| Rates {
            input_per_mtok: usd(input),
            output_per_mtok: usd(output),
            cached_input_per_mtok: cached.map(usd),
            cache_write_per_mtok: None,
        };
        // Tiers: gpt-5.4's flex and priority (`*_flex`, `*_priority`).
        let gpt_5_4 = get("gpt-5.4");
        assert_eq!(gpt_5_4.flex, Some(rates("1.25", "7.5", Some("0.13"))));
        assert_eq!(gpt_5_4.priority, Some(rates("5", "30", Some("0.5"))));
        // Long context: above 272k (`*_above_272k_tokens`, and its `_flex`; no priority listed).
        let long = gpt_5_4.long_context.expect("gpt-5.4's long context");
        assert_eq!(long.above_input_tokens, 272_000);
        assert_eq!(long.standard, rates("5", "22.5", Some("0.5")));
        assert_eq!(long.flex, Some(rates("2.5", "11.25", Some("0.25"))));
        assert_eq!(long.priority, None);
        // Gemini 2.5 Pro above 200k, its priority's too; grounding per prompt.
        let pro = get("gemini-2.5-pro");
        let long = pro.long_context.expect("gemini-2.5-pro's long context");
        assert_eq!((long.above_input_tokens, long.standard), (200_000, rates("2.5", "15", Some("0.25"))));
        assert_eq!(long.priority, Some(rates("4.5", "27", Some("0.45"))));
        assert_eq!((pro.web_search_per_call, pro.web_search_per_prompt), (Some(usd("0.035")), true));
        // Anthropic's 1-hour cache writes (`cache_creation_input_token_cost_above_1hr`).
        assert_eq!(get("claude-sonnet-4-5").cache_write_1h_per_mtok, Some(usd("6")));
        // Image tokens (gpt-image-1), per generated image by quality and size (its `high/1024-x-1024/`
        // entry; DALL-E 3 and 2 from LiteLLM 1.80.0's per-pixel prices, to the tenth of a cent).
        let image = get("gpt-image-1");
        assert_eq!(
            (image.image_input_per_mtok, image.image_output_per_mtok, image.cached_image_input_per_mtok),
            (Some(usd("10")), Some(usd("40")), Some(usd("2.5")))
        );
        for (variant, per_image) in [
            ("gpt-image-1#high-1024x1024", "0.167"),
            ("gpt-image-1#low-1024x1536", "0.016"),
            ("dall-e-3#hd-1024x1792", "0.12"),
            ("dall-e-3#standard-1024x1024", "0.04"),
            ("dall-e-3", "0.04"),
            ("dall-e-2#256x256", "0.016"),
            ("dall-e-2", "0.02"),
        ] {
            assert_eq!(get(variant).per_image, Some(usd(per_image)), "{variant}");
        }
        // Per character (tts-1), per second (whisper-1, billed once though listed twice).
        assert_eq!(get("tts-1").per_million_characters, Some(usd("15")));
        assert_eq!(get("whisper-1").per_million_seconds, Some(usd("100")));
        assert_eq!(get("gpt-4o-transcribe").audio_input_per_mtok, Some(usd("2.5")));
        // Search per call (`search_context_cost_per_query`), a container session (`openai/container`).
        assert_eq!(get("gpt-4o-search-preview").web_search_per_call, Some(usd("0.025")));
        assert_eq!(get("gpt-5.4").code_interpreter_per_session, Some(usd("0.03")));
        // Other providers under their namespace: Groq's, Azure's, a local model's at zero.
        let llama = get("groq/llama-3.3-70b-versatile");
        assert_eq!((llama.input_per_mtok, llama.output_per_mtok), (usd("0.59"), usd("0.79")));
        assert_eq!(get("groq/openai/gpt-oss-120b").web_search_per_call, Some(usd("0.005")));
        assert_eq!(get("azure/gpt-4o").code_interpreter_per_session, Some(usd("0.033")));
        assert_eq!(get("ollama/llama3"), Price { max_output_tokens: Some(8192), ..Price::default() });
        assert!(
            table.has_namespace("groq")
                && table.has_namespace("together_ai")
                && !table.has_namespace("openrouter")
        );
    }

    #[test]
    fn retired_models_keep_their_last_published_price() {
        let table = PriceTable::builtin();
        for (model, input, output) in [
            ("claude-sonnet-4-20250514", "3", "15"),
            ("claude-opus-4-1", "15", "75"),
            ("claude-3-7-sonnet-latest", "3", "15"),
            ("claude-3-5-haiku-latest", "1", "5"),
        ] {
            let resolution = table.resolve(model).unwrap_or_else(|| panic!("{model} unpriced"));
            assert_eq!(
                (resolution.price.input_per_mtok, resolution.price.output_per_mtok),
                (usd(input), usd(output)),
                "{model}"
            );
            assert_eq!(resolution.source, PriceSource::Builtin, "{model} is listed itself");
            assert_eq!(table.get(model).and_then(|entry| entry.kind), Some(ProviderKind::Anthropic));
        }
        // Not listed, but its family is: the dated entry, not claude-sonnet-4-5's price.
        let sonnet_4 = table.resolve("claude-sonnet-4").expect("the family resolves");
        assert_eq!(sonnet_4.priced_as, PricedAs::Entry("claude-sonnet-4-20250514"));
        assert_eq!(sonnet_4.source, PriceSource::Alias);
    }

    #[test]
    fn lookup_tries_exact_then_without_provider_then_the_family() {
        let alias = price("2.5", "10", None, None);
        let snapshot = price("5", "15", None, None);
        let table = PriceTable::from_entries([
            ("gpt-4o".to_owned(), alias),
            ("gpt-4o-2024-05-13".to_owned(), snapshot),
            ("claude-sonnet-4-5".to_owned(), snapshot),
        ]);
        assert_eq!(table.lookup("gpt-4o"), Some(alias));
        assert_eq!(table.lookup("gpt-4o-2024-05-13"), Some(snapshot));
        assert_eq!(table.lookup("gpt-4o-2024-08-06"), Some(alias));
        assert_eq!(table.lookup("gpt-4o-latest"), Some(alias));
        assert_eq!(table.lookup("claude-sonnet-4-5-20250929"), Some(snapshot));
        assert_eq!(table.lookup("openai/gpt-4o"), Some(alias));
        assert_eq!(table.lookup("openai/gpt-4o-2024-05-13"), Some(snapshot));
        assert_eq!(table.lookup("openai/gpt-4o-2099-12-31"), Some(alias));
        // Not date suffixes: too short, letters, misplaced dashes, or nothing before them.
        for unpriced in [
            "gpt-4o-0613",
            "gpt-4o-2024-0806",
            "gpt-4o-2024-08-0x",
            "gpt-4o-202408060",
            "-20240806",
            "-latest",
            "gpt-5",
            "claude-sonnet-4",
            "claude-sonnet-4-20250514",
            "claude-sonnet-4-latest",
            "",
        ] {
            assert_eq!(table.lookup(unpriced), None, "{unpriced:?}");
        }
        assert_eq!(table.lookup("a/b/gpt-4o"), None, "only one provider prefix is removed");
        assert_eq!(strip_date_suffix("é-2024-08-06"), Some("é"));
    }

    #[test]
    fn a_family_without_an_undated_entry_resolves_to_its_newest_date() {
        let old = price("3", "15", None, None);
        let new = price("4", "20", None, None);
        let table = PriceTable::from_entries([
            ("claude-3-7-sonnet-20250219".to_owned(), old),
            ("claude-3-7-sonnet-2025-06-01".to_owned(), new),
            ("claude-3-7-sonnet-extended-20991231".to_owned(), price("9", "9", None, None)),
        ]);
        for model in ["claude-3-7-sonnet", "claude-3-7-sonnet-latest", "anthropic/claude-3-7-sonnet-20240101"]
        {
            let resolution = table.resolve(model).unwrap_or_else(|| panic!("{model}"));
            assert_eq!(resolution.priced_as, PricedAs::Entry("claude-3-7-sonnet-2025-06-01"), "{model}");
            assert_eq!((resolution.price, resolution.source), (new, PriceSource::Alias), "{model}");
        }
        let exact = table.resolve("claude-3-7-sonnet-20250219").expect("listed");
        assert_eq!((exact.price, exact.source), (old, PriceSource::Builtin));
        assert_eq!(table.lookup("claude-3-7"), None, "a shorter stem is another family");
    }

    #[test]
    fn unknown_models_cost_the_kinds_most_expensive_prices() {
        let openai = Some(ProviderKind::OpenAi);
        let anthropic = Some(ProviderKind::Anthropic);
        let table = PriceTable::from_kinded([
            ("cheap-in".to_owned(), openai, price("1", "40", Some("0.1"), None)),
            ("dear-in".to_owned(), openai, price("30", "2", None, None)),
            ("claude-x".to_owned(), anthropic, price("3", "15", None, None)),
            ("unknown-kind".to_owned(), None, price("999", "999", None, None)),
        ]);
        let resolution = table.price_for(Some("gpt-9"), ProviderKind::OpenAi);
        assert_eq!(resolution.price, price("30", "40", None, None));
        assert_eq!(resolution.source, PriceSource::Fallback);
        assert_eq!(resolution.priced_as.to_string(), "fallback:openai");
        let unnamed = table.price_for(None, ProviderKind::Anthropic);
        assert_eq!(
            (unnamed.price, unnamed.priced_as),
            (price("3", "15", None, None), PricedAs::Fallback(ProviderKind::Anthropic))
        );
        assert_eq!(table.price_for(Some("claude-x"), ProviderKind::OpenAi).priced_as.to_string(), "claude-x");
        assert_eq!(table.fallback(ProviderKind::OpenAi).source, PriceSource::Builtin);

        // An override raises the fallback of the kind its name resolves to; an operator's fallback wins.
        let overrides =
            PriceTable::from_entries([("dear-in-2025-01-01".to_owned(), price("50", "1", None, None))]);
        let merged = table.overlay(&overrides, []);
        assert_eq!(
            merged.get("dear-in-2025-01-01").map(|e| (e.kind, e.source)),
            Some((openai, PriceSource::Override))
        );
        assert_eq!(merged.fallback(ProviderKind::OpenAi).price, price("50", "40", None, None));
        let set = price("7", "8", None, None);
        let merged = merged.overlay(&PriceTable::default(), [(ProviderKind::Anthropic, set)]);
        assert_eq!(
            merged.fallback(ProviderKind::Anthropic),
            Fallback { price: set, source: PriceSource::Override }
        );
        assert_eq!(merged.price_for(Some("claude-y"), ProviderKind::Anthropic).price, set);
        assert_eq!(merged.fallback(ProviderKind::OpenAi).price, price("50", "40", None, None), "kept");
    }

    #[test]
    fn builtin_fallbacks_are_never_zero() {
        for kind in KINDS {
            let fallback = PriceTable::builtin().fallback(kind).price;
            assert!(
                fallback.input_per_mtok > Nanos::ZERO && fallback.output_per_mtok > Nanos::ZERO,
                "{kind:?}"
            );
        }
    }

    #[test]
    fn overlay_prefers_overrides_and_keeps_the_rest() {
        let base = PriceTable::from_entries([
            ("a".to_owned(), price("1", "2", None, None)),
            ("b".to_owned(), price("3", "4", None, None)),
        ]);
        let overrides = PriceTable::from_entries([
            ("b".to_owned(), price("5", "6", Some("1"), None)),
            ("c".to_owned(), price("7", "8", None, None)),
        ]);
        let merged = base.overlay(&overrides, []);
        let names: Vec<&str> = merged.iter().map(|(model, _)| model).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(merged.lookup("b"), Some(price("5", "6", Some("1"), None)));
        assert_eq!(merged.resolve("b").map(|r| r.source), Some(PriceSource::Override));
        assert_eq!(merged.lookup("a"), Some(price("1", "2", None, None)));
        assert_eq!(merged.resolve("a").map(|r| r.source), Some(PriceSource::Builtin));
        assert_eq!(base.len(), 2, "the base table is unchanged");
        assert!(!merged.is_empty());
    }

    #[test]
    fn table_file_errors_name_the_model_and_field() {
        let text = r#"{"models": {"m": {"input_per_mtok_usd": "1.0000000001", "output_per_mtok_usd": "1"}}}"#;
        let error = PriceTable::from_json(text).expect_err("too precise").to_string();
        assert!(error.contains("models.m.input_per_mtok_usd"), "{error}");
        assert!(PriceTable::from_json(r#"{"models": {}, "extra": 1}"#).is_err());
        assert_eq!(PriceTable::from_json(r#"{"models": {}}"#), Ok(PriceTable::default()));
        let text =
            r#"{"models": {"m": {"kind": "groq", "input_per_mtok_usd": "1", "output_per_mtok_usd": "1"}}}"#;
        let error = PriceTable::from_json(text).expect_err("unknown kind").to_string();
        assert!(error.contains("models.m.kind"), "{error}");
    }

    #[test]
    fn a_credential_prices_in_its_namespace_then_at_its_fallbacks() {
        let table = PriceTable::from_kinded([
            ("llama-3.3-70b-versatile".to_owned(), Some(ProviderKind::OpenAi), price("9", "9", None, None)),
            ("groq/llama-3.3-70b-versatile".to_owned(), None, price("0.59", "0.79", None, None)),
            ("groq/llama-3.1-8b-instant".to_owned(), None, price("0.05", "0.08", None, None)),
            ("gpt-4o".to_owned(), Some(ProviderKind::OpenAi), price("2.5", "10", None, None)),
            ("azure/gpt-4o".to_owned(), None, price("2.75", "11", None, None)),
        ]);
        let groq = PriceScope::of_credential(ProviderKind::OpenAi, "groq", None, None);
        let found = table.price_in(Some("llama-3.3-70b-versatile"), &groq);
        assert_eq!(found.priced_as, PricedAs::Entry("groq/llama-3.3-70b-versatile"));
        assert_eq!(
            table.price_in(Some("groq/llama-3.1-8b-instant"), &groq).price.input_per_mtok,
            usd("0.05")
        );
        // Not in the namespace: never another provider's bare name, but the namespace's fallback.
        let unknown = table.price_in(Some("gpt-4o"), &groq);
        assert_eq!(unknown.priced_as, PricedAs::NamespaceFallback("groq"));
        assert_eq!((unknown.price.input_per_mtok, unknown.price.output_per_mtok), (usd("0.59"), usd("0.79")));
        assert_eq!(unknown.source, PriceSource::Fallback);
        // Its own fallback first: zero for a self-hosted model.
        let own = PriceScope::of_credential(ProviderKind::OpenAi, "groq", None, Some(Price::default()));
        let free = table.price_in(Some("mystery"), &own);
        assert_eq!((free.priced_as, free.price.input_per_mtok), (PricedAs::CredentialFallback, Nanos::ZERO));
        // A name the table has no namespace for prices bare, at the kind's fallback.
        let openai = PriceScope::of_credential(ProviderKind::OpenAi, "openai", None, None);
        assert_eq!(table.price_in(Some("gpt-4o"), &openai).priced_as, PricedAs::Entry("gpt-4o"));
        assert_eq!(
            table.price_in(Some("mystery"), &openai).priced_as,
            PricedAs::Fallback(ProviderKind::OpenAi)
        );
        // A namespace set for a credential applies whatever its name; Azure falls back to bare names.
        let named = PriceScope::of_credential(ProviderKind::OpenAi, "fast", Some("groq"), None);
        assert_eq!(table.price_in(Some("llama-3.3-70b-versatile"), &named).price.input_per_mtok, usd("0.59"));
        let azure = PriceScope::of_credential(ProviderKind::AzureOpenAi, "azure", None, None);
        assert_eq!(
            table.price_in(Some("gpt-4o-2024-11-20"), &azure).priced_as,
            PricedAs::Entry("azure/gpt-4o")
        );
        assert_eq!(
            table.price_in(Some("llama-3.3-70b-versatile"), &azure).priced_as,
            PricedAs::Entry("llama-3.3-70b-versatile")
        );
        assert_eq!(PricedAs::NamespaceFallback("groq").to_string(), "fallback:groq");
        assert_eq!(PricedAs::CredentialFallback.to_string(), "fallback:credential");
    }

    proptest! {
        #[test]
        fn resolution_stays_within_a_family(
            family in "[a-z]{1,6}(-[a-z0-9]{1,3}){0,3}",
            other in "[a-z0-9]{1,4}",
            date in 0_u32..100_000_000,
            dashed in any::<bool>(),
        ) {
            let (base, sibling) = (price("1", "1", None, None), price("2", "2", None, None));
            let table = PriceTable::from_entries([(family.clone(), base), (format!("{family}-{other}"), sibling)]);
            let date = if dashed {
                format!("{:04}-{:02}-{:02}", date / 10_000, date / 100 % 100, date % 100)
            } else {
                format!("{date:08}")
            };
            prop_assert_eq!(table.lookup(&format!("{family}-{date}")), Some(base));
            prop_assert_eq!(table.lookup(&format!("{family}-latest")), Some(base));
            prop_assert_eq!(table.lookup(&format!("p/{family}-{date}")), Some(base));
            prop_assert_eq!(table.lookup(&format!("{family}-{other}-{date}")), Some(sibling));
            // A longer name is another family, however it starts.
            prop_assert_eq!(table.lookup(&format!("{family}-{other}x")), None);
            prop_assert_eq!(table.lookup(&format!("{family}-{other}x-{date}")), None);
            // An unknown model always has a price, whatever its kind.
            for kind in KINDS {
                prop_assert_eq!(table.price_for(Some(&format!("{family}x")), kind).source, PriceSource::Fallback);
            }
        }
    }
}

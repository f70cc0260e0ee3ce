//! What a price resolves to: where it comes from, the name or fallback it was found as, and the
//! scope a credential's requests are priced in.

use std::fmt;
use std::sync::Arc;

use super::Price;
use crate::provider_kind::ProviderKind;

/// Where a price in force comes from, as the admin API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PriceSource {
    /// The table shipped in the binary.
    Builtin,
    /// Another entry's price, reached from a dated, `-latest` or `provider/` name by
    /// [`PriceTable::resolve`](super::PriceTable::resolve).
    Alias,
    /// Set by an operator.
    Override,
    /// No entry resolves: the provider kind's fallback price.
    Fallback,
}

impl PriceSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Builtin => "builtin",
            Self::Alias => "alias",
            Self::Override => "override",
            Self::Fallback => "fallback",
        }
    }
}

/// A table entry: the price, the provider kind that serves the model, and who set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableEntry {
    pub price: Price,
    /// `None` when unknown: the entry then raises no kind's fallback price.
    pub kind: Option<ProviderKind>,
    /// [`PriceSource::Builtin`] or [`PriceSource::Override`].
    pub source: PriceSource,
}

/// The price a request is costed at, and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolution<'a> {
    pub price: Price,
    /// `Builtin` or `Override` for the entry of the very name, `Alias` for another name's entry,
    /// `Fallback` when none resolves.
    pub source: PriceSource,
    pub priced_as: PricedAs<'a>,
}

/// What a receipt records as the price it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PricedAs<'a> {
    /// The table entry of this model name.
    Entry(&'a str),
    /// The fallback price of this provider kind.
    Fallback(ProviderKind),
    /// The fallback price of this price namespace: its most expensive input and output.
    NamespaceFallback(&'a str),
    /// The fallback price the credential carries.
    CredentialFallback,
}

impl fmt::Display for PricedAs<'_> {
    /// The entry's model name, or `fallback:<kind>`: a model name never starts with `fallback:`
    /// that the table could hold, since the fallback is not an entry.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Entry(model) => f.write_str(model),
            Self::Fallback(kind) => write!(f, "fallback:{}", kind.as_str()),
            Self::NamespaceFallback(namespace) => write!(f, "fallback:{namespace}"),
            Self::CredentialFallback => f.write_str("fallback:credential"),
        }
    }
}

/// Where a credential's requests are priced: its kind, the price namespace its models resolve in
/// first (`groq`: `groq/llama-3.3-70b-versatile`), and the fallback price it carries for models no
/// entry prices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceScope {
    pub kind: ProviderKind,
    pub namespace: Option<Arc<str>>,
    /// The namespace is the credential's name, not one set for it: it applies only when the table
    /// has entries under it.
    pub namespace_is_name: bool,
    pub fallback: Option<Arc<Price>>,
}

impl PriceScope {
    /// A kind's own prices: bare model names, the kind's fallback.
    pub fn of_kind(kind: ProviderKind) -> PriceScope {
        PriceScope { kind, namespace: None, namespace_is_name: false, fallback: None }
    }

    /// The scope of a credential named `name`: the namespace set for it, else its name.
    pub fn of_credential(
        kind: ProviderKind,
        name: &str,
        namespace: Option<&str>,
        fallback: Option<Price>,
    ) -> PriceScope {
        PriceScope {
            kind,
            namespace: Some(Arc::from(namespace.unwrap_or(name))),
            namespace_is_name: namespace.is_none(),
            fallback: fallback.map(Arc::new),
        }
    }
}

/// A kind's fallback price and whether an operator set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fallback {
    pub price: Price,
    pub source: PriceSource,
}

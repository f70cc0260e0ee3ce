//! The price table: `GET /prices` (every entry and the fallback per kind, each with where it came
//! from), `GET`, `PUT` and `DELETE /prices/{model}`, `POST /price-imports` (a whole file in one
//! revision) and `PUT`/`DELETE /fallback-prices/{kind}`.
//!
//! Fallback prices have a path of their own: a model name may hold any character, `/` included,
//! so no name under `/prices/` could be set aside for them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use recovea_core::pricing::{self, Price, PriceSource, PriceTable, PriceWire, PricedAs};
use recovea_core::snapshot::ProviderKind;
use recovea_store::{PriceChange, PriceTarget};
use serde_json::{Value, json};

use crate::admin::{Caller, Reply, ok};
use crate::{ApiError, Control};

use recovea_core::pricing::KINDS;

impl Control {
    fn published_prices(&self) -> (recovea_core::snapshot::Prices, HashMap<PriceTarget, u64>) {
        self.inner.prices.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    pub(crate) fn list_prices(&self) -> Result<Reply, ApiError> {
        let (prices, revisions) = self.published_prices();
        let table: BTreeMap<&str, Value> = prices
            .table
            .iter()
            .map(|(model, entry)| {
                let revision = revisions.get(&PriceTarget::Model(model.to_owned()));
                (model, described(&entry.price, entry.kind, entry.source.as_str(), revision))
            })
            .collect();
        ok(json!({
            "revision": prices.revision,
            "prices": table,
            "fallback": fallbacks(&prices.table, &revisions),
        }))
    }

    /// Resolves any model name as the gateway would: the entry it reaches and how, or the
    /// fallback price it gets when none is reached. With `org` and `provider` in the query, as a
    /// request through that credential resolves it: in its price namespace first, at its fallback.
    pub(crate) async fn get_price(&self, model: &str, query: &str) -> Result<Reply, ApiError> {
        let (prices, revisions) = self.published_prices();
        let params = crate::admin::query::Params::parse(query)?;
        let credential = match (params.get("org"), params.get("provider")) {
            (None, None) => None,
            (Some(org), Some(name)) => {
                let org = crate::admin::org_id(org)?;
                let name = name.to_owned();
                let missing = format!("No provider {name:?} in organization {org}.");
                let providers = self.store(move |s| s.list_providers(&org)).await?;
                let record =
                    providers.into_iter().find(|p| p.name == name).ok_or(ApiError::NotFound(missing))?;
                Some(record)
            }
            _ => return Err(ApiError::bad_request("org and provider: give both, or neither")),
        };
        let scope = credential.as_ref().map(recovea_store::ProviderRecord::scope);
        let resolution = match &scope {
            Some(scope) => prices.table.price_in(Some(model), scope),
            None => prices
                .table
                .resolve(model)
                .unwrap_or_else(|| prices.table.price_for(None, ProviderKind::OpenAi)),
        };
        let mut body = match resolution.priced_as {
            PricedAs::Entry(entry_name) => {
                let entry = prices
                    .table
                    .get(entry_name)
                    .ok_or_else(|| ApiError::internal("resolved entry missing"))?;
                let revision = revisions.get(&PriceTarget::Model(entry_name.to_owned()));
                let mut body = described(&entry.price, entry.kind, resolution.source.as_str(), None);
                body["entry"] = json!({
                    "model": entry_name,
                    "source": entry.source.as_str(),
                    "revision": revision,
                });
                body
            }
            PricedAs::Fallback(_) | PricedAs::NamespaceFallback(_) | PricedAs::CredentialFallback
                if scope.is_none() =>
            {
                json!({
                    "source": PriceSource::Fallback.as_str(),
                    "fallback": fallbacks(&prices.table, &revisions),
                })
            }
            fallback => {
                let mut body = described(&resolution.price, None, resolution.source.as_str(), None);
                body["priced_as"] = json!(fallback.to_string());
                body
            }
        };
        body["model"] = json!(model);
        body["price_revision"] = json!(prices.revision);
        if let (Some(record), Some(scope)) = (&credential, &scope) {
            body["credential"] = json!({
                "org_id": record.org_id,
                "provider": record.name,
                "kind": record.kind.as_str(),
                "price_namespace": prices.table.namespace_of(scope),
                "fallback": match (&scope.fallback, prices.table.namespace_of(scope)) {
                    (Some(_), _) => "credential".to_owned(),
                    (None, Some(namespace)) if prices.table.has_namespace(namespace) => format!("namespace:{namespace}"),
                    (None, _) => format!("kind:{}", record.kind.priced_like().as_str()),
                },
            });
        }
        ok(body)
    }

    pub(crate) async fn put_price(
        &self,
        caller: Caller,
        model: &str,
        wire: PriceWire,
    ) -> Result<Reply, ApiError> {
        let model = model_name(model)?;
        let (kind, _) = wire.parse()?;
        let change = PriceChange {
            target: PriceTarget::Model(model.to_owned()),
            kind,
            price: Some(wire.without_kind()),
        };
        let revision = self.change_prices(caller, vec![change], "").await?;
        let mut body = serde_json::to_value(&wire).map_err(ApiError::internal)?;
        body["model"] = json!(model);
        body["revision"] = json!(revision);
        ok(body)
    }

    pub(crate) async fn delete_price(&self, caller: Caller, model: &str) -> Result<Reply, ApiError> {
        let model = model_name(model)?;
        let change = PriceChange { target: PriceTarget::Model(model.to_owned()), kind: None, price: None };
        let revision = self
            .change_prices(caller, vec![change], &format!("No price override for model {model:?}."))
            .await?;
        ok(json!({ "model": model, "revision": revision }))
    }

    /// Imports a price file (the built-in table's format or LiteLLM's) as one revision.
    pub(crate) async fn import_prices(&self, caller: Caller, body: &[u8]) -> Result<Reply, ApiError> {
        let text =
            std::str::from_utf8(body).map_err(|_| ApiError::bad_request("body: expected UTF-8 JSON"))?;
        let import = pricing::import::parse(text).map_err(|e| ApiError::bad_request(format!("body: {e}")))?;
        if import.entries.is_empty() {
            return Err(ApiError::bad_request("body: the file prices no model of a served provider"));
        }
        let mut changes = Vec::with_capacity(import.entries.len());
        for (model, entry) in &import.entries {
            let model = model_name(model)?;
            let (kind, _) = entry.parse().map_err(|e| ApiError::bad_request(format!("{model}: {e}")))?;
            changes.push(PriceChange {
                target: PriceTarget::Model(model.to_owned()),
                kind,
                price: Some(entry.without_kind()),
            });
        }
        let imported = changes.len();
        let revision = self.change_prices(caller, changes, "").await?;
        ok(json!({ "revision": revision, "imported": imported, "skipped": import.skipped }))
    }

    pub(crate) async fn put_fallback_price(
        &self,
        caller: Caller,
        kind: &str,
        wire: PriceWire,
    ) -> Result<Reply, ApiError> {
        let kind = fallback_kind(kind)?;
        Price::try_from(&wire)?;
        let change =
            PriceChange { target: PriceTarget::Fallback(kind), kind: None, price: Some(wire.clone()) };
        let revision = self.change_prices(caller, vec![change], "").await?;
        let mut body = serde_json::to_value(&wire).map_err(ApiError::internal)?;
        body["kind"] = json!(kind.as_str());
        body["revision"] = json!(revision);
        ok(body)
    }

    pub(crate) async fn delete_fallback_price(&self, caller: Caller, kind: &str) -> Result<Reply, ApiError> {
        let kind = fallback_kind(kind)?;
        let change = PriceChange { target: PriceTarget::Fallback(kind), kind: None, price: None };
        let missing = format!("No fallback price override for kind {:?}.", kind.as_str());
        let revision = self.change_prices(caller, vec![change], &missing).await?;
        ok(json!({ "kind": kind.as_str(), "revision": revision }))
    }

    /// Stores the changes as one revision; `missing` is the 404's message for a removal of nothing.
    async fn change_prices(
        &self,
        caller: Caller,
        changes: Vec<PriceChange>,
        missing: &str,
    ) -> Result<u64, ApiError> {
        let (store, audit) = (Arc::clone(&self.inner.store), caller.audit()?);
        match self.off_thread(move || store.change_prices(&changes, audit.at, &audit)).await {
            Err(ApiError::NotFound(_)) => Err(ApiError::NotFound(missing.to_owned())),
            other => other,
        }
    }
}

fn model_name(model: &str) -> Result<&str, ApiError> {
    let model = model.trim();
    if model.is_empty() || model.len() > 200 {
        return Err(ApiError::bad_field(
            "model",
            format_args!("expected 1 to 200 characters, got {model:?}"),
        ));
    }
    Ok(model)
}

fn provider_kind(kind: &str) -> Result<ProviderKind, ApiError> {
    ProviderKind::parse(kind).ok_or_else(|| {
        ApiError::bad_field(
            "kind",
            format_args!("expected \"openai\", \"anthropic\", \"azure_openai\" or \"gemini\", got {kind:?}"),
        )
    })
}

/// A kind with a fallback price of its own: `azure_openai` shares `openai`'s.
fn fallback_kind(kind: &str) -> Result<ProviderKind, ApiError> {
    let kind = provider_kind(kind)?;
    if kind.priced_like() != kind {
        let priced_like = kind.priced_like().as_str();
        return Err(ApiError::bad_field(
            "kind",
            format_args!(
                "{} is priced as {priced_like}: set the fallback price of {priced_like}",
                kind.as_str()
            ),
        ));
    }
    Ok(kind)
}

/// A price's wire form with where it came from.
fn described(price: &Price, kind: Option<ProviderKind>, source: &str, revision: Option<&u64>) -> Value {
    let mut body = serde_json::to_value(PriceWire::from(price)).unwrap_or_default();
    body["kind"] = json!(kind.map(ProviderKind::as_str));
    body["source"] = json!(source);
    if let Some(revision) = revision {
        body["revision"] = json!(revision);
    }
    body
}

/// Each kind's fallback price: `override` when an operator set it, else `computed` from the table.
fn fallbacks(table: &PriceTable, revisions: &HashMap<PriceTarget, u64>) -> BTreeMap<&'static str, Value> {
    KINDS
        .iter()
        .map(|&kind| {
            let fallback = table.fallback(kind);
            let source = match fallback.source {
                PriceSource::Override => "override",
                PriceSource::Builtin | PriceSource::Alias | PriceSource::Fallback => "computed",
            };
            let revision = revisions.get(&PriceTarget::Fallback(kind));
            let mut body = described(&fallback.price, Some(kind), source, revision);
            if let Some(object) = body.as_object_mut() {
                object.remove("kind");
            }
            (kind.as_str(), body)
        })
        .collect()
}

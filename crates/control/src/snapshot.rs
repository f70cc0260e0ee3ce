//! From the store's rows to the feed state every node builds its snapshot from. Provider keys stay
//! sealed: the control plane never needs them in clear.

use recovea_core::feed::{CapWire, FeedState, KeyWire, OrgWire, PricesWire, ProviderWire};
use recovea_core::pricing::{Price, PriceWire};
use recovea_store::{PriceTarget, State};

/// The state nodes serve. Keys and caps of organizations the state does not hold are left out.
pub fn feed_state(state: &State) -> FeedState {
    let mut feed = FeedState { version: state.version, ..FeedState::default() };
    for org in &state.orgs {
        let wire = OrgWire {
            allowed_models: org.allowed_models.clone(),
            allowed_endpoints: org.allowed_endpoints.clone(),
            max_concurrent_requests: org.max_concurrent_requests,
            ..OrgWire::default()
        };
        feed.orgs.insert(org.id.clone(), wire);
    }
    for provider in &state.providers {
        if let Some(org) = feed.orgs.get_mut(&provider.org_id) {
            org.providers.insert(
                provider.name.clone(),
                ProviderWire {
                    kind: provider.kind.as_str().to_owned(),
                    base_url: provider.base_url.clone(),
                    sealed_key: recovea_core::hex::encode(&provider.sealed_key),
                    price_namespace: provider.price_namespace.clone(),
                    fallback_price: provider.fallback().map(|price| PriceWire::from(&price)),
                },
            );
        }
    }
    for record in &state.caps {
        if let Some(org) = feed.orgs.get_mut(&record.cap.org_id) {
            org.caps.push(CapWire::from_cap(&record.cap));
        }
    }
    feed.keys.reserve(state.active_keys.len());
    for key in &state.active_keys {
        if feed.orgs.contains_key(&key.org_id) {
            feed.keys.insert(
                key.hash,
                KeyWire {
                    // Shared with the store's rows, not copied.
                    id: key.id.clone(),
                    org_id: key.org_id.clone(),
                    expires_at_ms: key.expires_at.map(|t| t.0),
                    requests_per_minute: key.limits.requests_per_minute,
                    tokens_per_minute: key.limits.tokens_per_minute,
                    allowed_models: key.allowed_models.clone(),
                    allowed_endpoints: key.allowed_endpoints.clone(),
                    max_concurrent_requests: key.max_concurrent_requests,
                },
            );
        }
    }
    feed.prices = prices(state);
    feed
}

/// The operators' overrides and fallback prices. One that no longer parses (it was validated when
/// set) is left out and logged rather than make every node refuse the state.
fn prices(state: &State) -> PricesWire {
    let mut wire = PricesWire { revision: state.price_revision, ..PricesWire::default() };
    for set in &state.price_overrides {
        if let Err(e) = Price::try_from(&set.price) {
            tracing::error!(target = ?set.target, error = %e, "a stored price does not parse; ignored");
            continue;
        }
        match &set.target {
            PriceTarget::Model(model) => {
                wire.overrides.insert(model.clone(), set.price.clone());
                if let Some(kind) = set.kind {
                    wire.kinds.insert(model.clone(), kind.as_str().to_owned());
                }
            }
            PriceTarget::Fallback(kind) => {
                wire.fallback.insert(kind.as_str().to_owned(), set.price.clone());
            }
        }
    }
    wire
}

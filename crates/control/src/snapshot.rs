//! From the store's rows to the feed state every node builds its snapshot from. Provider keys stay
//! sealed: the control plane never needs them in clear.

use recovea_core::feed::{CapWire, FeedState, KeyWire, OrgWire, PricesWire, ProviderWire};
use recovea_core::pricing::Price;
use recovea_store::State;

/// The state nodes serve. Keys and caps of organizations the state does not hold are left out.
pub fn feed_state(state: &State) -> FeedState {
    let mut feed = FeedState { version: state.version, ..FeedState::default() };
    for org in &state.orgs {
        feed.orgs.insert(org.id.clone(), OrgWire::default());
    }
    for provider in &state.providers {
        if let Some(org) = feed.orgs.get_mut(&provider.org_id) {
            org.providers.insert(
                provider.name.clone(),
                ProviderWire {
                    kind: provider.kind.as_str().to_owned(),
                    base_url: provider.base_url.clone(),
                    sealed_key: recovea_core::hex::encode(&provider.sealed_key),
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
                },
            );
        }
    }
    feed.prices = prices(state);
    feed
}

/// The operators' overrides. One that no longer parses (it was validated when set) is left out and
/// logged rather than make every node refuse the state.
fn prices(state: &State) -> PricesWire {
    let overrides = state
        .price_overrides
        .iter()
        .filter(|(model, wire)| match Price::try_from(wire) {
            Ok(_) => true,
            Err(e) => {
                tracing::error!(model = %model, error = %e, "a stored price override does not parse; ignored");
                false
            }
        })
        .cloned()
        .collect();
    PricesWire { revision: state.price_revision, overrides }
}

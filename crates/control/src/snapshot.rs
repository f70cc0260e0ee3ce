//! From the store's rows to the snapshot a node serves: provider keys opened, keys by hash.

use recovea_core::Snapshot;
use recovea_core::crypto::MasterKey;
use std::sync::Arc;

use recovea_core::pricing::{Price, PriceTable};
use recovea_core::snapshot::{Prices, ProviderCredential, SnapshotBuilder};
use recovea_store::State;

/// What a sealed provider key is bound to: its owner and name, so it opens only in its own row.
pub(crate) fn seal_context(org_id: &str, name: &str) -> Vec<u8> {
    format!("provider-key/{org_id}/{name}").into_bytes()
}

/// Builds the serving snapshot. A provider key that does not open under this master key is left out
/// (and logged): requests on that route then answer `provider_not_configured` rather than leak.
pub fn build_snapshot(state: &State, master_key: &MasterKey) -> Snapshot {
    let mut builder = SnapshotBuilder::new(state.version);
    for org in &state.orgs {
        builder.org(org.id.clone());
    }
    for provider in &state.providers {
        let context = seal_context(provider.org_id.as_str(), &provider.name);
        match master_key.open(&context, &provider.sealed_key).map(String::from_utf8) {
            Ok(Ok(api_key)) => {
                builder.provider(
                    &provider.org_id,
                    ProviderCredential {
                        name: provider.name.clone(),
                        kind: provider.kind,
                        base_url: provider.base_url.clone(),
                        api_key,
                    },
                );
            }
            Ok(Err(_)) | Err(_) => tracing::error!(
                org_id = %provider.org_id,
                provider = %provider.name,
                "a provider key does not open under this master key; the credential is not served"
            ),
        }
    }
    for (key, hash) in &state.active_keys {
        builder.key_with_limits(*hash, key.id.clone(), key.org_id.clone(), key.expires_at, key.limits);
    }
    for cap in &state.caps {
        builder.cap(cap.cap.clone());
    }
    builder.prices(prices(state));
    builder.build()
}

/// The built-in table with the operators' prices on top. An override that no longer parses (it
/// was validated when set) is left out and logged rather than stop every other price.
fn prices(state: &State) -> Prices {
    let overrides = state.price_overrides.iter().filter_map(|(model, wire)| match Price::try_from(wire) {
        Ok(price) => Some((model.clone(), price)),
        Err(e) => {
            tracing::error!(model = %model, error = %e, "a stored price override does not parse; ignored");
            None
        }
    });
    let table = PriceTable::builtin().overlay(&PriceTable::from_entries(overrides));
    Prices { revision: state.price_revision, table: Arc::new(table) }
}
